"""Faults of the database connections: the lock-holding connection and the LISTEN connection
terminated by the server, and a pool much smaller than the worker slots."""

from __future__ import annotations

import asyncio

import asyncpg

from ..conftest import with_database
from ..integration_tests.helpers import wait_until
from .conftest import Scenario, rounds

#: Server pids of the dataloader connections with this application name in the test database.
BACKENDS = """
SELECT array_agg(pid) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1
"""


async def backends(scenario: Scenario, application_name: str) -> set[int]:
    return set(await scenario.conn.fetchval(BACKENDS, application_name) or ())


async def replaced(scenario: Scenario, application_name: str, old: set[int]) -> bool:
    """Whether as many connections as `old` are open again, none of them an old one."""
    now = await backends(scenario, application_name)
    return len(now) == len(old) and not now & old


async def terminate(scenario: Scenario, pids: set[int]) -> None:
    await scenario.conn.execute(
        "SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid", list(pids)
    )


async def running_jobs(scenario: Scenario) -> int:
    n: int = await scenario.conn.fetchval("SELECT count(*) FROM fault_runs WHERE ended_at IS NULL")
    return n


#: Every connection of a service but the lock holder's (whose loss stops the jobs it locked).
QUEUE_CONNECTIONS = """
SELECT array_agg(pid) FROM pg_stat_activity
WHERE datname = current_database()
  AND application_name IN ('dataloader', 'dataloader-worker', 'dataloader-listener')
"""


async def test_connections_terminated_again_and_again_lose_no_finished_job(
    scenario: Scenario,
) -> None:
    """Jobs with a single attempt while the services' connections are terminated every 0.4 s:
    outcome writes that fail are retried with the lease kept alive, so no job that ran ends
    `lost` or runs twice (40 jobs of 0.5 s, as an outage of 8 s)."""
    replicas = await scenario.start(2, concurrency=8)
    total = rounds(1)
    for _ in range(total):
        await scenario.enqueue(40, per_key=1, steps=5, step_sec=0.1, max_attempts=1)
        for _ in range(20):
            pids = set(await scenario.conn.fetchval(QUEUE_CONNECTIONS) or ())
            await terminate(scenario, pids)
            for replica in replicas:
                scenario.hit(replica)
            await asyncio.sleep(0.4)  # the fault's own rhythm, not a synchronisation
    report = await scenario.check(total, await scenario.settle())
    assert report.runs == report.jobs  # every job ran once: none reaped, none run again


async def test_lock_connections_terminated_mid_job(scenario: Scenario) -> None:
    replicas = await scenario.start(2, concurrency=4)
    total = rounds(3)
    for _ in range(total):
        # A single attempt: a job cut off from its lock is handed back with a refund.
        await scenario.enqueue(40, steps=5, step_sec=0.05, max_attempts=1)
        await wait_until(lambda: running_jobs(scenario), what="jobs to run")
        before = await backends(scenario, "dataloader-locks")
        assert len(before) == 2
        await terminate(scenario, before)
        for replica in replicas:
            scenario.hit(replica)
        await wait_until(
            lambda old=before: replaced(scenario, "dataloader-locks", old),
            what="both lock connections to be reopened",
        )
    report = await scenario.check(total, await scenario.settle())
    lost = await scenario.conn.fetchval(
        "SELECT count(*) FROM dl_job_events WHERE kind = 'requeue'"
        " AND payload->>'reason' LIKE '%lock%'"
    )
    assert lost >= 1, "no job noticed that its lock was gone"
    assert report.runs > report.jobs


async def test_listen_connection_terminated_while_jobs_are_enqueued(scenario: Scenario) -> None:
    # no safety poll within the test: only a working LISTEN can wake the workers
    (replica,) = await scenario.start(1, concurrency=4, DL_POLL_INTERVAL_SEC="3600")
    total = rounds(3)
    for _ in range(total):
        await wait_until(lambda: listening(scenario), what="the listener to connect")
        before = await backends(scenario, "dataloader-listener")
        # the listener cannot come back until the jobs below are in, and they send no NOTIFY
        # (which a listener would hear): only the poll after its reconnect can find them
        await allow_connections(scenario, False)
        try:
            await terminate(scenario, before)
            scenario.hit(replica)
            await scenario.conn.execute("SET session_replication_role = replica")
            await scenario.enqueue(10, per_key=1, steps=1)
            await scenario.conn.execute("RESET session_replication_role")
        finally:
            await allow_connections(scenario, True)
        await wait_until(
            lambda old=before: replaced(scenario, "dataloader-listener", old),
            what="the listener to reconnect",
        )
        await scenario.settle(timeout=30)  # jobs of the outage ran: the reconnect polled
        await scenario.enqueue(10, per_key=1, steps=1)  # after: woken by NOTIFY again
        await scenario.settle(timeout=30)
    await scenario.check(total, 0.0)


async def allow_connections(scenario: Scenario, allowed: bool) -> None:
    """Let new connections into the test database, or not (open ones stay)."""
    database = await scenario.conn.fetchval("SELECT current_database()")
    admin = await asyncpg.connect(with_database(scenario.dsn, "postgres"))
    try:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS {allowed}')
    finally:
        await admin.close()


async def listening(scenario: Scenario) -> bool:
    return len(await backends(scenario, "dataloader-listener")) == 1


async def test_more_slots_than_connections_still_heartbeats(scenario: Scenario) -> None:
    # 24 slots writing progress and heartbeats through a pool of 2
    await scenario.start(1, concurrency=24, DL_DB_POOL_SIZE="2")
    # leases of 6 s: a heartbeat must get through the pool within 5.4 s (self-fencing)
    await scenario.enqueue(72, steps=20, step_sec=0.1, lease_ttl_sec=6)
    report = await scenario.check(1, await scenario.settle(timeout=120))
    reaped = await scenario.conn.fetchval(
        "SELECT count(*) FROM dl_job_events WHERE kind IN ('requeue', 'lost')"
    )
    assert reaped == 0, "a lease expired: heartbeats did not get through the pool"
    assert report.runs == report.jobs
