"""A producer tells an outage from a mistake: every `Client` call raises DatabaseUnavailable
(one line, the driver's error as its cause) for a connection refused, or lost mid-statement
(its server session terminated), whatever the source of its connections; the client works
again once the database does."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

import dataloader
from dataloader import Client, DatabaseUnavailable, JobStatus
from dataloader.core.dsn import normalise_dsn

from .clients import SOURCES, open_client, sqlalchemy_url
from .conftest import wait_until

Call = Callable[[Client, uuid.UUID], Awaitable[Any]]

#: Every public call of a client that reaches the database, by name.
CALLS: dict[str, Call] = {
    "enqueue": lambda c, _: c.enqueue("t.any", {}, queue="q", lock_key="k"),
    "enqueue_many": lambda c, _: c.enqueue_many(
        [c.job("t.any", {}, queue="q", lock_key=f"k{i}") for i in range(3)]
    ),
    "get": lambda c, job: c.get(job),
    "list": lambda c, _: c.list(queue="q"),
    "stats": lambda c, _: c.stats(),
    "events": lambda c, job: c.events(job),
    "wait": lambda c, job: c.wait(job, timeout=30),
    "follow": lambda c, job: anext(aiter(c.follow(job))),
    "cancel": lambda c, job: c.cancel(job),
    "retry": lambda c, job: c.retry(job),
    "pause": lambda c, _: c.pause("q"),
    "resume": lambda c, _: c.resume("q"),
    "set_limits": lambda c, _: c.set_limits("q", max_running=1),
    "queue_events": lambda c, _: c.queue_events("q"),
    "cancel_many": lambda c, _: c.cancel_many(queue="q"),
    "retry_many": lambda c, _: c.retry_many(queue="q"),
}

#: Every table of the queue, locked so that a call's statement waits until it is cut.
LOCK_EVERY_TABLE = """
DO $$ BEGIN EXECUTE 'LOCK TABLE ' || (
    SELECT string_agg(quote_ident(tablename), ', ') FROM pg_tables
    WHERE schemaname = current_schema() AND tablename LIKE 'dl\\_%'
) || ' IN ACCESS EXCLUSIVE MODE'; END $$
"""
#: Sessions of the test's database waiting for a lock.
WAITING_FOR_A_LOCK = """
SELECT array_agg(pid) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'
"""


async def terminated_mid_statement(conn: asyncpg.Connection, call: Awaitable[Any]) -> BaseException:
    """Run `call` while every table is locked, terminate the session its statement waits
    on, and return what the call raised."""
    async with conn.transaction():
        await conn.execute(LOCK_EVERY_TABLE)
        running = asyncio.ensure_future(call)

        async def blocked() -> list[int]:
            assert not running.done(), running.result()
            # a transaction sees the sessions as they were at its first look, unless told
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            pids: list[int] = await conn.fetchval(WAITING_FOR_A_LOCK) or []
            return pids

        for pid in await wait_until(blocked, what="the call's statement to wait for a lock"):
            await conn.execute("SELECT pg_terminate_backend($1)", pid)
        try:
            await asyncio.wait_for(running, 30)
        except Exception as exc:  # whichever it is, the caller's assertions say
            return exc
    raise AssertionError("the call succeeded without its session")


def assert_unavailable(name: str, raised: BaseException) -> None:
    assert isinstance(raised, DatabaseUnavailable), f"{name}: {raised!r}"
    assert str(raised).startswith("database unavailable: "), f"{name}: {raised}"
    assert "\n" not in str(raised)
    assert raised.__cause__ is not None  # the driver's error, for whoever debugs


@pytest.mark.parametrize("source", SOURCES)
async def test_every_call_cut_by_a_terminated_session_raises_database_unavailable(
    source: str, db_dsn: str, conn: asyncpg.Connection
) -> None:
    async with open_client(source, db_dsn) as client:
        job = (await client.enqueue("t.any", {}, queue="q", lock_key="k")).job_id
        for name, call in CALLS.items():
            assert_unavailable(name, await terminated_mid_statement(conn, call(client, job)))
        assert (await client.get(job)) is not None  # the client works again


async def test_an_enqueue_in_the_caller_s_transaction_cut_raises_database_unavailable(
    db_dsn: str, conn: asyncpg.Connection
) -> None:
    async with Client.connect(db_dsn) as client:
        for name in ("enqueue", "enqueue_many"):
            caller = await asyncpg.connect(db_dsn)
            try:
                new = client.job("t.any", {}, queue="q", lock_key="k")
                call = (
                    client.enqueue(new, connection=caller)
                    if name == "enqueue"
                    else client.enqueue_many([new], connection=caller)
                )
                assert_unavailable(name, await terminated_mid_statement(conn, call))
            finally:
                await caller.close()


async def test_a_batch_cut_short_writes_nothing_of_it(
    db_dsn: str, conn: asyncpg.Connection
) -> None:
    """`enqueue_many` is one transaction: cut before it commits, none of its jobs exist."""
    async with Client.connect(db_dsn) as client:
        batch = [client.job("t.any", {}, queue="q", lock_key=f"k{i}") for i in range(100)]
        raised = await terminated_mid_statement(conn, client.enqueue_many(batch))
        assert_unavailable("enqueue_many", raised)
    assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 0


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@asynccontextmanager
async def refused_client(source: str) -> AsyncIterator[Client]:
    """A client whose every connection is refused (its pool or engine opens them lazily)."""
    dsn = f"postgresql://u:secret@127.0.0.1:{closed_port()}/db"
    if source == "pool":
        pool = await asyncpg.create_pool(dsn, min_size=0, max_size=2)
        try:
            async with Client(pool=pool) as client:
                yield client
        finally:
            await pool.close()
    else:
        engine = create_async_engine(sqlalchemy_url(dsn))
        try:
            async with Client(engine=engine) as client:
                yield client
        finally:
            await engine.dispose()


@pytest.mark.parametrize("source", ["pool", "engine"])
async def test_every_call_refused_a_connection_raises_database_unavailable(source: str) -> None:
    async with refused_client(source) as client:
        for name, call in CALLS.items():
            with pytest.raises(DatabaseUnavailable) as raised:
                await asyncio.wait_for(call(client, uuid.uuid4()), 30)
            assert_unavailable(name, raised.value)
            assert "secret" not in str(raised.value)


def test_database_unavailable_is_part_of_the_public_api() -> None:
    assert "DatabaseUnavailable" in dataloader.__all__
    assert issubclass(dataloader.DatabaseUnavailable, dataloader.DataloaderError)
    assert JobStatus.QUEUED  # the module's other names stay importable beside it


def _twice(dsn: str) -> str:
    """`dsn` naming its server twice, as a failover DSN names a primary and its standby."""
    parts = urlsplit(dsn)
    query = parse_qs(parts.query)
    if "host" in query:  # a Unix socket
        query["host"] = [f"{query['host'][0]},{query['host'][0]}"]
        return normalise_dsn(parts._replace(query=urlencode(query, doseq=True)).geturl())
    credentials, _, hostport = parts.netloc.rpartition("@")
    return normalise_dsn(parts._replace(netloc=f"{credentials}@{hostport},{hostport}").geturl())


async def test_a_failover_dsn_whose_hosts_are_all_standbys_raises_database_unavailable(
    empty_db_dsn: str,
) -> None:
    """In the middle of a failover no host takes writes yet: the client says the database is
    unavailable (worth retrying), not that something is wrong."""
    admin = await asyncpg.connect(empty_db_dsn)
    try:  # as a hot standby is: every transaction read-only
        database = await admin.fetchval("SELECT current_database()")
        await admin.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    finally:
        await admin.close()
    dsn = _twice(empty_db_dsn)
    assert "target_session_attrs=read-write" in dsn
    pool = await asyncpg.create_pool(dsn, min_size=0, max_size=2)
    try:
        async with Client(pool=pool) as client:
            for name in ("enqueue", "get", "stats"):
                with pytest.raises(DatabaseUnavailable) as raised:
                    await asyncio.wait_for(CALLS[name](client, uuid.uuid4()), 30)
                assert_unavailable(name, raised.value)
    finally:
        await pool.close()
