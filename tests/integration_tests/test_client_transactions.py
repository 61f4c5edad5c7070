"""`enqueue(…, connection=…)` and `enqueue_many(…, connection=…)` in the caller's transaction,
over each kind of connection a caller may hold: the jobs exist if and only if it commits."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from dataloader import Client, IdempotencyConflict

from .clients import sqlalchemy_url


@dataclass
class Caller:
    """A connection of the caller's, in a transaction the caller ends."""

    connection: Any
    commit: Callable[[], Awaitable[Any]]
    rollback: Callable[[], Awaitable[Any]]


#: How the caller holds its connection and begins its transaction.
KINDS = {
    "asyncpg connection": "asyncpg, a transaction()",
    "asyncpg pool connection": "a connection acquired from a pool, a transaction()",
    "asyncpg plain BEGIN": "asyncpg, BEGIN sent as a statement",
    "session begun, nothing sent": "AsyncSession.begin(): SQLAlchemy has not sent BEGIN yet",
    "session that ran a statement": "AsyncSession whose transaction sent BEGIN already",
    "session never begun": "AsyncSession, no begin(): its first statement begins",
    "connection never begun": "AsyncConnection, no begin(): its first statement begins",
    "connection begun, nothing sent": "AsyncConnection.begin(), BEGIN not sent yet",
}


@asynccontextmanager
async def caller(kind: str, dsn: str) -> AsyncIterator[Caller]:
    """The caller's connection of `kind`, in its transaction."""
    if kind == "asyncpg connection":
        conn = await asyncpg.connect(dsn)
        try:
            transaction = conn.transaction()
            await transaction.start()
            yield Caller(conn, transaction.commit, transaction.rollback)
        finally:
            await conn.close()
    elif kind == "asyncpg pool connection":
        async with (
            asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool,
            pool.acquire() as conn,
        ):
            transaction = conn.transaction()
            await transaction.start()
            yield Caller(conn, transaction.commit, transaction.rollback)
    elif kind == "asyncpg plain BEGIN":
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("BEGIN")
            yield Caller(conn, lambda: conn.execute("COMMIT"), lambda: conn.execute("ROLLBACK"))
        finally:
            await conn.close()
    else:
        engine = create_async_engine(sqlalchemy_url(dsn))
        try:
            if kind.startswith("session"):
                async with AsyncSession(engine) as session:
                    if kind == "session begun, nothing sent":
                        await session.begin()
                    elif kind == "session that ran a statement":
                        await session.execute(text("SELECT 1"))
                    yield Caller(session, session.commit, session.rollback)
            else:
                async with engine.connect() as sa_conn:
                    if kind == "connection begun, nothing sent":
                        await sa_conn.begin()
                    yield Caller(sa_conn, sa_conn.commit, sa_conn.rollback)
        finally:
            await engine.dispose()


@pytest.fixture
async def client(db_dsn: str) -> AsyncIterator[Client]:
    async with Client.connect(db_dsn) as opened:
        yield opened


async def counts(conn: asyncpg.Connection) -> tuple[int, int]:
    """(jobs, journal entries) committed, as another session sees them."""
    jobs = await conn.fetchval("SELECT count(*) FROM dl_jobs")
    events = await conn.fetchval("SELECT count(*) FROM dl_job_events")
    return jobs, events


@pytest.mark.parametrize("ends", ["commit", "rollback"])
@pytest.mark.parametrize("call", ["enqueue", "enqueue_many"])
@pytest.mark.parametrize("kind", list(KINDS))
async def test_jobs_exist_if_and_only_if_the_caller_commits(
    client: Client, db_dsn: str, conn: asyncpg.Connection, kind: str, call: str, ends: str
) -> None:
    async with caller(kind, db_dsn) as mine:
        if call == "enqueue":
            await client.enqueue("t", {"n": 1}, queue="q", lock_key="k", connection=mine.connection)
            written = 1
        else:
            jobs = [client.job("t", {"n": n}, queue="q", lock_key=f"k{n}") for n in range(3)]
            results = await client.enqueue_many(jobs, connection=mine.connection)
            assert all(r.created for r in results)
            written = 3
        assert await counts(conn) == (0, 0)  # not committed on their own
        await (mine.commit if ends == "commit" else mine.rollback)()
    expected = (written, written) if ends == "commit" else (0, 0)
    assert await counts(conn) == expected


@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_conflicting_batch_leaves_the_callers_transaction_usable(
    client: Client, db_dsn: str, conn: asyncpg.Connection, kind: str
) -> None:
    """The batch is written under a savepoint of the caller's transaction: a conflict takes
    back the batch only, and the caller's earlier work still commits."""
    await client.enqueue("t", {"n": 0}, queue="q", lock_key="k", idempotency_key="taken")
    async with caller(kind, db_dsn) as mine:
        await client.enqueue("t", {"n": 1}, queue="q", lock_key="k1", connection=mine.connection)
        batch = [
            client.job("t", {"n": 2}, queue="q", lock_key="k2"),
            client.job("t", {"n": 3}, queue="q", lock_key="k", idempotency_key="taken"),
        ]
        with pytest.raises(IdempotencyConflict, match="taken"):
            await client.enqueue_many(batch, connection=mine.connection)
        await client.enqueue("t", {"n": 4}, queue="q", lock_key="k4", connection=mine.connection)
        await mine.commit()
    rows = await conn.fetch("SELECT (args->>'n')::int AS n FROM dl_jobs ORDER BY 1")
    assert [r["n"] for r in rows] == [0, 1, 4]
    assert await counts(conn) == (3, 3)
