"""Advisory locks never outlive their jobs on the server: not when a batched lock fails part
way with a server error, nor when the lock connection holds a lock no job of its process
reserved."""

from __future__ import annotations

import asyncpg

from dataloader.workers.locks import LockHolder

from .server import PrivateServer

#: Advisory locks held in the server (the private server serves this test alone).
HELD = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"


async def test_a_batched_lock_that_fails_part_way_leaves_no_lock_behind(
    private_server: PrivateServer,
) -> None:
    """A lock table far too small for the batch: the server takes locks until it runs out of
    shared memory, then fails the statement, and session-level locks survive its rollback."""
    admin = await asyncpg.connect(private_server.dsn)
    await admin.execute("ALTER SYSTEM SET max_locks_per_transaction = 10")
    await admin.close()
    await private_server.restart("fast")
    lost: list[str] = []
    holder = LockHolder(private_server.dsn, on_lost=lost.append)
    await holder.connect()
    conn = await asyncpg.connect(private_server.dsn)
    try:
        try:
            await holder.try_lock(range(1, 50_001))
        except asyncpg.OutOfMemoryError:
            pass
        else:
            raise AssertionError("the lock table was expected to overflow")
        assert await conn.fetchval(HELD) == 0
        assert lost == []  # released in place: the connection and its other jobs live on
        assert await holder.try_lock([7]) == {7}
        await holder.unlock([7])
        assert await conn.fetchval(HELD) == 0
    finally:
        await holder.close()
        await conn.close()


async def test_the_audit_releases_locks_no_job_reserved(private_server: PrivateServer) -> None:
    """A lock the lock connection holds for none of its jobs (taken twice: advisory locks are
    re-entrant) is released, every level of it, by the periodic audit; the jobs' own stay."""
    holder = LockHolder(private_server.dsn, on_lost=lambda reason: None)
    await holder.connect()
    conn = await asyncpg.connect(private_server.dsn)
    try:
        assert await holder.try_lock([1, 2]) == {1, 2}
        session = holder._conn
        assert session is not None
        for _ in range(2):
            await session.execute("SELECT pg_advisory_lock(-42)")
        assert await conn.fetchval(HELD) == 3
        await holder.audit()
        keys = await conn.fetch(
            "SELECT (classid::bigint << 32) | objid::bigint AS k FROM pg_locks"
            " WHERE locktype = 'advisory' ORDER BY 1"
        )
        assert [r["k"] for r in keys] == [1, 2]
    finally:
        await holder.close()
        await conn.close()
