"""The library face: Runner (drain mode), bulk enqueue, transactional enqueue."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from dataloader import JobContext, NewJob, Runner, Settings, TaskRegistry
from dataloader.exceptions import IdempotencyConflict
from dataloader.storage import db
from dataloader.storage.repositories import enqueue, enqueue_many


def job(i: int, key: str | None = None) -> NewJob:
    return NewJob(queue="lib", task="t.count", lock_key=f"k{i}", args={"i": i}, idempotency_key=key)


@pytest.fixture
def settings(db_dsn: str) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        db_dsn=db_dsn,
        workers=[{"queue": "lib", "concurrency": 5}],
        auto_migrate=False,
        poll_interval_sec=300,
    )


async def test_enqueue_many_keeps_input_order_and_idempotency(
    settings: Settings, conn: asyncpg.Connection
) -> None:
    async with Runner(settings, run_workers=False) as dl:
        first = await dl.client.enqueue(job(0, key="same"))
        results = await dl.client.enqueue_many(
            [job(1), job(0, key="same"), job(3, key="new"), job(3, key="new")]
        )
    assert [r.created for r in results] == [True, False, True, False]
    assert results[1].job_id == first.job_id
    assert results[3].job_id == results[2].job_id
    rows = await conn.fetch("SELECT args->>'i' AS i FROM dl_jobs ORDER BY created_at, args->>'i'")
    assert sorted(r["i"] for r in rows) == ["0", "1", "3"]
    queued = await conn.fetchval("SELECT count(*) FROM dl_job_events WHERE kind = 'queued'")
    assert queued == 3


async def test_enqueue_joins_the_callers_transaction(settings: Settings, db_dsn: str) -> None:
    conn = await db.connect(db_dsn, "test")
    try:
        async with conn.transaction():
            await enqueue(conn, job(1))
        assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 1
        transaction = conn.transaction()
        await transaction.start()
        await enqueue(conn, job(2))
        await transaction.rollback()
        assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 1  # rolled back with it
    finally:
        await conn.close()


async def test_run_until_empty_drains_every_ready_job(
    settings: Settings, conn: asyncpg.Connection
) -> None:
    seen: list[int] = []
    registry = TaskRegistry()

    @registry.register("t.count")
    async def count(ctx: JobContext[dict[str, Any]]) -> None:
        seen.append(ctx.args["i"])

    async with Runner(settings, run_workers=False) as dl:
        await dl.client.enqueue_many([job(i) for i in range(300)])
    async with Runner(settings, registry) as dl:
        await dl.run_until_empty()
    assert sorted(seen) == list(range(300))
    # the batched completions were all written before the runner stopped
    done = await conn.fetchval("SELECT count(*) FROM dl_jobs WHERE status = 'succeeded'")
    events = await conn.fetchval("SELECT count(*) FROM dl_job_events WHERE kind = 'done'")
    assert (done, events) == (300, 300)
    locks = await conn.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    assert locks == 0


async def test_run_until_empty_needs_workers(settings: Settings) -> None:
    async with Runner(settings, run_workers=False) as dl:
        with pytest.raises(RuntimeError, match="needs the workers"):
            await dl.run_until_empty()


async def test_enqueue_works_on_a_plain_asyncpg_connection(db_dsn: str) -> None:
    """The README's snippet on a connection without dataloader's json codec: args go as JSON
    text, not as a Python dict the connection does not know how to send."""
    conn = await asyncpg.connect(db_dsn)
    try:
        async with conn.transaction():
            result = await enqueue(conn, job(1, key="plain"))
        again = await enqueue(conn, job(1, key="plain"))
        stored = await conn.fetchval(
            "SELECT args::text FROM dl_jobs WHERE job_id = $1", result.job_id
        )
    finally:
        await conn.close()
    assert result.created
    assert (again.job_id, again.created) == (result.job_id, False)
    assert stored == '{"i": 1}'


async def test_enqueue_with_a_known_key_and_other_fields_raises_a_conflict(db_dsn: str) -> None:
    conn = await asyncpg.connect(db_dsn)
    try:
        first = await enqueue(conn, job(1, key="day-1"))
        with pytest.raises(IdempotencyConflict) as info:
            await enqueue(conn, job(2, key="day-1"))
        assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 1
    finally:
        await conn.close()
    conflict = info.value
    assert (conflict.idempotency_key, conflict.job_id) == ("day-1", first.job_id)
    assert conflict.fields == ("args", "lock_key")
    assert str(first.job_id) in str(conflict)


@pytest.mark.parametrize("in_callers_transaction", [False, True])
async def test_a_conflict_in_enqueue_many_writes_nothing_of_the_batch(
    db_dsn: str, in_callers_transaction: bool
) -> None:
    conn = await asyncpg.connect(db_dsn)
    try:
        await enqueue(conn, job(1, key="day-1"))
        transaction = conn.transaction()
        if in_callers_transaction:
            await transaction.start()
            await enqueue(conn, job(2))  # the caller's own write, before the batch
        batch = [job(3), job(4, key="day-4"), job(5, key="day-1"), job(6)]
        with pytest.raises(IdempotencyConflict, match="day-1"):
            await enqueue_many(conn, batch)
        if in_callers_transaction:
            await transaction.commit()  # the batch's savepoint is gone, the caller's work stays
        args = await conn.fetch("SELECT args->>'i' AS i FROM dl_jobs ORDER BY 1")
        events = await conn.fetchval("SELECT count(*) FROM dl_job_events")
    finally:
        await conn.close()
    expected = ["1", "2"] if in_callers_transaction else ["1"]
    assert [r["i"] for r in args] == expected
    assert events == len(expected)
