"""dataloader inside someone else's program: a Runner in another FastAPI app's lifespan sharing
its asyncpg pool, a startup hook building the tasks' resources, the tasks' own database
(`DL_TARGET_DSN`), and a context that closes everything it opened, in order, whatever fails."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest
from fastapi import FastAPI, Request
from sqlalchemy import text

from dataloader import ConfigError, JobContext, Runner, Settings, TaskRegistry
from dataloader.context import AppContext
from dataloader.exceptions import DatabaseUnavailable

from ..conftest import _drop_db, with_database
from .helpers import wait_until

#: dataloader's own connections in the current database, by the names they give the server.
DATALOADER_CONNECTIONS = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name LIKE 'dataloader%'
  AND application_name <> 'dataloader-check'
"""

#: The workers' own connections in the current database: their pool, lock holder, listener.
WORKER_CONNECTIONS = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database()
  AND application_name IN ('dataloader-worker', 'dataloader-locks', 'dataloader-listener')
"""

#: Connections without a name other than the asking one's: the tasks' engine (asyncpg names
#: no connection by itself).
UNNAMED_CONNECTIONS = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = '' AND pid <> pg_backend_pid()
"""


@pytest.fixture
def settings(db_dsn: str) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        db_dsn=db_dsn,
        workers=[{"queue": "host", "concurrency": 2}],
        auto_migrate=False,
        poll_interval_sec=300,
        heartbeat_sec=0.2,
        shutdown_timeout_sec=5,
    )


@pytest.fixture
def target_db(admin_dsn: str) -> Iterator[str]:
    """A second database on the test server, with a table for tasks to load into."""
    name = f"dl_target_{uuid.uuid4().hex[:12]}"

    async def create() -> None:
        conn = await asyncpg.connect(admin_dsn)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        target = await asyncpg.connect(with_database(admin_dsn, name))
        try:
            await target.execute("CREATE TABLE loaded (day text PRIMARY KEY)")
        finally:
            await target.close()

    asyncio.run(create())
    yield with_database(admin_dsn, name)
    _drop_db(admin_dsn, name)


def database_name(dsn: str) -> str:
    return urlsplit(dsn).path.lstrip("/")


async def no_dataloader_connections(conn: asyncpg.Connection) -> None:
    """Until the server has no connection of dataloader's left in this database (a closed
    connection's backend leaves pg_stat_activity a moment after the client let go)."""

    async def gone() -> bool:
        return await conn.fetchval(DATALOADER_CONNECTIONS) == 0

    await wait_until(gone, timeout=10, what="dataloader's connections to close")


# --- a Runner inside another FastAPI app --------------------------------------------------------


async def test_a_runner_in_another_apps_lifespan_shares_its_pool_and_leaves_it_open(
    settings: Settings, db_dsn: str, conn: asyncpg.Connection
) -> None:
    registry = TaskRegistry()
    pools_seen: list[Any] = []

    @registry.task("host.add_one", queue="host")
    async def add_one(ctx: JobContext[dict[str, Any]]) -> dict[str, int]:
        pools_seen.append(ctx.app.pool)
        async with ctx.app.pool.acquire() as connection:  # tasks use the app's pool too
            value: int = await connection.fetchval("SELECT $1::int + 1", ctx.args["n"])
        return {"n": value}

    after_runner: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with asyncpg.create_pool(db_dsn, min_size=1, max_size=4) as pool:
            app.state.pool = pool
            async with Runner(settings, registry, pool=pool) as dl:
                app.state.jobs = dl.client
                yield
            # the workers are gone; the pool is still the app's, open and working
            after_runner["workers"] = await pool.fetchval(WORKER_CONNECTIONS)
            after_runner["pool_open"] = not pool.is_closing()
            after_runner["pool_answers"] = await pool.fetchval("SELECT 1")

    app = FastAPI(lifespan=lifespan)

    @app.post("/numbers/{n}")
    async def add(n: int, request: Request) -> dict[str, str]:
        job = await request.app.state.jobs.enqueue("host.add_one", {"n": n}, lock_key=f"n:{n}")
        return {"job_id": str(job.job_id)}

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app.test") as http:
            response = await http.post("/numbers/41")
        assert response.status_code == 200, response.text
        state = await app.state.jobs.wait(response.json()["job_id"], timeout=20)
        assert (state.status, state.result) == ("succeeded", {"n": 42})
        assert len(pools_seen) == 1
        assert pools_seen[0] is app.state.pool
        assert await conn.fetchval(WORKER_CONNECTIONS) >= 3  # lock, listener, claims
    # the Runner stopped its workers before the app closed its own pool
    assert after_runner == {"workers": 0, "pool_open": True, "pool_answers": 1}
    assert app.state.pool.is_closing()  # closed by its owner, the app
    await no_dataloader_connections(conn)


async def test_a_shared_pool_needs_db_dsn(db_dsn: str) -> None:
    settings = Settings(_env_file=None, db_dsn=None)  # type: ignore[call-arg]
    async with asyncpg.create_pool(db_dsn, min_size=1, max_size=2) as pool:
        with pytest.raises(ConfigError, match=r"Runner\(pool=…\) needs settings.db_dsn"):
            Runner(settings, pool=pool)


