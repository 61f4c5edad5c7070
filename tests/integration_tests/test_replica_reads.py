"""Reads that may be a little stale come from a streaming standby (`DL_DB_READ_DSN`): job and
process lists, queue statistics, /status's counts, the dashboard's lists and charts; a job's
own state never does. A standby stopped or too far behind hands those reads to the primary,
and no read fails for it. Proven on a real standby (`tests.engines.standby`) whose replay is
paused: what the primary has and the standby does not show tells where each read came from.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from typing import Any

import asyncpg
import httpx
import pytest

from dataloader import Client
from dataloader.api import create_app
from dataloader.config import Settings
from dataloader.context import run_migrations
from dataloader.core.staleness import Freshness, observing_reads
from dataloader.storage import replica
from dataloader.storage.connections import GuardedPool

from ..engines.standby import StandbyPair, standby_pair  # noqa: F401 - the fixture
from .helpers import wait_until

#: The header of answers whose lists and counts may be stale.
READ_FROM = "X-Dataloader-Read-From"
#: A queue no process serves: its jobs stay queued where the test put them.
QUEUE = "replica-reads"
TEMPLATE = "dl_replica_template"


@pytest.fixture(scope="module")
def migrated_template(standby_pair: StandbyPair) -> str:  # noqa: F811 - the fixture
    """A database with dataloader's schema on the primary, to copy for each test."""
    standby_pair.primary_sql(f"CREATE DATABASE {TEMPLATE}")
    asyncio.run(run_migrations(standby_pair.primary_dsn(TEMPLATE)))
    return TEMPLATE


@pytest.fixture
def database(standby_pair: StandbyPair, migrated_template: str) -> Iterator[str]:  # noqa: F811
    """A database of the test's own, on the primary and (once replayed) on the standby."""
    name = f"dl_{uuid.uuid4().hex[:12]}"
    standby_pair.resume_replay()  # whatever the test before left
    standby_pair.primary_sql(f"CREATE DATABASE {name} TEMPLATE {migrated_template}")
    standby_pair.wait_caught_up()
    yield name
    standby_pair.resume_replay()


Start = Callable[..., Awaitable[httpx.AsyncClient]]


@pytest.fixture
async def start(standby_pair: StandbyPair, database: str) -> AsyncIterator[Start]:  # noqa: F811
    """Start API-only services on the test's database, the standby named as DL_DB_READ_DSN
    (its password, which trust authentication ignores, must never be logged)."""
    async with AsyncExitStack() as stack:

        async def run(**overrides: Any) -> httpx.AsyncClient:
            settings = Settings(  # type: ignore[call-arg]
                _env_file=None,
                db_dsn=standby_pair.primary_dsn(database),
                db_read_dsn=standby_pair.standby_dsn(database).replace(
                    "postgres@", "postgres:readerpw@"
                ),
                workers=[],
                auto_migrate=False,
                allow_unknown_tasks=True,
                db_pool_size=4,
                **overrides,
            )
            app = create_app(settings, run_workers=False)
            await stack.enter_async_context(app.router.lifespan_context(app))
            http = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://dataloader.test"
            )
            stack.push_async_callback(http.aclose)
            return http

        yield run


async def trigger(http: httpx.AsyncClient, key: str) -> str:
    answer = await http.post(
        "/api/v1/jobs/trigger",
        json={
            "queue": QUEUE,
            "task": "replica.check",
            "args": {},
            "lock_key": key,
            "idempotency_key": key,
        },
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["job_id"])


async def listed(http: httpx.AsyncClient) -> tuple[list[str], str]:
    """The ids of the queue's jobs as the list answers them, and where it says it read."""
    answer = await http.get("/api/v1/jobs", params={"queue": QUEUE})
    assert answer.status_code == 200, answer.text
    return [job["job_id"] for job in answer.json()["jobs"]], answer.headers.get(READ_FROM, "")


async def queued_in_stats(http: httpx.AsyncClient) -> tuple[int, str]:
    answer = await http.get(f"/api/v1/queues/{QUEUE}")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    return body["ready"] + body["waiting"] + body["delayed"], answer.headers.get(READ_FROM, "")


async def queued_in_status(http: httpx.AsyncClient) -> tuple[int, str]:
    answer = await http.get("/status")
    assert answer.status_code == 200, answer.text
    queue = answer.json()["queues"].get(QUEUE, {"queued": 0})
    return queue["queued"], answer.headers.get(READ_FROM, "")


