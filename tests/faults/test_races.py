"""Races: the reapers of several replicas over thousands of expired leases, and cancels racing
completions."""

from __future__ import annotations

import asyncio
import datetime as dt
import random

import asyncpg
import httpx

from .conftest import QUEUE, Scenario
from .pipeline import TASK

#: A process that no longer exists: the worker id its orphaned jobs were picked by.
GHOST_PID = 999_999
GHOST_WORKER = f"ghost-{GHOST_PID}-dead"

#: Jobs left `running` by a worker that died, picks journaled as by it: half of the leases
#: expired already, the other half expiring one after another over the next $5 seconds (so
#: that every replica's reaper wakes while some are due: one reaper cannot sweep them all).
ORPHANS = """
WITH orphans AS (
    INSERT INTO dl_jobs (job_id, queue, task, lock_key, args, status, attempt, max_attempts,
                         lease_ttl_sec, lease_expires_at, started_at, heartbeat_at)
    SELECT gen_random_uuid(), $1, $2, 'orphan-' || i, '{"steps": 0}', 'running', 1, 50, 10,
           CASE WHEN i % 2 = 0 THEN now() - interval '1 minute'
                ELSE now() + make_interval(secs => $5::float8 * i / $3) END,
           now() - interval '2 minutes', now() - interval '2 minutes'
    FROM generate_series(1, $3::int) AS i
    RETURNING job_id, queue
)
INSERT INTO dl_job_events (job_id, queue, kind, payload)
SELECT job_id, queue, 'picked', jsonb_build_object('attempt', 1, 'worker', $4::text)
FROM orphans
"""


async def test_the_leader_of_three_replicas_requeues_each_expired_job_once(
    scenario: Scenario,
) -> None:
    """Only the replica that leads maintenance reaps (reapers racing each other, as a leader
    frozen past its lease would, are fenced: test_worker_protocol runs three at once)."""
    # a lease long enough that no renewal late under this load hands the lead over: the test
    # is about who reaps while one leads
    replicas = await scenario.start(3, concurrency=8, DL_LEADER_LEASE_SEC="30")
    orphans = 2000
    await scenario.conn.execute(ORPHANS, QUEUE, TASK, orphans, GHOST_WORKER, 3.0)
    scenario.jobs_added += orphans
    scenario.faults.append((GHOST_PID, dt.datetime.now(dt.UTC)))  # it "died" just now
    report = await scenario.check(1, await scenario.settle(timeout=120))
    requeues = await scenario.conn.fetch(
        "SELECT job_id, count(*) AS n, array_agg(payload->>'reaper') AS reapers"
        " FROM dl_job_events WHERE kind = 'requeue' GROUP BY job_id"
    )
    assert len(requeues) == orphans
    assert all(r["n"] == 1 for r in requeues), [r for r in requeues if r["n"] != 1][:3]
    reapers = {reaper for r in requeues for reaper in r["reapers"]}
    assert len(reapers) == 1, f"more than the leader swept: {reapers}"
    assert all(any(f"-{p.pid}-" in reaper for p in replicas) for reaper in reapers)
    assert report.runs == orphans  # each requeued job ran once more, and only once


async def cancel_all(clients: list[httpx.AsyncClient], job_ids: list[str], seed: int) -> None:
    """Cancel every job through the API of a random replica, in random order."""
    shuffle = random.Random(seed)
    order = list(job_ids)
    shuffle.shuffle(order)
    for job_id in order:
        response = await shuffle.choice(clients).post(f"/api/v1/jobs/{job_id}/cancel")
        assert response.status_code == 200, response.text


async def test_cancels_racing_completions(scenario: Scenario, conn: asyncpg.Connection) -> None:
    replicas = await scenario.start(2, concurrency=8)
    # leases of 10 s: a job is never reaped here, only canceled or completed
    await scenario.enqueue(300, per_key=1, steps=1, step_sec=0.005, lease_ttl_sec=10)
    job_ids = [str(r["job_id"]) for r in await conn.fetch("SELECT job_id FROM dl_jobs")]
    clients = [replica.client for replica in replicas]
    # two cancellers over the same jobs while the replicas run them
    await asyncio.gather(cancel_all(clients, job_ids, 1), cancel_all(clients, job_ids, 2))
    await scenario.check(1, await scenario.settle(), final=frozenset({"succeeded", "canceled"}))
    outcomes = {
        r["status"]: r["n"]
        for r in await conn.fetch(
            "SELECT status::text AS status, count(*) AS n FROM dl_jobs GROUP BY 1"
        )
    }
    assert outcomes.get("succeeded", 0) > 0, outcomes  # the race had both outcomes
    assert outcomes.get("canceled", 0) > 0, outcomes
    canceled_with_effect = await conn.fetchval(
        "SELECT count(*) FROM dl_jobs j JOIN fault_effects e USING (job_id)"
        " WHERE j.status = 'canceled'"
    )
    assert canceled_with_effect == 0  # a canceled job never did its work
    terminal_changes = await conn.fetchval(
        "SELECT count(*) FROM (SELECT job_id FROM dl_job_events"
        " WHERE kind IN ('done', 'canceled') GROUP BY job_id HAVING count(*) > 1) twice"
    )
    assert terminal_changes == 0  # nothing finished twice, nothing left its final state