async def test_a_shared_pool_of_another_database_is_refused_before_anything_runs(
    settings: Settings, admin_dsn: str, conn: asyncpg.Connection
) -> None:
    async with asyncpg.create_pool(admin_dsn, min_size=1, max_size=2) as pool:
        runner = Runner(settings, pool=pool)
        with pytest.raises(ConfigError, match="must reach the same database") as raised:
            await runner.start()
        assert not pool.is_closing()  # still the app's
    assert database_name(admin_dsn) in str(raised.value)
    await no_dataloader_connections(conn)
    assert await conn.fetchval("SELECT count(*) FROM dl_workers") == 0


# --- the startup hook -------------------------------------------------------------------------


async def test_an_async_hooks_value_is_what_tasks_get_as_resources(settings: Settings) -> None:
    registry = TaskRegistry()
    contexts: list[AppContext] = []

    async def startup(app: AppContext) -> dict[str, str]:
        contexts.append(app)
        return {"greeting": "hello"}

    @registry.task("host.greet", queue="host")
    async def greet(ctx: JobContext[dict[str, Any]]) -> str:
        return f"{ctx.resources['greeting']} {ctx.args['name']}"

    async with Runner(settings, registry, startup=startup) as dl:
        assert contexts == [dl.context]  # called once, with the context
        job = await dl.client.enqueue("host.greet", {"name": "world"}, lock_key="k")
        state = await dl.client.wait(job.job_id, timeout=20)
    assert (state.status, state.result) == ("succeeded", "hello world")


