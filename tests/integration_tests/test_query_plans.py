"""Plans that stale statistics cannot spoil.

The trap: statistics taken while no job ran make the spec's `ix_dl_jobs_status_queue` look as
cheap for `status = 'running'` as the right index, and reading it means reading every running
job. Here statistics are taken with nothing running, then thousands of jobs start (autovacuum
off, so nothing re-analyzes): each worker statement must still find its rows by the index
meant for it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dataloader.storage import db, queries

RUNNING = 3000

#: Statements that find their rows by primary key, with arguments of the right types.
BY_PRIMARY_KEY: dict[str, tuple[str, tuple[Any, ...]]] = {
    "backoff": (queries.BACKOFF_JOB, (uuid.uuid4(), uuid.uuid4(), 1.0, "w")),
    "heartbeat": (queries.HEARTBEAT_JOBS, ([uuid.uuid4()], [uuid.uuid4()], [True], "w")),
    "set_progress": (queries.SET_PROGRESS, (uuid.uuid4(), uuid.uuid4(), "{}")),
    "complete": (queries.COMPLETE_JOBS, ([uuid.uuid4()], [uuid.uuid4()], "w")),
    "fail": (queries.FAIL_JOB, (uuid.uuid4(), uuid.uuid4(), "boom", True, 1.0, "w")),
    "cancel_running": (queries.CANCEL_RUNNING_JOB, (uuid.uuid4(), uuid.uuid4(), "w")),
    "release": (queries.RELEASE_JOB, (uuid.uuid4(), uuid.uuid4(), False, "w", "lost", 3)),
    "cancel": (queries.CANCEL_JOB, (uuid.uuid4(),)),
}


@pytest.fixture
async def stale_conn(db_dsn: str) -> AsyncIterator[db.Connection]:
    """Statistics say nothing runs; in fact `RUNNING` jobs run and 100 are queued."""
    conn = await db.connect(db_dsn, "test-plans")
    await conn.execute("ALTER TABLE dl_jobs SET (autovacuum_enabled = false)")
    await conn.execute(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key) "
        "SELECT gen_random_uuid(), 'q', 't', 'key-' || i FROM generate_series(1, $1::int) i",
        RUNNING + 100,
    )
    await conn.execute("ANALYZE dl_jobs")
    await conn.execute(
        "UPDATE dl_jobs SET status = 'running', attempt = 1 "
        "WHERE job_id IN (SELECT job_id FROM dl_jobs LIMIT $1)",
        RUNNING,
    )
    yield conn
    await conn.close()


async def plan_of(conn: db.Connection, statement: str, *args: Any) -> str:
    """The plan PostgreSQL chooses for `statement` (not executed), as JSON text."""
    return str(await conn.fetchval(f"EXPLAIN (FORMAT JSON) {statement}", *args))


@pytest.mark.parametrize("name", sorted(BY_PRIMARY_KEY))
async def test_writes_by_job_id_use_the_primary_key(stale_conn: db.Connection, name: str) -> None:
    statement, args = BY_PRIMARY_KEY[name]
    plan = await plan_of(stale_conn, statement, *args)
    assert "dl_jobs_pkey" in plan
    assert "ix_dl_jobs_status_queue" not in plan


async def test_claim_probes_running_lock_keys_through_their_own_index(
    stale_conn: db.Connection,
) -> None:
    plan = await plan_of(stale_conn, queries.CLAIM_JOBS, "q", 10, "w", uuid.uuid4())
    assert "ix_dl_jobs_running_lock_hash" in plan
    assert "ix_dl_jobs_status_queue" not in plan
