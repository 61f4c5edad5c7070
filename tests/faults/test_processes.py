"""Faults of the service processes: kill -9 under load, the recovery time of a killed replica's
jobs, a replica frozen past its leases, SIGTERM with long jobs, and a second SIGTERM."""

from __future__ import annotations

import asyncio
import random
import signal
import time

from ..integration_tests.helpers import wait_until
from ..integration_tests.procs import ServiceProcess
from .conftest import DEFAULT_TIMINGS, Scenario, rounds

#: A killed replica's jobs run again elsewhere within this, at the default settings (measured:
#: docs/faults.md); their leases alone would keep them a minute.
RECOVERY_BOUND_SEC = 20.0


async def runs_open_on(scenario: Scenario, replica: ServiceProcess) -> int:
    """Pipelines of `replica` that started and have not ended."""
    n: int = await scenario.conn.fetchval(
        "SELECT count(*) FROM fault_runs WHERE pid = $1 AND ended_at IS NULL", replica.pid
    )
    return n


async def test_kill_9_at_random_moments_under_load(scenario: Scenario) -> None:
    replicas = await scenario.start(3, concurrency=4)
    shuffle = random.Random(20261121)
    total = rounds(3)
    for round_no in range(total):
        await scenario.enqueue(60, steps=3, step_sec=0.02)
        victim = replicas[round_no % len(replicas)]
        await wait_until(lambda v=victim: runs_open_on(scenario, v), what="the victim to run a job")
        # a random moment within the victim's busy period: mid-step, mid-effect, mid-flush
        await asyncio.sleep(shuffle.uniform(0, 0.05))  # the fault's timing, not a wait
        await scenario.kill(victim)
        replicas[round_no % len(replicas)] = (await scenario.start(1, concurrency=4))[0]
    report = await scenario.check(total, await scenario.settle())
    assert report.runs > report.jobs  # the kills did interrupt runs that were redone


async def test_a_killed_replicas_jobs_run_again_elsewhere_within_seconds(
    scenario: Scenario,
) -> None:
    """At the default settings (leases of a minute): the survivor leads, the victim runs four
    long jobs and is killed; the survivor runs them again once the victim's presence lapsed."""
    [survivor] = await scenario.start(1, concurrency=4, **DEFAULT_TIMINGS)
    await wait_until(lambda: scenario.leads(survivor), what="the survivor to lead")
    [victim] = await scenario.start(1, concurrency=4, **DEFAULT_TIMINGS)
    jobs = await scenario.claim_all_on(
        victim, [survivor], 4, per_key=1, steps=40, step_sec=0.25, lease_ttl_sec=60
    )
    await scenario.kill(victim)
    again = await scenario.restarted_elsewhere(jobs, survivor)
    killed = scenario.killed_at[victim.pid]
    recovery = (again - killed).total_seconds()
    taken_back = await scenario.conn.fetchval(
        "SELECT max(ts) FROM dl_job_events WHERE kind = 'requeue' AND job_id = ANY($1::uuid[])",
        jobs,
    )
    print(
        f"a killed replica's jobs were taken back {(taken_back - killed).total_seconds():.2f}s"
        f" and ran again elsewhere {recovery:.2f}s after the kill"
    )
    assert 0 < recovery < RECOVERY_BOUND_SEC
    await scenario.check(1, await scenario.settle())


async def test_a_replica_frozen_past_its_leases_stops_its_pipelines_on_waking(
    scenario: Scenario,
) -> None:
    frozen, _ = await scenario.start(2, concurrency=3)
    await scenario.enqueue(6, per_key=1, steps=40, step_sec=0.05)
    await wait_until(lambda: runs_open_on(scenario, frozen), what="the replica to run jobs")
    frozen.send(signal.SIGSTOP)
    scenario.hit(frozen)
    open_runs = await scenario.conn.fetch(
        "SELECT job_id, attempt FROM fault_runs WHERE pid = $1 AND ended_at IS NULL", frozen.pid
    )

    async def requeued_by_a_reaper() -> bool:
        n = await scenario.conn.fetchval(
            "SELECT count(DISTINCT job_id) FROM dl_job_events WHERE kind = 'requeue'"
            " AND job_id = ANY($1::uuid[])",
            [r["job_id"] for r in open_runs],
        )
        return bool(n == len(open_runs))

    await wait_until(requeued_by_a_reaper, what="the frozen replica's leases to be reaped")
    frozen.send(signal.SIGCONT)

    async def frozen_runs_ended() -> bool:
        return await runs_open_on(scenario, frozen) == 0

    await wait_until(frozen_runs_ended, what="the woken replica to stop its pipelines")
    outcomes = await scenario.conn.fetch(
        "SELECT outcome FROM fault_runs WHERE pid = $1 AND (job_id, attempt) IN"
        " (SELECT * FROM unnest($2::uuid[], $3::int[]))",
        frozen.pid,
        [r["job_id"] for r in open_runs],
        [r["attempt"] for r in open_runs],
    )
    assert {r["outcome"] for r in outcomes} <= {"cancelled", "JobLost"}, outcomes
    await scenario.check(1, await scenario.settle())
    assert frozen.proc.poll() is None  # woken, it serves on


async def test_sigterm_hands_long_jobs_back_and_another_replica_finishes_them(
    scenario: Scenario,
) -> None:
    leaving, _ = await scenario.start(2, concurrency=4, DL_SHUTDOWN_TIMEOUT_SEC="0.5")
    await scenario.enqueue(8, per_key=1, steps=30, step_sec=0.05)
    await wait_until(lambda: runs_open_on(scenario, leaving), what="the replica to run jobs")
    leaving.terminate()
    assert await leaving.wait() == 0
    handed_back = await scenario.conn.fetchval(
        "SELECT count(*) FROM dl_job_events WHERE kind = 'requeue'"
        " AND payload->>'reason' = 'worker shutting down'"
    )
    assert handed_back >= 1
    await scenario.check(1, await scenario.settle())


async def test_a_second_sigterm_stops_at_once(scenario: Scenario) -> None:
    (leaving,) = await scenario.start(1, concurrency=4, DL_SHUTDOWN_TIMEOUT_SEC="60")
    await scenario.enqueue(4, per_key=1, steps=600, step_sec=0.05)
    await wait_until(lambda: runs_open_on(scenario, leaving), what="the replica to run jobs")
    leaving.terminate()
    await wait_until(
        lambda: _logged(leaving, "waiting up to 60s"), what="the graceful stop to begin"
    )
    started = time.monotonic()
    leaving.terminate()
    assert await leaving.wait(within=15) == 0
    assert time.monotonic() - started < 15  # not the 60 s grace period
    assert "second stop signal" in leaving.logs()
    assert await runs_open_on(scenario, leaving) == 0  # its pipelines were stopped...
    # the jobs only need to finish now: shorten the work left, then let a new replica run it
    await scenario.conn.execute("UPDATE dl_jobs SET args = '{\"steps\": 1}'")
    await scenario.start(1, concurrency=4)
    await scenario.check(1, await scenario.settle())  # ...and their jobs given back intact


async def _logged(replica: ServiceProcess, text: str) -> bool:
    return text in replica.logs()