class Resource:
    """Something a task needs that must be closed: it refuses use once closed."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.closed = False

    def use(self, what: str) -> None:
        assert not self.closed, f"{what}: the resource was closed before its last use"
        self.events.append(what)


async def test_a_hooks_context_manager_is_closed_after_the_workers_stopped(
    settings: Settings, conn: asyncpg.Connection
) -> None:
    registry = TaskRegistry()
    events: list[str] = []
    job_started = asyncio.Event()
    release_job = asyncio.Event()
    at_close: dict[str, Any] = {}

    @asynccontextmanager
    async def startup(app: AppContext) -> AsyncIterator[Resource]:
        resource = Resource(events)
        yield resource
        # what is still connected when the hook's resources are closed
        at_close["workers"] = await app.pool.fetchval(WORKER_CONNECTIONS)
        at_close["job"] = await app.pool.fetchval("SELECT status::text FROM dl_jobs")
        resource.closed = True
        events.append("closed")

    @registry.task("host.slow", queue="host")
    async def slow(ctx: JobContext[dict[str, Any]]) -> None:
        job_started.set()
        await release_job.wait()
        ctx.resources.use("used by the job")

    runner = Runner(settings, registry, startup=startup)
    await runner.start()
    await runner.client.enqueue("host.slow", {}, lock_key="k")
    await job_started.wait()
    stopping = asyncio.create_task(runner.stop())

    async def deregistered() -> bool:  # the stop has begun: the job is in its grace period
        return await conn.fetchval("SELECT count(*) FROM dl_workers") == 0

    await wait_until(deregistered, what="the workers to stop claiming")
    release_job.set()
    await stopping
    assert events == ["used by the job", "closed"]
    # the workers were gone (the job finished in their grace period); the pool still worked
    assert at_close == {"workers": 0, "job": "succeeded"}
    await no_dataloader_connections(conn)


@pytest.mark.parametrize("failing", ["coroutine", "context-manager"])
async def test_a_failing_hook_fails_the_start_and_leaves_nothing_running(
    settings: Settings, conn: asyncpg.Connection, failing: str
) -> None:
    class HookFailed(Exception):
        pass

    async def failing_coroutine(app: AppContext) -> None:
        await app.pool.fetchval("SELECT 1")  # the pool was open: it must be closed again
        raise HookFailed("no credentials for the API")

    @asynccontextmanager
    async def failing_context(app: AppContext) -> AsyncIterator[None]:
        await app.pool.fetchval("SELECT 1")
        raise HookFailed("no credentials for the API")
        yield

    hook = failing_coroutine if failing == "coroutine" else failing_context
    tasks_before = asyncio.all_tasks()
    runner = Runner(settings, TaskRegistry(), startup=hook)
    with pytest.raises(HookFailed, match="no credentials"):
        await runner.start()
    with pytest.raises(RuntimeError, match="not started"):
        _ = runner.client
    assert asyncio.all_tasks() == tasks_before  # no loop, no listener left behind
    await no_dataloader_connections(conn)
    assert await conn.fetchval("SELECT count(*) FROM dl_workers") == 0
    await runner.stop()  # harmless after a failed start


async def test_a_hook_returning_neither_awaitable_nor_context_manager_is_a_type_error(
    settings: Settings, conn: asyncpg.Connection
) -> None:
    def synchronous(app: AppContext) -> dict[str, str]:
        return {"not": "awaitable"}

    with pytest.raises(TypeError, match=r"awaitable or an async context manager.*not dict"):
        await Runner(settings, TaskRegistry(), startup=synchronous).start()  # type: ignore[arg-type]
    await no_dataloader_connections(conn)


# --- the tasks' database: DL_TARGET_DSN ---------------------------------------------------------


async def test_tasks_engine_and_sessions_use_dl_target_dsn_and_the_queue_stays_put(
    settings: Settings, target_db: str, db_dsn: str, conn: asyncpg.Connection
) -> None:
    registry = TaskRegistry()

    @registry.task("host.load", queue="host")
    async def load(ctx: JobContext[dict[str, Any]]) -> dict[str, str]:
        async with ctx.sessionmaker() as session, session.begin():
            await session.execute(text("INSERT INTO loaded (day) VALUES (:day)"), ctx.args)
        async with ctx.engine.connect() as connection:
            row = (
                await connection.execute(
                    text("SELECT current_database(), current_setting('application_name')")
                )
            ).one()
        async with ctx.app.pool.acquire() as queue:
            queue_database = await queue.fetchval("SELECT current_database()")
        return {"engine": row[0], "application_name": row[1], "queue": queue_database}

    # libpq's parameters in the DSN are honoured, as they are for the queue's connections
    separator = "&" if "?" in target_db else "?"  # the embedded server's DSN has a query
    target = f"{target_db}{separator}application_name=dl-target-test"
    async with Runner(settings.model_copy(update={"target_dsn": target}), registry) as dl:
        job = await dl.client.enqueue("host.load", {"day": "2026-01-01"}, lock_key="day:1")
        state = await dl.client.wait(job.job_id, timeout=20)
    assert state.status == "succeeded", state.error
    assert state.result == {
        "engine": database_name(target_db),
        "application_name": "dl-target-test",
        "queue": database_name(db_dsn),
    }
    loaded = await asyncpg.connect(target_db)
    try:
        assert await loaded.fetchval("SELECT day FROM loaded") == "2026-01-01"
    finally:
        await loaded.close()
    assert await conn.fetchval("SELECT to_regclass('loaded')") is None


async def test_without_dl_target_dsn_tasks_engine_is_on_the_queues_database(
    settings: Settings, db_dsn: str
) -> None:
    registry = TaskRegistry()

    @registry.task("host.where", queue="host")
    async def where(ctx: JobContext[dict[str, Any]]) -> str:
        async with ctx.engine.connect() as connection:
            database: str = await connection.scalar(text("SELECT current_database()"))
        return database

    assert settings.target_dsn is None
    async with Runner(settings, registry) as dl:
        job = await dl.client.enqueue("host.where", {}, lock_key="k")
        state = await dl.client.wait(job.job_id, timeout=20)
    assert (state.status, state.result) == ("succeeded", database_name(db_dsn))


async def test_an_unknown_target_database_is_named_with_its_password_masked(
    admin_dsn: str,
) -> None:
    from dataloader.context import check_target

    parts = urlsplit(with_database(admin_dsn, "dl_no_such_target"))
    dsn = parts._replace(netloc=f"postgres:secretpw@{parts.netloc.rpartition('@')[2]}").geturl()
    with pytest.raises(DatabaseUnavailable) as raised:
        await check_target(dsn)
    message = str(raised.value)
    assert message.startswith("DL_TARGET_DSN")
    assert 'database "dl_no_such_target" does not exist' in message
    assert "secretpw" not in message


# --- closing the context ----------------------------------------------------------------------


async def test_closing_the_context_closes_client_engine_and_owned_pool_once(
    settings: Settings, conn: asyncpg.Connection
) -> None:
    context = await AppContext.open(settings)
    async with context.engine.connect() as connection:  # the engine holds a connection now
        await connection.execute(text("SELECT 1"))
    job = await context.client.enqueue("demo.noop", {}, queue="host", lock_key="k")
    waiting = asyncio.create_task(context.client.wait(job.job_id))

    async def listening() -> bool:  # the client's LISTEN connection is open
        return bool(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query LIKE 'LISTEN%'"
            )
        )

    await wait_until(listening, what="the client to listen for ended jobs")
    assert await conn.fetchval(UNNAMED_CONNECTIONS) == 1
    await context.close()
    await context.close()  # again: nothing happens
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert context.pool.is_closing()
    assert [t for t in asyncio.all_tasks() if t.get_name() == "dataloader-client-listen"] == []
    await no_dataloader_connections(conn)

    async def engine_gone() -> bool:
        return await conn.fetchval(UNNAMED_CONNECTIONS) == 0

    await wait_until(engine_gone, what="the engine's connection to close")


async def test_closing_goes_on_when_the_hooks_cleanup_fails(
    settings: Settings, conn: asyncpg.Connection
) -> None:
    class CleanupFailed(Exception):
        pass

    @asynccontextmanager
    async def startup(app: AppContext) -> AsyncIterator[None]:
        yield
        raise CleanupFailed("could not flush the cache")

    runner = Runner(settings, TaskRegistry(), startup=startup)
    await runner.start()
    pool = runner.context.pool
    with pytest.raises(CleanupFailed):
        await runner.stop()
    assert pool.is_closing()  # closed all the same
    await no_dataloader_connections(conn)
