"""Jobs without a lock_key (from the library or the CLI): they exclude no other job, take no
advisory lock, and keep every other guarantee (fenced writes, journal, leases)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from dataloader import Client, IdempotencyConflict, JobStatus
from dataloader.storage import protocol
from dataloader.storage.protocol import WorkerProtocol
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext

from .conftest import StartService
from .helpers import lifecycle_kinds, pipeline_running, wait_until

ADVISORY_LOCKS = """
SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database
                                            WHERE datname = current_database())
"""


def gathering(
    registry: TaskRegistry, task: str, expected: int, hold: asyncio.Event | None = None
) -> asyncio.Event:
    """Register `task`: each run waits until `expected` runs have started at once (and then,
    if `hold` is given, until it is set); the returned event is set when they have."""
    started = 0
    all_in = asyncio.Event()

    @registry.task(task, queue="default")
    async def gather(ctx: JobContext[dict[str, Any]]) -> None:
        nonlocal started
        started += 1
        if started >= expected:
            all_in.set()
        await all_in.wait()
        if hold is not None:
            await hold.wait()

    return all_in


def counted(monkeypatch: pytest.MonkeyPatch, name: str) -> list[Callable[..., Awaitable[Any]]]:
    """Count the calls of `protocol.<name>` (the lock holder's statements): one list item
    per call."""
    calls: list[Callable[..., Awaitable[Any]]] = []
    real = getattr(protocol, name)

    async def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(real)
        return await real(*args, **kwargs)

    monkeypatch.setattr(protocol, name, spy)
    return calls


async def test_a_job_without_a_lock_key_is_stored_lock_free_with_an_empty_key(
    client: Client, conn: asyncpg.Connection
) -> None:
    """The spec's lock_key is NOT NULL: the job stores '' there (a key no caller can give) and
    is marked lock_free; readers see no lock_key, and a search by a lock_key finds none."""
    one = await client.enqueue("t.any", {}, queue="q")
    (many,) = await client.enqueue_many([client.job("t.any", queue="q")])
    keyed = await client.enqueue("t.any", {}, queue="q", lock_key="k")
    for job in (one, many):
        row = await conn.fetchrow(
            "SELECT lock_key, lock_free FROM dl_jobs WHERE job_id = $1", job.job_id
        )
        assert (row["lock_key"], row["lock_free"]) == ("", True)
        assert (await client.get(job.job_id)).lock_key is None
    assert not await conn.fetchval("SELECT lock_free FROM dl_jobs WHERE job_id = $1", keyed.job_id)
    assert [job.job_id for job in (await client.list(lock_key="k")).jobs] == [keyed.job_id]


async def test_an_idempotency_key_tells_a_lock_free_job_from_one_with_a_key(
    client: Client,
) -> None:
    first = await client.enqueue("t.any", {}, queue="q", idempotency_key="once")
    again = await client.enqueue("t.any", {}, queue="q", idempotency_key="once")
    assert (again.job_id, again.created) == (first.job_id, False)
    with pytest.raises(IdempotencyConflict) as info:
        await client.enqueue("t.any", {}, queue="q", idempotency_key="once", lock_key="k")
    assert info.value.fields == ("lock_key",)
    keyed = await client.enqueue("t.any", {}, queue="q", idempotency_key="keyed", lock_key="k")
    with pytest.raises(IdempotencyConflict) as info:
        await client.enqueue("t.any", {}, queue="q", idempotency_key="keyed")
    assert info.value.fields == ("lock_key",)
    assert keyed.created


async def test_lock_free_jobs_run_together_without_advisory_locks(
    start_service: StartService,
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four lock_free jobs run at the same time in four slots; while they run no advisory
    lock is held, and the lock connection runs no statement for them, to take or to release
    one. Their journal is every job's."""
    locks_taken = counted(monkeypatch, "try_advisory_locks")
    locks_released = counted(monkeypatch, "advisory_unlock")
    all_in = gathering(registry, "t.gather", 4)
    service = await start_service(workers=[{"queue": "default", "concurrency": 4}])
    jobs = await service.dl.enqueue_many([service.dl.job("t.gather") for _ in range(4)])
    await asyncio.wait_for(all_in.wait(), timeout=20)
    assert await conn.fetchval(ADVISORY_LOCKS) == 0
    for job in jobs:
        await service.dl.wait(job.job_id, timeout=20)
        assert await lifecycle_kinds(conn, str(job.job_id)) == ["queued", "picked", "done"]
    assert (len(locks_taken), len(locks_released)) == (0, 0)
    # a job with a lock_key still takes its lock, and lets it go
    keyed = await service.dl.enqueue("demo.noop", queue="default", lock_key="k")
    assert (await service.dl.wait(keyed.job_id, timeout=20)).status is JobStatus.SUCCEEDED
    assert (len(locks_taken), len(locks_released)) == (1, 1)


async def test_a_lock_free_job_runs_beside_a_job_holding_a_key(
    start_service: StartService, registry: TaskRegistry
) -> None:
    """A job with a lock_key runs; a lock_free job, and a keyed job of another key, run
    beside it, while a job of its own key waits."""
    hold = asyncio.Event()
    all_in = gathering(registry, "t.gather", 3, hold)
    service = await start_service(workers=[{"queue": "default", "concurrency": 4}])
    holder = await service.dl.enqueue("t.gather", lock_key="entity-1")
    await wait_until(pipeline_running(service.manager, str(holder.job_id)), what="the holder")
    same_key = await service.dl.enqueue("demo.noop", queue="default", lock_key="entity-1")
    free = await service.dl.enqueue("t.gather")
    other_key = await service.dl.enqueue("t.gather", lock_key="entity-2")
    await asyncio.wait_for(all_in.wait(), timeout=20)
    assert (await service.dl.get(same_key.job_id)).status is JobStatus.QUEUED
    hold.set()
    for job in (holder, free, other_key, same_key):
        assert (await service.dl.wait(job.job_id, timeout=20)).status is JobStatus.SUCCEEDED


async def test_a_lock_free_job_runs_on_when_the_lock_connection_is_lost(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """Losing the lock connection stops the jobs whose locks went with it, not one that held
    none."""
    release = asyncio.Event()

    @registry.task("t.held", queue="default")
    async def held(ctx: JobContext[dict[str, Any]]) -> None:
        await release.wait()

    service = await start_service(workers=[{"queue": "default", "concurrency": 2}])
    free = await service.dl.enqueue("t.held", max_attempts=1)
    keyed = await service.dl.enqueue("t.held", lock_key="k", max_attempts=1)
    for job in (free, keyed):
        await wait_until(pipeline_running(service.manager, str(job.job_id)), what="the jobs")
    pid = service.manager.runtime.locks.backend_pid
    await conn.execute("SELECT pg_terminate_backend($1)", pid)

    async def keyed_handed_back() -> bool:
        # journalled: the job may be claimed and running again by the time one looks
        return "requeue" in await lifecycle_kinds(conn, str(keyed.job_id))

    await wait_until(keyed_handed_back, what="the keyed job to be handed back")
    assert free.job_id in service.manager.runtime.running
    release.set()
    assert (await service.dl.wait(free.job_id, timeout=20)).status is JobStatus.SUCCEEDED
    assert await lifecycle_kinds(conn, str(free.job_id)) == ["queued", "picked", "done"]


async def test_the_stages_of_a_lock_free_job_are_lock_free(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    @registry.task("t.parent", queue="default", then=("demo.noop",))
    async def parent(ctx: JobContext[dict[str, Any]]) -> dict[str, Any]:
        return {}

    service = await start_service()
    job = await service.dl.enqueue("t.parent")
    await service.dl.wait(job.job_id, timeout=20)

    async def stage_written() -> list[uuid.UUID]:
        return [stage.job_id for stage in await service.dl.stages(job.job_id)]

    (stage,) = await wait_until(stage_written, what="the stage")
    assert await conn.fetchval("SELECT lock_free FROM dl_jobs WHERE job_id = $1", stage)
    assert (await service.dl.wait(stage, timeout=20)).status is JobStatus.SUCCEEDED


async def test_lock_free_jobs_of_a_limited_queue_are_claimed_together(
    start_service: StartService,
) -> None:
    """A queue with limits is claimed by a statement of its own: there too, jobs that share
    no key (the stored '' is none) fill the room the limit leaves in one round."""
    service = await start_service(run_workers=False)
    for _ in range(5):
        await service.dl.enqueue("demo.noop", queue="limited")
    await service.dl.set_limits("limited", max_running=3)
    protocol = WorkerProtocol(service.context.pool)
    first = await protocol.claim_round("limited", 5, "hand", walk=5)
    assert [job.lock_key for job in first.jobs] == [None] * 3
    assert first.held == 2