async def test_lists_stats_and_status_come_from_the_standby_a_jobs_own_state_from_the_primary(
    standby_pair: StandbyPair,  # noqa: F811
    start: Start,
) -> None:
    http = await start(db_read_max_lag_sec=600)
    first = await trigger(http, "first")
    standby_pair.wait_caught_up()
    assert (await listed(http))[0] == [first]

    standby_pair.pause_replay()
    second = await trigger(http, "second")

    # its own state: the primary's, at once after its trigger
    own = await http.get(f"/api/v1/jobs/{second}")
    assert own.status_code == 200
    assert own.json()["status"] == "queued"
    assert READ_FROM not in own.headers  # nothing stale in it
    # a second trigger with its key finds it (idempotency: the primary's)
    assert await trigger(http, "second") == second

    # lists and counts: the standby's, which has not replayed it
    jobs, read_from = await listed(http)
    assert jobs == [first]
    assert read_from.startswith("replica; lag=")
    queued, stats_from = await queued_in_stats(http)
    assert (queued, stats_from.split(";")[0]) == (1, "replica")
    queued, status_from = await queued_in_status(http)
    assert (queued, status_from.split(";")[0]) == (1, "replica")
    processes = await http.get("/api/v1/processes")
    assert processes.status_code == 200
    assert processes.headers[READ_FROM].startswith("replica; lag=")

    # the dashboard's list says so on the page too
    page = await http.get("/ui/jobs", params={"queue": QUEUE}, follow_redirects=True)
    assert page.status_code == 200
    assert first in page.text
    assert second not in page.text
    assert "read from a replica" in page.text
    assert page.headers[READ_FROM].startswith("replica; lag=")
    overview = await http.get("/ui", follow_redirects=True)
    assert "read from a replica" in overview.text

    standby_pair.resume_replay()
    await wait_until(
        lambda: _shows(listed(http), {first, second}), what="the list to show the replayed job"
    )
    assert (await queued_in_stats(http))[0] == 2
    assert (await queued_in_status(http))[0] == 2


async def _shows(reading: Awaitable[tuple[list[str], str]], wanted: set[str]) -> bool:
    return set((await reading)[0]) == wanted


async def test_a_stopped_standby_hands_the_reads_to_the_primary_and_back(
    standby_pair: StandbyPair,  # noqa: F811
    start: Start,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(replica, "RETRY_AFTER_SEC", 0.3)
    http = await start(db_read_max_lag_sec=600)
    first = await trigger(http, "first")
    standby_pair.wait_caught_up()
    assert (await listed(http))[1].startswith("replica")

    standby_pair.stop_standby()
    try:
        second = await trigger(http, "second")
        with caplog.at_level(logging.WARNING, logger="dataloader.storage.replica"):
            for _ in range(3):  # no read fails; the primary answers, all of it
                jobs, read_from = await listed(http)
                assert set(jobs) == {first, second}
                assert read_from == "primary; fallback=unavailable"
            queued, status_from = await queued_in_status(http)
            assert (queued, status_from) == (2, "primary; fallback=unavailable")
            page = await http.get("/ui/jobs", params={"queue": QUEUE}, follow_redirects=True)
            assert second in page.text
            assert "read from the primary (the replica cannot be reached)" in page.text
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings  # logged once, however many reads fell back
        assert "readerpw" not in warnings[0]
        assert "postgres:***@" in warnings[0]
    finally:
        await asyncio.to_thread(standby_pair.start_standby)

    standby_pair.wait_caught_up()
    await wait_until(
        lambda: _read_from_replica(listed(http)), what="the reads to return to the standby"
    )
    assert set((await listed(http))[0]) == {first, second}


async def _read_from_replica(reading: Awaitable[tuple[list[str], str]]) -> bool:
    return (await reading)[1].startswith("replica")


async def test_a_standby_behind_by_more_than_the_limit_hands_the_reads_to_the_primary(
    standby_pair: StandbyPair,  # noqa: F811
    start: Start,
) -> None:
    http = await start(db_read_max_lag_sec=0.5)
    first = await trigger(http, "first")
    standby_pair.wait_caught_up()
    assert (await listed(http))[1].startswith("replica")

    standby_pair.pause_replay()
    second = await trigger(http, "second")
    # within the limit the standby's (stale) list is served; beyond it, the primary's
    await wait_until(
        lambda: _read_from(listed(http), "primary; fallback=lagging"),
        what="the reads to go to the primary",
    )
    assert set((await listed(http))[0]) == {first, second}
    queued, status_from = await queued_in_status(http)
    assert (queued, status_from) == (2, "primary; fallback=lagging")

    standby_pair.resume_replay()
    await wait_until(
        lambda: _read_from_replica(listed(http)), what="the reads to return to the standby"
    )


async def _read_from(reading: Awaitable[tuple[list[str], str]], source: str) -> bool:
    return (await reading)[1] == source


async def test_an_idle_primary_is_no_lag(
    standby_pair: StandbyPair,  # noqa: F811
    database: str,
) -> None:
    """Nothing committed for longer than the limit: the replay timestamp ages, the standby
    is no less caught up, and its reads go on."""
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        db_dsn=standby_pair.primary_dsn(database),
        db_read_dsn=standby_pair.standby_dsn(database),
        db_read_max_lag_sec=0.5,
    )
    async with Client.connect(standby_pair.primary_dsn(database), settings=settings) as client:
        job = await client.enqueue("replica.check", {}, queue=QUEUE)
        standby_pair.wait_caught_up()

        async def replay_aged() -> bool:
            age = standby_pair.standby_sql(
                "SELECT extract(epoch FROM now() - pg_last_xact_replay_timestamp())"
            )
            return float(age) > 1.5

        await wait_until(replay_aged, what="the last replayed commit to age past the limit")
        with observing_reads() as seen:
            page = await client.list(queue=QUEUE)
        assert [j.job_id for j in page.jobs] == [job.job_id]
        assert seen.freshness is not None
        assert seen.freshness.source == "replica"
        assert (seen.freshness.lag_sec or 0.0) < 0.5


