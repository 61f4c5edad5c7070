"""Slots shared by several queues (`{"queues": [...], "concurrency": N, "batch_size": {...}}`
in WORKERS_JSON): each slot serves the queues in turn, a cycle of up to `batch_size` jobs per
queue, on a real database."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from dataloader import Batch, JobStatus
from dataloader.tasks import TaskRegistry
from dataloader.workers.claims import Claimed
from dataloader.workers.job_context import JobContext
from dataloader.workers.processors import SharedSlots

from .conftest import Service, StartService
from .test_batches import assert_handed_back, scrape


async def enqueue(service: Service, queue: str, n: int, task: str = "s.record") -> list[uuid.UUID]:
    jobs = [service.dl.job(task, {"n": i}, lock_key=f"{queue}-{i}", queue=queue) for i in range(n)]
    return [r.job_id for r in await service.dl.enqueue_many(jobs)]


def recording(registry: TaskRegistry, seen: list[str]) -> None:
    @registry.task("s.record")
    async def record(ctx: JobContext[dict[str, Any]]) -> None:
        seen.append(ctx.job.queue)
        await asyncio.sleep(0)


async def test_one_slot_serves_each_queue_in_turn_a_batch_at_a_time(
    start_service: StartService, registry: TaskRegistry
) -> None:
    seen: list[str] = []
    recording(registry, seen)
    producer = await start_service(run_workers=False)
    jobs = await enqueue(producer, "a", 6) + await enqueue(producer, "b", 4)
    service = await start_service(
        workers=[{"queues": ["a", "b"], "concurrency": 1, "batch_size": {"a": 3, "b": 2}}]
    )
    states = [await service.dl.wait(j, timeout=30) for j in jobs]
    assert {s.status for s in states} == {JobStatus.SUCCEEDED}
    assert "".join(seen) == "aaabbaaabb"


async def test_a_queue_with_little_work_is_served_beside_a_big_backlog(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    seen: list[str] = []
    recording(registry, seen)
    producer = await start_service(run_workers=False)
    await enqueue(producer, "big", 300)
    small = await enqueue(producer, "small", 3)
    service = await start_service(workers=[{"queues": ["big", "small"], "concurrency": 2}])
    for job_id in small:
        await service.dl.wait(job_id, timeout=30)
    assert seen.count("small") == 3
    assert seen.count("big") < 300
    assert seen.index("small") < 10  # in the first round, not after the backlog


async def test_the_slots_bound_the_jobs_running_at_once(
    start_service: StartService, registry: TaskRegistry
) -> None:
    running = 0
    most = 0

    @registry.task("s.busy")
    async def busy(ctx: JobContext[dict[str, Any]]) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1

    producer = await start_service(run_workers=False)
    jobs = []
    for queue in ("x", "y", "z"):
        jobs += await enqueue(producer, queue, 10, task="s.busy")
    service = await start_service(
        workers=[{"queues": ["x", "y", "z"], "concurrency": 2, "batch_size": {"x": 4, "y": 4}}]
    )
    states = [await service.dl.wait(j, timeout=30) for j in jobs]
    assert {s.status for s in states} == {JobStatus.SUCCEEDED}
    assert most == 2


async def test_a_batched_task_takes_its_batch_size_in_one_call(
    start_service: StartService, registry: TaskRegistry
) -> None:
    sizes: list[int] = []

    @registry.task("s.many", queue="m", batch_size=5)
    async def many(batch: Batch[dict[str, Any]]) -> None:
        sizes.append(len(batch))
        for item in batch:
            batch.done(item)

    producer = await start_service(run_workers=False)
    jobs = await enqueue(producer, "m", 12, task="s.many")
    service = await start_service(workers=[{"queues": ["m", "other"], "concurrency": 1}])
    for job_id in jobs:
        await service.dl.wait(job_id, timeout=30)
    assert sizes == [5, 5, 2]


async def test_delayed_jobs_and_new_jobs_wake_the_slots(
    start_service: StartService, registry: TaskRegistry
) -> None:
    seen: list[str] = []
    recording(registry, seen)
    service = await start_service(workers=[{"queues": ["p", "q"], "concurrency": 2}])
    await service.manager.wait_idle()
    later = await service.dl.enqueue(
        "s.record", {}, lock_key="later", queue="q", available_at=timedelta(seconds=1)
    )
    now = await service.dl.enqueue("s.record", {}, lock_key="now", queue="p")
    assert (await service.dl.wait(now.job_id, timeout=30)).status == JobStatus.SUCCEEDED
    assert (await service.dl.wait(later.job_id, timeout=30)).status == JobStatus.SUCCEEDED
    await service.manager.wait_idle()  # and idle again once both have run
    assert sorted(seen) == ["p", "q"]


async def test_a_stop_hands_back_the_cycles_jobs_not_started(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    started: list[int] = []
    first_started = asyncio.Event()

    @registry.task("s.block")
    async def block(ctx: JobContext[dict[str, Any]]) -> None:
        started.append(ctx.args["n"])
        first_started.set()
        await asyncio.sleep(3600)

    producer = await start_service(run_workers=False)
    jobs = await enqueue(producer, "c", 3, task="s.block")
    service = await start_service(
        workers=[{"queues": ["c"], "concurrency": 1, "batch_size": {"c": 3}}]
    )
    await asyncio.wait_for(first_started.wait(), 30)
    await service.manager.stop(timeout=0.2)
    await assert_handed_back(conn, jobs)
    assert len(started) == 1


async def test_status_metrics_and_presence_show_the_shared_slots(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    seen: list[str] = []
    recording(registry, seen)
    service = await start_service(
        workers=[{"queues": ["e", "f"], "concurrency": 3}, {"queue": "g", "concurrency": 1}]
    )
    job = await service.dl.enqueue("s.record", {}, lock_key="k", queue="f")
    await service.dl.wait(job.job_id, timeout=30)
    status = (await service.client.get("/status")).json()
    assert status["workers"] == [
        {"queue": "e", "concurrency": 3, "busy": 0, "shared": True},
        {"queue": "f", "concurrency": 3, "busy": 0, "shared": True},
        {"queue": "g", "concurrency": 1, "busy": 0, "shared": False},
    ]
    mine = [w for w in status["live_workers"] if w["worker_id"] == service.manager.worker_id]
    assert mine[0]["queues"] == {"e": 3, "f": 3, "g": 1}
    samples = await scrape(service.client)
    assert samples[("queue_job_processor_cycle_duration_seconds_count", (("queue", "f"),))] >= 1
    assert samples[("queue_running_job_processors", ())] >= 4


async def test_a_job_made_ready_while_a_round_runs_keeps_the_slots_from_idling(
    start_service: StartService, registry: TaskRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a queue's own slots: a round that found every queue empty, but was woken while it
    ran (a job enqueued after its last claim's read), does not make the slots idle. The job
    arrives during the first round that starts after `wait_idle` wakes the slots, right
    after that round's claim of its last queue."""
    seen: list[str] = []
    recording(registry, seen)
    service = await start_service(workers=[{"queues": ["p", "q"], "concurrency": 1}])
    await service.manager.wait_idle()
    (slots,) = service.manager.workers
    assert isinstance(slots, SharedSlots)
    woken = False  # wait_idle woke the slots
    round_after_wake: list[str] = []  # the queues claimed since then, in order
    enqueued: list[uuid.UUID] = []
    real_wake = slots.wake

    def wake() -> None:
        nonlocal woken
        woken = True
        real_wake()

    def claim_of(queue: str) -> Callable[..., Awaitable[Claimed]]:
        real_claim = slots._claims[queue].claim

        async def claim(*args: Any, **kwargs: Any) -> Claimed:
            started_after_wake = woken
            claimed = await real_claim(*args, **kwargs)
            if started_after_wake and not enqueued:
                round_after_wake.append(queue)
                if len(round_after_wake) == 2:  # the whole round found its queues empty
                    job = await service.dl.enqueue("s.record", {}, queue=queue)
                    enqueued.append(job.job_id)
                    real_wake()
            return claimed

        return claim

    monkeypatch.setattr(slots, "wake", wake)
    for queue in ("p", "q"):
        monkeypatch.setattr(slots._claims[queue], "claim", claim_of(queue))
    await service.manager.wait_idle()
    assert enqueued
    assert seen == round_after_wake[-1:]  # it ran before the slots said they were idle
