"""Lock keys: no key can stop its queue, a freed key wakes its next job on any replica, and
keys that collide under hashtext wait in turn, visibly."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

import asyncpg
import pytest

from dataloader.storage import migrate
from dataloader.storage.db import connect
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext
from dataloader.workers.locks import LockHolder

from .conftest import StartService
from .helpers import (
    claimed_since_now,
    event_kinds,
    event_payloads,
    lifecycle_kinds,
    pipeline_running,
    wait_until,
)

#: Two distinct lock keys with the same hashtext (a 32-bit hash: among 300,000 keys a pair
#: is all but certain).
COLLIDING_PAIR = """
SELECT array_agg(k ORDER BY k) FROM (SELECT 'c-' || i AS k FROM generate_series(1, 300000) i) t
GROUP BY hashtext(k) HAVING count(*) > 1 LIMIT 1
"""


def random_cjk(chars: int) -> str:
    """Incompressible text, 3 bytes a character in UTF-8 (repeats would compress and hide a
    size limit)."""
    return "".join(chr(random.randint(0x4E00, 0x9FFF)) for _ in range(chars))


def gated(registry: TaskRegistry, task: str) -> asyncio.Event:
    """Register `task`: its runs wait until the returned event is set."""
    gate = asyncio.Event()

    @registry.register(task)
    async def wait_for_gate(ctx: JobContext[dict[str, Any]]) -> None:
        await gate.wait()

    return gate


async def test_a_job_with_a_huge_lock_key_in_the_table_runs_and_blocks_nothing(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """Another service may write a lock_key of any length into the spec's table: 3,000 bytes
    of random characters cannot enter a btree index, so the running-key index holds its hash."""
    huge = random_cjk(1000)
    assert len(huge.encode()) == 3000
    huge_job = await conn.fetchval(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key) VALUES"
        " (gen_random_uuid(), 'default', 'demo.noop', $1) RETURNING job_id::text",
        huge,
    )
    service = await start_service()
    other = await service.trigger(task="demo.noop")
    await service.wait_status(huge_job, "succeeded")
    await service.wait_status(other, "succeeded")


async def test_a_freed_lock_key_wakes_its_next_job_on_a_replica_serving_another_queue(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """Lock keys are global across queues: job B (queue q1) waits for job A (queue q0) of the
    same key, and replica 2, which serves only q1, starts B as soon as A ends, not at its next
    safety poll (five minutes here)."""
    gate = gated(registry, "t.gated")
    first = await start_service(workers=[{"queue": "q0", "concurrency": 2}])
    second = await start_service(workers=[{"queue": "q1", "concurrency": 2}])
    a = await first.trigger(queue="q0", task="t.gated", lock_key="day-load")
    await wait_until(pipeline_running(first.manager, a), what="job A to run")
    b = await second.trigger(queue="q1", task="demo.noop", lock_key="day-load")
    await claimed_since_now(second.manager.queues["q1"])
    assert (await second.status(b))["status"] == "queued"  # skipped while A holds the key
    gate.set()
    ended = time.monotonic()
    await second.wait_status(b, "succeeded", timeout=20)
    assert time.monotonic() - ended < 10  # the safety poll would take 300 s
    assert "backoff" not in await event_kinds(conn, b)


async def test_colliding_lock_keys_wait_in_turn_and_the_collision_is_reported(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """Keys K1 and K2 share their hashtext, so their advisory lock: a job of K2 waits while a
    job of K1 runs, without backing off again and again, and runs before a K1 job queued after
    it (claim order), so a stream of K1 jobs cannot starve K2. The wait is journalled on the
    waiting job and counted by /status."""
    k1, k2 = await conn.fetchval(COLLIDING_PAIR)
    gate = gated(registry, "t.gated")
    service = await start_service(workers=[{"queue": "default", "concurrency": 4}])
    first = await service.trigger(task="t.gated", lock_key=k1)
    await wait_until(pipeline_running(service.manager, first), what="the first K1 job to run")
    waiting = await service.trigger(task="demo.noop", lock_key=k2)
    later = await service.trigger(task="demo.noop", lock_key=k1)
    await claimed_since_now(service.manager.queues["default"])
    assert (await service.status(waiting))["status"] == "queued"
    gate.set()
    k2_done = await service.wait_status(waiting, "succeeded")
    k1_done = await service.wait_status(later, "succeeded")
    assert k2_done["started_at"] <= k1_done["started_at"]
    kinds = await lifecycle_kinds(conn, waiting)
    assert kinds == ["queued", "lock_key_collision", "picked", "done"]
    (collision,) = await event_payloads(conn, waiting, "lock_key_collision")
    assert collision["lock_key"] == k1
    # ...and the later K1 job waited for the K2 job in turn
    assert "lock_key_collision" in await event_kinds(conn, later)
    status = (await service.client.get("/status")).json()
    assert status["lock_key_collisions_last_hour"] == 2


async def test_migrations_never_wait_for_a_lock_key_that_hashes_like_their_lock(
    conn: asyncpg.Connection, db_dsn: str
) -> None:
    """dataloader's own advisory locks live in the two-key space, which jobs' one-key
    `hashtext(lock_key)` locks never reach: a job holding any key cannot block migrations."""
    for key in ("dataloader.migrate", "dataloader-migrate"):
        await conn.execute("SELECT pg_advisory_lock(hashtext($1))", key)
    migrator = await connect(db_dsn, "test-migrate")
    try:
        report = await asyncio.wait_for(migrate.migrate(migrator), timeout=10)
    finally:
        await migrator.close()
    assert report.applied == []


async def test_a_job_the_reaper_ends_wakes_the_next_job_of_its_key_in_the_same_queue(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """A worker that died left job A (key K) running; job B of K waits in the same queue. The
    reaper ends A (`lost`, its last attempt) on a replica that ran neither: B's queue is woken
    by notification, not at the next safety poll (five minutes here)."""
    a = await conn.fetchval(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, attempt, max_attempts,"
        " started_at, lease_expires_at, heartbeat_at) VALUES (gen_random_uuid(), 'default',"
        " 'demo.noop', 'K', 'running', 1, 1, now(), now() + interval '1 hour', now())"
        " RETURNING job_id::text"
    )
    service = await start_service(reaper_period_sec=0.1)
    b = await service.trigger(task="demo.noop", lock_key="K")
    await claimed_since_now(service.manager.queues["default"])
    assert (await service.status(b))["status"] == "queued"  # skipped while A holds K
    await conn.execute(
        "UPDATE dl_jobs SET lease_expires_at = now() - interval '1 second'"
        " WHERE job_id = $1::text::uuid",
        a,
    )  # the dead worker's lease runs out
    await service.wait_status(a, "lost")
    await service.wait_status(b, "succeeded", timeout=10)


async def test_the_audit_leaves_a_lock_whose_release_is_on_its_way(
    db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A job's lock given up while its unlock statement waits for the lock connection is not
    one held for no job: the audit that reads the locks just before that statement runs leaves
    it to the statement."""
    holder = LockHolder(db_dsn, on_lost=lambda reason: None)
    await holder.connect()
    try:
        assert await holder.try_lock([5]) == {5}
        async with holder._mutex:  # the connection busy: both statements below wait their turn
            audit = asyncio.create_task(holder.audit())
            unlock = asyncio.create_task(holder.unlock([5]))
            await asyncio.sleep(0)  # one turn of the loop: each task now waits for the mutex
        await asyncio.gather(audit, unlock)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert await holder.try_lock([5]) == {5}
        await holder.unlock([5])
    finally:
        await holder.close()