async def test_exact_reads_are_the_primarys(
    standby_pair: StandbyPair,  # noqa: F811
    database: str,
) -> None:
    """`Client.exact()`: reads a decision depends on (is this queue known before it is
    paused?) see what the primary has, while the same client's lists are the standby's."""
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        db_dsn=standby_pair.primary_dsn(database),
        db_read_dsn=standby_pair.standby_dsn(database),
        db_read_max_lag_sec=600,
    )
    async with Client.connect(standby_pair.primary_dsn(database), settings=settings) as client:
        standby_pair.pause_replay()
        job = await client.enqueue("replica.check", {}, queue=QUEUE)
        assert (await client.stats(QUEUE))[QUEUE].total == 0
        assert (await client.list(queue=QUEUE)).jobs == []
        exact = client.exact()
        assert (await exact.stats(QUEUE))[QUEUE].total == 1
        assert [j.job_id for j in (await exact.list(queue=QUEUE)).jobs] == [job.job_id]
        assert await exact.processes.counts() == await client.processes.counts()
        acting = exact.acting_as("someone")
        assert (await acting.stats(QUEUE))[QUEUE].total == 1
        assert (await client.acting_as("someone").stats(QUEUE))[QUEUE].total == 0
        await exact.close()  # a view: closes nothing of its client's
        assert (await client.get(job.job_id)) is not None


async def test_a_read_dsn_naming_the_primary_is_served_without_a_word(
    standby_pair: StandbyPair,  # noqa: F811
    database: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing to replay: never behind, nothing to warn of."""
    primary = standby_pair.primary_dsn(database)
    settings = Settings(_env_file=None, db_dsn=primary, db_read_dsn=primary)  # type: ignore[call-arg]
    with caplog.at_level(logging.INFO, logger="dataloader.storage.replica"):
        async with Client.connect(primary, settings=settings) as client:
            job = await client.enqueue("replica.check", {}, queue=QUEUE)
            with observing_reads() as seen:
                assert [j.job_id for j in (await client.list(queue=QUEUE)).jobs] == [job.job_id]
            assert seen.freshness == Freshness("replica", 0.0)
    assert caplog.records == []


async def test_a_read_the_standby_fails_is_served_by_the_primary_that_once(
    standby_pair: StandbyPair,  # noqa: F811
    database: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A read the standby refuses with an error of its own (here: asking a server in recovery
    for its WAL position, which only a primary answers) is read again on the primary, said as
    `primary; fallback=error`, warned of once; the next read goes to the standby again."""
    pool = await asyncpg.create_pool(standby_pair.primary_dsn(database), min_size=1, max_size=2)
    reads = replica.Replica(
        standby_pair.standby_dsn(database), GuardedPool(pool), max_lag_sec=60, timeout=10
    )

    async def position(connections: Any) -> str:
        async with connections.connection() as conn:
            return str(await conn.fetchval("SELECT pg_current_wal_lsn()::text"))

    async def in_recovery(connections: Any) -> bool:
        async with connections.connection() as conn:
            return bool(await conn.fetchval("SELECT pg_is_in_recovery()"))

    try:
        with caplog.at_level(logging.WARNING, logger="dataloader.storage.replica"):
            for _ in range(2):
                with observing_reads() as seen:
                    assert await reads.read(position)  # answered by the primary
                assert seen.freshness == Freshness("primary", fallback="error")
            with observing_reads() as seen:
                assert await reads.read(in_recovery) is True  # the standby serves again
            assert seen.freshness is not None
            assert seen.freshness.source == "replica"
    finally:
        await reads.close()
        await pool.close()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings  # once, not at every failed read
    assert "failed a read (recovery is in progress" in warnings[0]
