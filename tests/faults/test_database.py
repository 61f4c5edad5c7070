"""Faults of the database around the service: a long-open transaction elsewhere, PostgreSQL
restarting (fast and immediate) under load."""

from __future__ import annotations

import asyncio

import asyncpg

from dataloader import Client, DatabaseUnavailable
from dataloader.api.v1.exceptions import RETRY_AFTER_SEC
from dataloader.storage.migrate import migrate

from ..integration_tests.helpers import wait_until
from ..integration_tests.procs import Launcher
from .conftest import Scenario, rounds
from .server import PrivateServer


async def test_a_long_open_transaction_elsewhere_is_survived_and_reported(
    scenario: Scenario, db_dsn: str
) -> None:
    (replica,) = await scenario.start(1, concurrency=4, DL_LONG_TRANSACTION_SEC="0.5")
    blocker = await asyncpg.connect(db_dsn, server_settings={"application_name": "nightly-report"})
    try:
        # a snapshot held open: vacuum may not remove any row that dies after it
        await blocker.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await blocker.fetchval("SELECT count(*) FROM dl_jobs")
        blocker_pid = blocker.get_server_pid()
        scenario.fault_now()

        await scenario.enqueue(200, steps=1, lease_ttl_sec=10)  # no reaps on a slow machine
        report = await scenario.check(1, await scenario.settle())  # the queue kept working
        assert report.runs == report.jobs

        body = (await replica.client.get("/status")).json()
        assert body["status"] == "ok"
        assert body["oldest_transaction"]["pid"] == blocker_pid
        assert body["oldest_transaction"]["application_name"] == "nightly-report"
        (warning,) = body["warnings"]
        assert f"pid {blocker_pid}" in warning
        assert "vacuum cannot remove" in warning
        assert "'nightly-report'" in warning
        assert body["queue_table"]["dead_tuples"] >= 0
    finally:
        await blocker.close()
    body = (await replica.client.get("/status")).json()
    assert body["warnings"] == []


async def listeners(scenario: Scenario) -> int:
    n: int = await scenario.conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = 'dataloader-listener'"
    )
    return n


async def test_postgres_restarts_fast_and_immediate_under_load(
    private_server: PrivateServer, launcher: Launcher
) -> None:
    conn = await asyncpg.connect(private_server.dsn)
    scenario = Scenario("postgres_restart", launcher, private_server.dsn, conn)
    try:
        # no safety poll: jobs enqueued after a restart run only if LISTEN works again
        replicas = await scenario.start(2, concurrency=4, DL_POLL_INTERVAL_SEC="3600")
        modes = ["fast", "immediate"] * rounds(1)
        for mode in modes:
            await scenario.enqueue(40, steps=4, step_sec=0.05)
            await wait_until(lambda: running_runs(scenario), what="jobs to run")
            await private_server.restart(mode)
            for replica in replicas:
                scenario.hit(replica)
            await scenario.reconnect()
            await wait_until(
                lambda: has_listeners(scenario, len(replicas)), 30, "both listeners to return"
            )
            await scenario.settle(timeout=90)  # no run left whose end would wake the queue
            await scenario.enqueue(20, per_key=1, steps=1)  # woken by NOTIFY only
        report = await scenario.check(len(modes), await scenario.settle(timeout=90))
        assert report.runs > report.jobs  # the restarts did interrupt runs
        assert all(replica.proc.poll() is None for replica in replicas)
    finally:
        await scenario.conn.close()


async def test_the_api_answers_503_with_retry_after_while_postgres_is_down(
    private_server: PrivateServer, launcher: Launcher
) -> None:
    """No database, no answer to give: a trigger, a read and `/status` get a 503 that says when
    to try again (`Retry-After`), never a 500; the same calls succeed once it is back."""
    conn = await asyncpg.connect(private_server.dsn)
    scenario = Scenario("postgres_down", launcher, private_server.dsn, conn)
    try:
        (replica,) = await scenario.start(1)
    finally:
        await conn.close()
    trigger = {"queue": "elsewhere", "task": "t", "lock_key": "k", "args": {}}
    await private_server.shut_down()
    try:
        for method, path, body in [
            ("POST", "/api/v1/jobs/trigger", trigger),
            ("GET", "/api/v1/jobs?queue=elsewhere", None),
            ("GET", "/status", None),
        ]:
            response = await replica.client.request(method, path, json=body)
            assert response.status_code == 503, (path, response.text)
            assert response.headers["retry-after"] == str(RETRY_AFTER_SEC), path
    finally:
        await private_server.start_again()

    async def triggered() -> bool:
        response = await replica.client.post("/api/v1/jobs/trigger", json=trigger)
        assert response.status_code in (200, 503), response.text
        return response.status_code == 200

    await wait_until(triggered, 30, "a trigger to succeed once PostgreSQL is back")
    assert (await replica.client.get("/status")).status_code == 200


async def running_runs(scenario: Scenario) -> bool:
    return bool(
        await scenario.conn.fetchval("SELECT count(*) FROM fault_runs WHERE ended_at IS NULL")
    )


async def has_listeners(scenario: Scenario, count: int) -> bool:
    return await listeners(scenario) == count


async def test_a_producer_sees_a_restart_as_database_unavailable_then_carries_on(
    private_server: PrivateServer,
) -> None:
    """While PostgreSQL restarts (fast: sessions ended; immediate: a crash), a producer's
    calls raise DatabaseUnavailable and nothing else, and work again after it: retrying on
    that one error is enough to enqueue every batch exactly once (idempotency keys)."""
    conn = await asyncpg.connect(private_server.dsn)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    outages: list[str] = []
    async with Client.connect(private_server.dsn) as client:

        async def produce(batch: int) -> None:
            jobs = [
                client.job("t.any", {}, queue="q", lock_key=f"k{i}", idempotency_key=f"{batch}-{i}")
                for i in range(50)
            ]
            while True:
                try:
                    await client.enqueue_many(jobs)
                    await client.stats("q")
                    return
                except DatabaseUnavailable as exc:  # an outage: try again
                    outages.append(str(exc))
                    await asyncio.sleep(0.05)  # a producer's back-off, not a synchronisation

        for mode in ("fast", "immediate"):
            producers = asyncio.gather(*(produce(batch) for batch in range(20)))
            await private_server.restart(mode)
            await asyncio.wait_for(producers, 60)
            await asyncio.wait_for(asyncio.gather(*(produce(b) for b in range(20, 40))), 60)
        assert outages, "no call met the restarts"
        assert all(message.startswith("database unavailable: ") for message in outages)
        assert (await client.stats("q"))["q"].ready == 40 * 50
