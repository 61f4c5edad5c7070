"""Faults of the network: connections that go half-open (a proxy stops forwarding), and a
replica cut off from the database altogether."""

from __future__ import annotations

import asyncpg

from ..integration_tests.helpers import wait_until
from ..integration_tests.procs import Launcher, ServiceProcess
from .conftest import DEFAULT_TIMINGS, Scenario, rounds
from .proxy import FreezingProxy
from .server import DATABASE, PrivateServer

SESSIONS = "SELECT count(*) FROM pg_stat_activity WHERE datname = $1"
SESSIONS_BY_NAME = """
SELECT application_name, state, count(*) FROM pg_stat_activity WHERE datname = $1 GROUP BY 1, 2
"""
#: Per replica: a pool of 4, the listener, the lock holder, the pipeline's ledger pool of 4, and
#: up to 4 frozen pool connections still idle in the pool (found and ended when next used); the
#: test's own connection. Without ending abandoned sessions, each round adds ~6 per replica.
SESSION_BUDGET = 2 * (4 + 1 + 1 + 4 + 4) + 1


async def running_runs(scenario: Scenario) -> bool:
    return bool(
        await scenario.conn.fetchval("SELECT count(*) FROM fault_runs WHERE ended_at IS NULL")
    )


async def test_half_open_connections_are_detected_and_replaced(
    private_server: PrivateServer, launcher: Launcher
) -> None:
    proxy = FreezingProxy(private_server.socket_path)
    await proxy.start()
    conn = await asyncpg.connect(private_server.dsn)  # the test's own: not through the proxy
    scenario = Scenario("half_open", launcher, proxy.dsn(DATABASE), conn)
    try:
        replicas = await scenario.start(
            2,
            concurrency=4,
            FAULT_LEDGER_DSN=private_server.dsn,
            DL_POLL_INTERVAL_SEC="1",
            DL_DB_TIMEOUT_SEC="2",
        )
        total = rounds(2)
        for _ in range(total):
            await scenario.enqueue(40, steps=4, step_sec=0.05)
            await wait_until(lambda: running_runs(scenario), what="jobs to run")
            assert proxy.freeze() >= 2 * 3  # pool, listener and lock connection of each
            for replica in replicas:
                scenario.hit(replica)
            await scenario.settle(timeout=60)
        report = await scenario.check(total, await scenario.settle())
        assert report.runs > report.jobs  # the frozen connections did cut runs short
        # the silent sessions were ended, not left holding locks and connection slots until
        # the server's keepalive noticed (the proxy keeps its side open: it never would)
        # (each says so once its replacement connects: the jobs may settle before the last
        # silent session is noticed, a ping and its timeout after the freeze)
        for replica in replicas:
            for kind in ("lock", "pool", "listener"):

                async def ended(replica: ServiceProcess = replica, kind: str = kind) -> bool:
                    return f"ended the abandoned {kind} session" in replica.logs()

                await wait_until(ended, what=f"the abandoned {kind} session ended")

        async def sessions_bounded() -> bool:
            return bool(await conn.fetchval(SESSIONS, DATABASE) <= SESSION_BUDGET)

        try:
            await wait_until(sessions_bounded, what=f"at most {SESSION_BUDGET} server sessions")
        except AssertionError:
            held = [tuple(r) for r in await conn.fetch(SESSIONS_BY_NAME, DATABASE)]
            raise AssertionError(f"sessions left open: {held}") from None
    finally:
        await scenario.conn.close()
        await proxy.close()


async def test_a_replica_cut_off_from_the_database_stops_its_jobs_before_they_are_taken_back(
    private_server: PrivateServer, launcher: Launcher
) -> None:
    """At the default settings (leases of a minute): the cut-off replica's presence lapses; it
    stops its jobs on its own clock before the survivor's reaper may take them back, so no two
    runs of a job overlap (the checker). (They run again once the cut-off replica's lock
    session ends: its advisory locks live on the server until then, here until it reconnects.)"""
    proxy = FreezingProxy(private_server.socket_path)
    await proxy.start()
    conn = await asyncpg.connect(private_server.dsn)  # the test's own: not through the proxy
    scenario = Scenario("partition", launcher, private_server.dsn, conn)
    try:
        [survivor] = await scenario.start(1, concurrency=4, **DEFAULT_TIMINGS)
        await wait_until(lambda: scenario.leads(survivor), what="the survivor to lead")
        [cut_off] = await scenario.start(
            1,
            concurrency=4,
            **DEFAULT_TIMINGS,
            DL_DB_DSN=proxy.dsn(DATABASE),
            FAULT_LEDGER_DSN=private_server.dsn,  # its runs' ends are recorded all the same
        )
        jobs = await scenario.claim_all_on(
            cut_off, [survivor], 4, per_key=1, steps=40, step_sec=0.25, lease_ttl_sec=60
        )
        proxy.partition()
        scenario.hit(cut_off)

        async def taken_back() -> bool:
            n = await conn.fetchval(
                "SELECT count(DISTINCT job_id) FROM dl_job_events WHERE kind = 'requeue'"
                " AND payload ? 'reaper' AND job_id = ANY($1::uuid[])",
                jobs,
            )
            return bool(n == len(jobs))

        await wait_until(taken_back, 30, "the survivor's reaper to take the jobs back")
        # each run stopped on its own, cut off as it was, before the reaper took its job back
        # (this host's clock for both: the database runs on it)
        late = await conn.fetch(
            "SELECT r.job_id, r.ended_at, e.ts AS taken_back_at FROM fault_runs r"
            " JOIN dl_job_events e ON e.job_id = r.job_id AND e.kind = 'requeue'"
            "  AND e.payload ? 'reaper'"
            " WHERE r.pid = $1 AND (r.ended_at IS NULL OR r.ended_at >= e.ts)",
            cut_off.pid,
        )
        assert not late, late
        proxy.heal()
        await scenario.check(1, await scenario.settle(timeout=120))
    finally:
        await scenario.conn.close()
        await proxy.close()
