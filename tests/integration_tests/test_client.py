"""`dataloader.Client` without workers: construction over each source of connections, enqueue
(defaults, checks, idempotency, bulk), the caller's transaction, and the readers."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import sqlalchemy
from prometheus_client import REGISTRY
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from dataloader import (
    Client,
    DataloaderError,
    IdempotencyConflict,
    InvalidJob,
    InvalidJobArgs,
    JobContext,
    JobNotFound,
    JobStatus,
    NewJob,
    NotRetryable,
    Settings,
    TaskRegistry,
)
from dataloader.exceptions import DatabaseUnavailable

from ..conftest import with_database
from .clients import SOURCES, open_client, sqlalchemy_url
from .conftest import StartService, wait_until


class DayArgs(BaseModel):
    day: str
    rows: int = 0


async def handler(ctx: JobContext[Any]) -> None:
    """A task body for registrations: these tests run no workers."""


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(default_max_attempts=4, default_lease_ttl_sec=77)


@pytest.fixture
def tasks() -> TaskRegistry:
    registry = TaskRegistry()
    registry.task("t.day", queue="days", args=DayArgs, priority=7, max_attempts=9, lease_ttl=33)(
        handler
    )
    return registry


@pytest.fixture(params=SOURCES)
async def client(
    request: pytest.FixtureRequest, db_dsn: str, settings: Settings, tasks: TaskRegistry
) -> AsyncIterator[Client]:
    async with open_client(request.param, db_dsn, settings=settings, registry=tasks) as opened:
        yield opened


async def job_row(conn: asyncpg.Connection, job_id: uuid.UUID) -> asyncpg.Record:
    row = await conn.fetchrow(
        "SELECT *, args::text AS args_text FROM dl_jobs WHERE job_id = $1", job_id
    )
    assert row is not None
    return row


async def count_jobs(conn: asyncpg.Connection) -> tuple[int, int]:
    """(jobs, journal entries) in the database."""
    jobs = await conn.fetchval("SELECT count(*) FROM dl_jobs")
    events = await conn.fetchval("SELECT count(*) FROM dl_job_events")
    return jobs, events


# --- construction -------------------------------------------------------------------------


async def client_sessions(conn: asyncpg.Connection) -> int:
    count: int = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = 'dataloader-client'"
    )
    return count


@pytest.mark.parametrize("scheme", ["postgresql", "postgresql+asyncpg"])
async def test_connect_opens_a_pool_of_its_own_and_closes_it_on_exit(
    db_dsn: str, conn: asyncpg.Connection, scheme: str
) -> None:
    dsn = scheme + "://" + db_dsn.split("://", 1)[1]
    async with Client.connect(dsn) as client:
        job = await client.enqueue("t.any", {"n": 1}, queue="q", lock_key="k")
        state = await client.get(job.job_id)
        assert state is not None
        assert state.status == JobStatus.QUEUED
        assert await client_sessions(conn) >= 1

    async def gone() -> bool:
        return await client_sessions(conn) == 0

    await wait_until(gone, what="the client's sessions to end")


def unusable_dsns(db_dsn: str, empty_db_dsn: str) -> dict[str, tuple[str, type[Exception], str]]:
    """name → (DSN, error, words of its message)."""
    return {
        "no scheme": ("not a dsn", ValueError, "not a usable PostgreSQL DSN"),
        "another database's scheme": (
            "mysql://user:s3cret@localhost/db",
            ValueError,
            "not a usable PostgreSQL DSN",
        ),
        "nothing listening": (
            "postgresql://user:s3cret@127.0.0.1:1/db",
            DatabaseUnavailable,
            "cannot connect to postgresql://user:***@127.0.0.1:1/db",
        ),
        "no such database": (
            with_database(db_dsn, "no_such_database"),
            DatabaseUnavailable,
            'database "no_such_database" does not exist',
        ),
        "no schema": (
            empty_db_dsn,
            DataloaderError,
            "has no dataloader schema: run `dataloader migrate`",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "no scheme",
        "another database's scheme",
        "nothing listening",
        "no such database",
        "no schema",
    ],
)
async def test_connect_explains_an_unusable_dsn_in_one_line(
    db_dsn: str, empty_db_dsn: str, admin_dsn: str, case: str
) -> None:
    dsn, error, words = unusable_dsns(db_dsn, empty_db_dsn)[case]
    with pytest.raises(error) as info:
        async with Client.connect(dsn):
            raise AssertionError("connected")
    message = str(info.value)
    assert words in message
    assert "\n" not in message
    assert "s3cret" not in message
    # raised from the client, not from deep inside the driver
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__
    # nothing left open: a pool opened on a database without the schema is closed again
    admin = await asyncpg.connect(admin_dsn)
    try:
        left = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dataloader-client'"
            " AND datname = $1",
            empty_db_dsn.rsplit("/", 1)[1].split("?")[0],
        )
    finally:
        await admin.close()
    assert left == 0


async def test_client_refuses_what_is_not_one_asyncpg_pool_or_engine(db_dsn: str) -> None:
    pool = await asyncpg.create_pool(db_dsn, min_size=1, max_size=1)
    engine = create_async_engine(sqlalchemy_url(db_dsn))
    psycopg_engine = create_async_engine(
        "postgresql+psycopg://" + db_dsn.split("://", 1)[1].split("?")[0]
    )
    sync_engine = sqlalchemy.create_engine("sqlite://")
    conn = await asyncpg.connect(db_dsn)
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: Client(), "needs pool= .* or engine="),
        (lambda: Client(pool=pool, engine=engine), "not both"),
        (lambda: Client(pool=db_dsn), "pool must be an asyncpg pool .* not str"),  # type: ignore[arg-type]
        (lambda: Client(engine), "pass a SQLAlchemy AsyncEngine as engine="),  # type: ignore[arg-type]
        (lambda: Client(pool=conn), r"enqueue\(…, connection=…\)"),  # type: ignore[arg-type]
        (lambda: Client(engine=pool), "engine must be a SQLAlchemy AsyncEngine .* not Pool"),  # type: ignore[arg-type]
        (lambda: Client(engine=sync_engine), "not Engine"),  # type: ignore[arg-type]
        (lambda: Client(engine=psycopg_engine), "driver is 'psycopg': dataloader needs asyncpg"),
    ]
    try:
        for build, message in cases:
            with pytest.raises(TypeError, match=message):
                build()
        with pytest.raises(TypeError, match="dsn must be a string"):
            async with Client.connect(pool):  # type: ignore[arg-type]
                pass
    finally:
        await conn.close()
        await pool.close()
        await engine.dispose()
        await psycopg_engine.dispose()
        sync_engine.dispose()


async def test_a_psycopg_session_or_connection_is_refused_before_anything_is_written(
    db_dsn: str, client: Client, conn: asyncpg.Connection
) -> None:
    engine = create_async_engine("postgresql+psycopg://" + db_dsn.split("://", 1)[1])
    try:
        async with AsyncSession(engine) as session:
            with pytest.raises(TypeError, match="session's driver is 'psycopg'"):
                await client.enqueue("t.any", queue="q", lock_key="k", connection=session)
        async with engine.connect() as sa_conn:
            with pytest.raises(TypeError, match="connection's driver is 'psycopg'"):
                await client.enqueue("t.any", queue="q", lock_key="k", connection=sa_conn)
        with pytest.raises(TypeError, match="connection must be an asyncpg connection"):
            await client.enqueue("t.any", queue="q", lock_key="k", connection=db_dsn)  # type: ignore[arg-type]
    finally:
        await engine.dispose()
    assert await count_jobs(conn) == (0, 0)


# --- enqueue --------------------------------------------------------------------------------


async def test_options_come_from_the_call_then_the_task_then_the_settings(
    client: Client, conn: asyncpg.Connection, tasks: TaskRegistry
) -> None:
    of_task = await client.enqueue("t.day", {"day": "d1"}, lock_key="k1")
    of_settings = await client.enqueue("t.unknown", {}, queue="misc", lock_key="k2")
    own = await client.enqueue(
        "t.day",
        {"day": "d3"},
        lock_key="k3",
        queue="days",  # its task's: another is refused
        priority=1,
        max_attempts=2,
        lease_ttl=timedelta(minutes=2),
    )
    # a Task object brings its own definition, even one this client's registry lacks
    other = TaskRegistry()
    other.task("t.other", queue="others", max_attempts=3)(handler)
    task = other.get("t.other")
    assert task is not None
    of_task_object = await client.enqueue(task, {}, lock_key="k4")
    built = await client.enqueue(NewJob(task="t.day", args={"day": "d5"}, lock_key="k5"))
    with pytest.raises(TypeError, match="takes no other job fields"):
        await client.enqueue(NewJob(task="t.day", args={"day": "d6"}, lock_key="k6"), {})

    def columns(row: asyncpg.Record) -> tuple[Any, ...]:
        return (row["queue"], row["priority"], row["max_attempts"], row["lease_ttl_sec"])

    assert columns(await job_row(conn, of_task.job_id)) == ("days", 7, 9, 33)
    assert columns(await job_row(conn, of_settings.job_id)) == ("misc", 100, 4, 77)
    assert columns(await job_row(conn, own.job_id)) == ("days", 1, 2, 120)
    assert columns(await job_row(conn, of_task_object.job_id)) == ("others", 100, 3, 77)
    assert columns(await job_row(conn, built.job_id)) == ("days", 7, 9, 33)
    assert (await count_jobs(conn))[0] == 5


async def test_a_job_on_another_queue_than_its_tasks_is_refused_naming_both(
    client: Client, conn: asyncpg.Connection
) -> None:
    """Its task's workers, pause and limits are on the task's queue: a job elsewhere would
    bypass them. A task this client does not define goes where the call says."""
    refused = "task 't.day' runs on queue 'days', not 'elsewhere'"
    with pytest.raises(InvalidJob, match=refused) as info:
        await client.enqueue("t.day", {"day": "d1"}, lock_key="k", queue="elsewhere")
    assert info.value.field == "queue"
    with pytest.raises(InvalidJob, match=refused):
        await client.enqueue_many(
            [NewJob(task="t.day", args={"day": "d1"}, lock_key="k", queue="elsewhere")]
        )
    with pytest.raises(InvalidJob, match=refused):
        client.job("t.day", {"day": "d1"}, lock_key="k", queue="elsewhere")
    assert await count_jobs(conn) == (0, 0)
    await client.enqueue("t.unknown", {}, queue="anywhere", lock_key="k")


async def test_the_library_honours_the_default_settings_of_the_environment(
    db_dsn: str,
    conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)  # no .env of the working directory
    monkeypatch.setenv("DL_DEFAULT_LEASE_TTL_SEC", "123")
    monkeypatch.setenv("DL_DEFAULT_MAX_ATTEMPTS", "6")
    pool = await asyncpg.create_pool(db_dsn, min_size=1, max_size=2)
    try:
        async with Client(pool=pool) as client:
            job = await client.enqueue("t.any", {}, queue="q", lock_key="k")
            many = await client.enqueue_many([client.job("t.any", queue="q", lock_key="k2")])
        async with Client.connect(db_dsn) as client:
            connected = await client.enqueue("t.any", {}, queue="q", lock_key="k3")
    finally:
        await pool.close()
    for job_id in (job.job_id, many[0].job_id, connected.job_id):
        row = await job_row(conn, job_id)
        assert (row["lease_ttl_sec"], row["max_attempts"]) == (123, 6)


#: args for DayArgs, and whether the JSON Schema of the model accepts them.
ARGS_CASES: list[tuple[dict[str, Any], bool]] = [
    ({"day": "2026-01-01"}, True),
    ({"day": "2026-01-01", "rows": 2.0}, True),  # a whole number is an integer in JSON Schema
    ({"day": "2026-01-01", "rows": "5"}, False),  # no string for an integer
    ({"day": "2026-01-01", "rows": True}, False),  # no boolean for an integer
    ({"day": "2026-01-01", "rows": 2.5}, False),
    ({"day": 20260101}, False),
    ({}, False),
]


@pytest.mark.parametrize(("args", "valid"), ARGS_CASES)
async def test_args_are_checked_as_strictly_as_over_http(
    start_service: StartService,
    db_dsn: str,
    settings: Settings,
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    args: dict[str, Any],
    valid: bool,
) -> None:
    registry.task("t.day", queue="days", args=DayArgs)(handler)
    service = await start_service(run_workers=False)
    response = await service.client.post(
        "/api/v1/jobs/trigger",
        json={"task": "t.day", "queue": "days", "lock_key": "http", "args": args},
    )
    assert (response.status_code == 200) is valid, response.text
    async with Client.connect(db_dsn, settings=settings, registry=registry) as client:
        if valid:
            await client.enqueue("t.day", args, lock_key="library")
            await client.enqueue_many([client.job("t.day", args, lock_key="bulk")])
        else:
            with pytest.raises(InvalidJobArgs, match=r"args\.") as info:
                await client.enqueue("t.day", args, lock_key="library")
            assert "\n" not in str(info.value)
            with pytest.raises(InvalidJobArgs):
                client.job("t.day", args, lock_key="bulk")
            with pytest.raises(InvalidJobArgs):
                await client.enqueue(NewJob(task="t.day", args=args, lock_key="new"))
    assert (await count_jobs(conn))[0] == (3 if valid else 0)


async def test_args_may_be_the_tasks_model(client: Client, conn: asyncpg.Connection) -> None:
    job = await client.enqueue("t.day", DayArgs(day="2026-01-02", rows=3), lock_key="k")
    assert (await job_row(conn, job.job_id))["args_text"] == '{"day": "2026-01-02", "rows": 3}'


async def test_available_at_is_an_instant_or_a_delay_on_the_database_clock(
    client: Client, conn: asyncpg.Connection
) -> None:
    at = datetime(2030, 5, 17, 8, 30, tzinfo=UTC)
    fixed = await client.enqueue("t.any", queue="q", lock_key="k1", available_at=at)
    delayed = await client.enqueue(
        "t.any", queue="q", lock_key="k2", available_at=timedelta(hours=1, seconds=30)
    )
    # in a batch, each job keeps its own delay (or none)
    delays = [None, timedelta(minutes=5), None, timedelta(minutes=2)]
    bulk = await client.enqueue_many(
        [
            client.job("t.any", queue="q", lock_key=f"b{i}", available_at=delay)
            for i, delay in enumerate(delays)
        ]
    )
    assert (await job_row(conn, fixed.job_id))["available_at"] == at
    # created_at is the database's now() of the same statement: the delay counts from it
    row = await job_row(conn, delayed.job_id)
    assert row["available_at"] - row["created_at"] == timedelta(hours=1, seconds=30)
    rows = [await job_row(conn, job.job_id) for job in bulk]
    assert [r["available_at"] - r["created_at"] for r in rows] == [
        timedelta(0) if delay is None else delay for delay in delays
    ]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"available_at": "2030-01-01"}, "available_at: must be a datetime or a timedelta"),
        ({"available_at": datetime(2030, 1, 1)}, "available_at: must have a time zone"),
        ({"available_at": timedelta(seconds=-1)}, "available_at: a delay must be 0 or more"),
        ({"lease_ttl": timedelta(seconds=1.5)}, "lease_ttl: must be whole seconds"),
        ({"priority": -1}, "priority: must be between 0"),
        ({"lock_key": ""}, "lock_key: must not be empty"),
        ({"queue": None}, "queue: required: task 't.any' does not name its queue"),
        ({"rerun": True}, "rerun: re-running on update needs an idempotency_key"),
    ],
)
async def test_a_bad_option_is_refused_in_one_line_and_nothing_is_written(
    client: Client, conn: asyncpg.Connection, options: dict[str, Any], words: str
) -> None:
    call = {"queue": "q", "lock_key": "k"} | options
    with pytest.raises(InvalidJob) as info:
        await client.enqueue("t.any", {}, **call)
    assert words in str(info.value)
    assert "\n" not in str(info.value)
    assert await count_jobs(conn) == (0, 0)


async def test_an_idempotency_key_returns_the_same_job_and_refuses_another(
    client: Client, conn: asyncpg.Connection
) -> None:
    first = await client.enqueue("t.day", {"day": "d"}, lock_key="k", idempotency_key="day-d")
    again = await client.enqueue("t.day", {"day": "d"}, lock_key="k", idempotency_key="day-d")
    assert (first.created, again.created) == (True, False)
    assert again.job_id == first.job_id
    assert again.status == JobStatus.QUEUED
    for changed, fields in [
        ({"args": {"day": "e"}}, ("args",)),
        ({"lock_key": "other"}, ("lock_key",)),
        ({"priority": 1, "max_attempts": 2}, ("priority", "max_attempts")),
    ]:
        call: dict[str, Any] = {"args": {"day": "d"}, "lock_key": "k"} | changed
        with pytest.raises(IdempotencyConflict) as info:
            await client.enqueue("t.day", idempotency_key="day-d", **call)
        assert (info.value.job_id, info.value.fields) == (first.job_id, fields)
    # a task without a queue of its own (here: none this client defines) may take another
    free = await client.enqueue("t.free", {}, queue="a", lock_key="k", idempotency_key="free")
    with pytest.raises(IdempotencyConflict) as info:
        await client.enqueue("t.free", {}, queue="b", lock_key="k", idempotency_key="free")
    assert (info.value.job_id, info.value.fields) == (free.job_id, ("queue",))
    assert await count_jobs(conn) == (2, 2)
    assert (await job_row(conn, first.job_id))["args_text"] == '{"day": "d"}'


async def test_enqueue_many_writes_thousands_in_input_order(
    client: Client, conn: asyncpg.Connection
) -> None:
    jobs = [client.job("t.day", {"day": f"d{i}"}, lock_key=f"k{i}") for i in range(5000)]
    started = time.monotonic()
    results = await client.enqueue_many(jobs)
    assert time.monotonic() - started < 30  # one statement, not 5,000
    assert all(r.created and r.status == JobStatus.QUEUED for r in results)
    rows = await conn.fetch("SELECT job_id, args->>'day' AS day FROM dl_jobs")
    day_of = {r["job_id"]: r["day"] for r in rows}
    assert [day_of[r.job_id] for r in results] == [f"d{i}" for i in range(5000)]
    assert await count_jobs(conn) == (5000, 5000)


async def test_enqueue_many_applies_idempotency_per_item(
    client: Client, conn: asyncpg.Connection
) -> None:
    existing = await client.enqueue("t.day", {"day": "old"}, lock_key="k0", idempotency_key="old")

    def keyed(day: str, key: str | None) -> NewJob:
        return client.job("t.day", {"day": day}, lock_key=f"k-{day}", idempotency_key=key)

    results = await client.enqueue_many(
        [
            keyed("fresh", None),
            client.job("t.day", {"day": "old"}, lock_key="k0", idempotency_key="old"),
            keyed("new", "new"),
            keyed("plain", None),
            keyed("new", "new"),  # repeated in the batch: the first occurrence's job
            keyed("new", "new"),
        ]
    )
    assert [r.created for r in results] == [True, False, True, True, False, False]
    assert results[1].job_id == existing.job_id
    assert results[4].job_id == results[5].job_id == results[2].job_id
    assert len({r.job_id for r in results}) == 4
    assert await count_jobs(conn) == (4, 4)


async def test_of_a_key_repeated_in_a_batch_the_first_occurrence_creates_the_job(
    client: Client, conn: asyncpg.Connection
) -> None:
    """Whatever order the statement sorts equal keys in: the result of the first occurrence
    says `created`, as a loop of single enqueues would."""
    batch = [
        client.job("t.day", {"day": "d"}, lock_key="k", idempotency_key=f"key-{i % 3}")
        for i in range(300)
    ]
    results = await client.enqueue_many(batch)
    assert [i for i, r in enumerate(results) if r.created] == [0, 1, 2]
    assert {results[i].job_id for i in range(0, 300, 3)} == {results[0].job_id}
    assert await count_jobs(conn) == (3, 3)


@pytest.mark.parametrize("against", ["an existing job", "a job of the same batch"])
async def test_a_conflict_in_enqueue_many_writes_nothing_of_the_batch(
    client: Client, conn: asyncpg.Connection, against: str
) -> None:
    await client.enqueue("t.day", {"day": "a"}, lock_key="k", idempotency_key="existing")
    key = "existing" if against == "an existing job" else "in-batch"
    batch = [
        client.job("t.day", {"day": "1"}, lock_key="k1"),
        client.job("t.day", {"day": "2"}, lock_key="k2", idempotency_key="in-batch"),
        client.job("t.day", {"day": "3"}, lock_key="k3", idempotency_key=key),
    ]
    with pytest.raises(IdempotencyConflict, match=key):
        await client.enqueue_many(batch)
    assert await count_jobs(conn) == (1, 1)


async def test_enqueue_many_takes_only_new_jobs(client: Client, conn: asyncpg.Connection) -> None:
    with pytest.raises(TypeError, match="expected a NewJob"):
        await client.enqueue_many([{"task": "t.any"}])  # type: ignore[list-item]
    assert await client.enqueue_many([]) == []
    assert await count_jobs(conn) == (0, 0)


# --- readers --------------------------------------------------------------------------------


async def test_get_returns_none_for_an_unknown_job(client: Client) -> None:
    assert await client.get(uuid.uuid4()) is None
    with pytest.raises(JobNotFound, match="not a job id"):
        await client.get("not-a-uuid")


async def test_get_reads_every_json_field_whatever_the_connections_codec(
    client: Client, conn: asyncpg.Connection
) -> None:
    job = await client.enqueue("t.day", {"day": "d"}, lock_key="k")
    await conn.execute(
        "UPDATE dl_jobs SET status = 'succeeded', finished_at = now(), attempt = 1,"
        ' started_at = now(), result = \'{"rows": [1, 2], "ok": true}\','
        " duration_ms = 1234, worker_id = 'host-1-abc', checkpoint = '\"page-7\"',"
        " progress = '{\"done\": 3}' WHERE job_id = $1",
        job.job_id,
    )
    state = await client.get(str(job.job_id))
    assert state is not None
    assert state.status == JobStatus.SUCCEEDED
    assert state.finished
    assert state.result == {"rows": [1, 2], "ok": True}
    assert (state.duration_ms, state.worker_id) == (1234, "host-1-abc")
    assert state.checkpoint == "page-7"
    assert state.progress == {"done": 3}
    assert (state.queue, state.task, state.lock_key) == ("days", "t.day", "k")


async def test_list_applies_each_filter(client: Client, conn: asyncpg.Connection) -> None:
    a = await client.enqueue("t.a", {}, queue="qa", lock_key="ka")
    b = await client.enqueue("t.b", {}, queue="qb", lock_key="kb")
    c = await client.enqueue("t.a", {}, queue="qb", lock_key="ka")
    await client.cancel(b.job_id)
    created = {r["job_id"]: r["created_at"] for r in await conn.fetch("SELECT * FROM dl_jobs")}
    assert created[a.job_id] < created[b.job_id] < created[c.job_id]

    async def ids(**filters: Any) -> list[uuid.UUID]:
        page = await client.list(**filters)
        assert page.next_cursor is None
        return [job.job_id for job in page.jobs]

    assert await ids() == [c.job_id, b.job_id, a.job_id]
    assert await ids(queue="qb") == [c.job_id, b.job_id]
    assert await ids(status="canceled") == [b.job_id]
    assert await ids(status=JobStatus.QUEUED) == [c.job_id, a.job_id]
    assert await ids(task="t.a") == [c.job_id, a.job_id]
    assert await ids(lock_key="ka", queue="qb") == [c.job_id]
    assert await ids(created_from=created[b.job_id]) == [c.job_id, b.job_id]
    assert await ids(created_until=created[b.job_id]) == [a.job_id]
    assert await ids(created_from=created[b.job_id], created_until=created[c.job_id]) == [b.job_id]
    assert await ids(queue="nowhere") == []


async def test_list_finds_jobs_whose_args_contain_the_object_given(client: Client) -> None:
    day1 = await client.enqueue(
        "t.a", {"day": "2026-01-01", "ids": [1, 2], "src": {"db": "x"}}, queue="q", lock_key="k1"
    )
    day2 = await client.enqueue(
        "t.a", {"day": "2026-01-02", "ids": [2, 3]}, queue="q", lock_key="k2"
    )
    await client.enqueue("t.a", {}, queue="q", lock_key="k3")
    # nested elsewhere: no match
    await client.enqueue("t.a", {"other": {"day": "2026-01-01"}}, queue="q", lock_key="k4")

    async def ids(args: Any, **filters: Any) -> list[uuid.UUID]:
        return [job.job_id for job in (await client.list(args=args, **filters)).jobs]

    assert await ids({"day": "2026-01-01"}) == [day1.job_id]
    assert await ids('{"day": "2026-01-02"}') == [day2.job_id]  # JSON text, as a query gives it
    assert await ids({"ids": [2]}) == [day2.job_id, day1.job_id]  # an array holding 2
    assert await ids({"ids": [1, 2]}) == [day1.job_id]
    assert await ids({"src": {"db": "x"}}) == [day1.job_id]
    assert await ids({"day": "2026-01-01", "ids": [3]}) == []  # every key must match
    assert await ids({"day": "2026-01-01"}, task="t.b") == []  # with the other filters
    assert await ids({"day": 20260101}) == []  # a number is not a string


async def test_list_pages_through_every_job_once_newest_first(
    client: Client, conn: asyncpg.Connection
) -> None:
    # jobs of one batch share their created_at: the job id orders them
    await client.enqueue_many([client.job("t.any", queue="q", lock_key=f"b{i}") for i in range(12)])
    for i in range(9):
        await client.enqueue("t.any", queue="q", lock_key=f"s{i}")
    await client.enqueue_many([client.job("t.any", queue="q", lock_key=f"c{i}") for i in range(9)])
    expected = [
        r["job_id"]
        for r in await conn.fetch(
            "SELECT job_id FROM dl_jobs ORDER BY created_at DESC, job_id DESC"
        )
    ]
    assert len(expected) == 30
    for limit in (7, 10):  # a last page part full, and one exactly full
        seen: list[uuid.UUID] = []
        pages = 0
        cursor = None
        while True:
            page = await client.list(limit=limit, cursor=cursor)
            pages += 1
            assert len(page.jobs) <= limit
            seen.extend(job.job_id for job in page.jobs)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == expected
        assert pages == -(-30 // limit)  # no empty page at the end


@pytest.mark.parametrize(
    ("filters", "condition"),
    [
        ({}, "true"),
        ({"task": "t.b"}, "task = 't.b'"),
        ({"lock_key": "k4"}, "lock_key = 'k4'"),
        ({"partition_key": "p"}, "partition_key = 'p'"),
        ({"args": {"day": 1}}, "args @> '{\"day\": 1}'"),
        ({"queue": "q"}, "queue = 'q'"),
        ({"status": "running"}, "status = 'running'"),
        ({"status": "queued"}, "status = 'queued'"),
    ],
    ids=lambda value: "+".join(value) if isinstance(value, dict) else "",
)
async def test_list_merges_running_jobs_with_the_others_newest_first(
    client: Client, conn: asyncpg.Connection, filters: dict[str, Any], condition: str
) -> None:
    """The list's indexes leave out the running version of a job: the running jobs are read
    apart and merged in their place, with every filter and across pages."""
    for i in range(12):
        await client.enqueue(
            "t.b" if i % 2 else "t.a",
            {"day": i % 3},
            queue="q",
            lock_key=f"k{i % 5}",
            partition_key="p" if i % 4 else "",
        )
    # the states interleave, newest first: queued, running, queued, queued, running, ...
    await conn.execute(
        "UPDATE dl_jobs j SET status = 'running', started_at = now(), attempt = 1,"
        " lease_expires_at = now() + interval '1 hour'"
        " FROM (SELECT job_id, row_number() OVER (ORDER BY created_at, job_id) AS n"
        "       FROM dl_jobs) o"
        " WHERE j.job_id = o.job_id AND o.n % 3 = 2"
    )
    await conn.execute(
        "UPDATE dl_jobs SET status = 'succeeded', finished_at = now() WHERE job_id IN"
        " (SELECT job_id FROM dl_jobs WHERE status = 'queued' ORDER BY created_at LIMIT 2)"
    )
    expected = [
        r["job_id"]
        for r in await conn.fetch(
            f"SELECT job_id FROM dl_jobs WHERE {condition} ORDER BY created_at DESC, job_id DESC"
        )
    ]
    running = await conn.fetchval(
        f"SELECT count(*) FROM dl_jobs WHERE {condition} AND status = 'running'"
    )
    assert expected
    assert running > 0 or filters.get("status") == "queued"
    seen: list[uuid.UUID] = []
    cursor = None
    while True:
        page = await client.list(limit=2, cursor=cursor, **filters)
        seen.extend(job.job_id for job in page.jobs)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == expected
    assert [job.job_id for job in (await client.list(limit=100, **filters)).jobs] == expected


@pytest.mark.parametrize(
    ("filters", "words"),
    [
        ({"cursor": "garbage"}, "not a cursor of this list"),
        ({"cursor": f"2026-01-01T00:00:00~{uuid.uuid4()}"}, "not a cursor"),  # no time zone
        ({"cursor": "2026-01-01T00:00:00+00:00~nope"}, "not a cursor"),
        ({"cursor": 12}, "not a cursor"),
        ({"limit": 0}, "limit must be an integer between 1 and 1000"),
        ({"limit": 1001}, "between 1 and 1000"),
        ({"limit": "10"}, "between 1 and 1000"),
        ({"status": "sleeping"}, "status must be one of queued"),
        ({"args": {}}, "args: must name at least one key"),
        ({"args": "{}"}, "args: must name at least one key"),
        ({"args": "[1]"}, "args: must be a JSON object"),
        ({"args": "{day"}, "args: not valid JSON"),
        ({"args": "[" * 5000 + "]" * 5000}, "args: must be at most 8000 bytes"),
        ({"args": "[" * 3000 + "]" * 3000}, "args: nested deeper than 64"),
        ({"args": {"x": "a\x00b"}}, "args: must not contain NUL"),
        ({"args": {"x": "y" * 8000}}, "args: must be at most 8000 bytes"),
    ],
)
async def test_list_refuses_bad_input(client: Client, filters: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        await client.list(**filters)


async def test_enqueue_many_counts_the_jobs_it_created_by_queue_and_task(
    client: Client,
) -> None:
    q1, q2 = f"q-{uuid.uuid4().hex[:8]}", f"q-{uuid.uuid4().hex[:8]}"

    def enqueued(queue: str, task: str) -> float:
        labels = {"queue": queue, "task": task}
        return REGISTRY.get_sample_value("dataloader_jobs_enqueued_total", labels) or 0.0

    await client.enqueue_many(
        [
            client.job("t.a", queue=q1, lock_key="a1", idempotency_key=f"{q1}-1"),
            client.job("t.a", queue=q1, lock_key="a2"),
            client.job("t.b", queue=q1, lock_key="b1"),
            client.job("t.a", queue=q2),
        ]
    )
    # a job whose key another holds is not created, and not counted
    await client.enqueue_many(
        [client.job("t.a", queue=q1, lock_key="a1", idempotency_key=f"{q1}-1")]
    )
    assert (enqueued(q1, "t.a"), enqueued(q1, "t.b"), enqueued(q2, "t.a")) == (2, 1, 1)


async def test_list_takes_the_largest_limit(client: Client) -> None:
    await client.enqueue_many(
        [client.job("t.any", queue="q", lock_key=f"k{i}") for i in range(1001)]
    )
    first = await client.list(limit=1000)
    assert len(first.jobs) == 1000
    assert first.next_cursor is not None
    rest = await client.list(limit=1000, cursor=first.next_cursor)
    assert (len(rest.jobs), rest.next_cursor) == (1, None)


async def test_events_are_the_journal_oldest_first(client: Client) -> None:
    at = datetime(2031, 1, 1, tzinfo=UTC)
    job = await client.enqueue("t.any", queue="q", lock_key="k", available_at=at)
    await client.cancel(job.job_id)
    events = await client.events(job.job_id)
    assert [e.kind for e in events] == ["queued", "canceled"]
    assert events[0].ts <= events[1].ts
    assert events[0].event_id < events[1].event_id
    assert isinstance(events[0].payload, dict)
    assert datetime.fromisoformat(events[0].payload["available_at"]) == at
    assert events[1].payload is not None
    assert events[1].payload["by"] == "client"
    assert await client.events(uuid.uuid4()) == []


# --- cancel and retry without workers ----------------------------------------------------


async def test_cancel_ends_a_queued_job_and_leaves_a_finished_one(
    client: Client, conn: asyncpg.Connection
) -> None:
    job = await client.enqueue("t.any", queue="q", lock_key="k")
    state = await client.cancel(job.job_id)
    assert state.status == JobStatus.CANCELED
    assert state.finished_at is not None
    again = await client.cancel(job.job_id)
    assert (again.status, again.finished_at) == (JobStatus.CANCELED, state.finished_at)
    kinds = [r["kind"] for r in await conn.fetch("SELECT kind FROM dl_job_events ORDER BY 1")]
    assert kinds == ["canceled", "queued"]  # the second cancel journals nothing
    with pytest.raises(JobNotFound):
        await client.cancel(uuid.uuid4())


async def test_retry_of_a_canceled_job_queues_it_with_a_fresh_budget(
    client: Client, conn: asyncpg.Connection
) -> None:
    job = await client.enqueue("t.any", queue="q", lock_key="k")
    with pytest.raises(NotRetryable, match="it is queued already"):
        await client.retry(job.job_id)
    await client.cancel(job.job_id)
    state = await client.retry(job.job_id)
    assert (state.status, state.attempt, state.cancel_requested) == (JobStatus.QUEUED, 0, False)
    assert state.finished_at is None
    events = await client.events(job.job_id)
    assert [e.kind for e in events] == ["queued", "canceled", "retried"]
    assert events[-1].payload is not None
    assert events[-1].payload["was"] == "canceled"
    with pytest.raises(JobNotFound):
        await client.retry(uuid.uuid4())


async def test_events_read_on_from_the_last_one_seen(client: Client) -> None:
    job = await client.enqueue("t.any", queue="q", lock_key="k")
    await client.cancel(job.job_id)
    first, second = await client.events(job.job_id)
    assert await client.events(job.job_id, after=first.event_id) == [second]
    assert await client.events(job.job_id, limit=1) == [first]
    for bad in ({"after": "1"}, {"limit": 0}, {"limit": True}):
        with pytest.raises(ValueError, match=r"after|limit"):
            await client.events(job.job_id, **bad)


async def test_a_delay_of_a_fraction_of_a_second_is_kept(
    client: Client, conn: asyncpg.Connection
) -> None:
    job = await client.enqueue("t", lock_key="k", queue="q", available_at=timedelta(seconds=0.4))
    waits = await conn.fetchval(
        "SELECT available_at - created_at FROM dl_jobs WHERE job_id = $1", job.job_id
    )
    assert waits == timedelta(seconds=0.4)
