"""Per-queue statistics (`Client.stats`, `GET /api/v1/queues`): what each queue holds, read
from the jobs in those states only, never from the finished ones."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import asyncpg

from dataloader import NonRetryableError, QueueStats
from dataloader.storage import queries
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext

from .conftest import StartService
from .helpers import wait_until
from .test_lock_keys import gated


async def test_each_state_is_counted_in_its_queue(
    start_service: StartService, registry: TaskRegistry
) -> None:
    gate = gated(registry, "t.gated")

    @registry.register("t.broken")
    async def broken(ctx: JobContext[dict[str, Any]]) -> None:
        raise NonRetryableError("bad input")

    service = await start_service(workers=[{"queue": "busy", "concurrency": 2}])
    dl = service.dl
    for i in range(3):  # a queue no process serves: its jobs stay ready
        await dl.enqueue("t.gated", lock_key=f"idle-{i}", queue="idle")
    await dl.enqueue("t.gated", lock_key="later", queue="idle", available_at=timedelta(hours=1))
    failed = await dl.enqueue("t.broken", lock_key="broken", queue="busy")
    assert (await dl.wait(failed.job_id, timeout=30)).status == "failed"
    for _ in range(3):  # one runs, held by the gate; the two others wait for its lock_key
        await dl.enqueue("t.gated", lock_key="serial", queue="busy")

    async def busy_settled() -> QueueStats | None:
        stats = (await dl.stats())["busy"]
        return stats if (stats.running, stats.waiting) == (1, 2) else None

    busy = await wait_until(busy_settled, what="one job running and two waiting")
    assert (busy.ready, busy.delayed, busy.failed, busy.lost, busy.total) == (0, 0, 1, 0, 3)
    assert busy.oldest_ready_age_sec is not None  # the waiting jobs are due
    idle = (await dl.stats("idle"))["idle"]
    assert (idle.ready, idle.waiting, idle.delayed, idle.running, idle.total) == (3, 0, 1, 0, 4)
    assert idle.oldest_ready_age_sec is not None
    assert 0 <= idle.oldest_ready_age_sec < 60

    response = await service.client.get("/api/v1/queues")
    assert response.status_code == 200
    assert [q["queue"] for q in response.json()["queues"]] == ["busy", "idle"]
    one = (await service.client.get("/api/v1/queues/idle")).json()
    assert {k: one[k] for k in ("total", "ready", "waiting", "delayed", "running")} == {
        "total": 4,
        "ready": 3,
        "waiting": 0,
        "delayed": 1,
        "running": 0,
    }
    gate.set()


async def test_a_queue_that_holds_nothing_has_zeros_and_bad_names_are_refused(
    start_service: StartService,
) -> None:
    service = await start_service(run_workers=False)
    assert await service.dl.stats() == {}
    empty = (await service.dl.stats("empty"))["empty"]
    assert replace(empty, throughput=()) == QueueStats("empty", 0, 0, 0, 0, 0, 0, None)
    assert [t.per_minute for t in empty.throughput] == [0, 0, 0]
    body = (await service.client.get("/api/v1/queues/empty")).json()
    assert (body["total"], body["oldest_ready_age_sec"]) == (0, None)
    too_long = await service.client.get("/api/v1/queues/" + "q" * 1000)
    assert too_long.status_code == 422
    await service.dl.enqueue("t", lock_key="k", queue="etl/daily")
    assert (await service.client.get("/api/v1/queues/etl/daily")).json()["ready"] == 1


async def test_the_oldest_due_job_gives_the_age(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """Written by another program, due ten minutes ago and not claimed since."""
    service = await start_service(run_workers=False)
    await conn.execute(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, available_at) VALUES"
        " (gen_random_uuid(), 'late', 't', 'k', now() - interval '10 minutes')"
    )
    age = (await service.dl.stats("late"))["late"].oldest_ready_age_sec
    assert age is not None
    assert 600 <= age < 660


async def test_infinite_and_future_instants_give_no_age(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """Rows another program wrote with `infinity`, `-infinity` or a future instant: none is a
    due job with an age, and none makes the statistics fail."""
    service = await start_service(run_workers=False)
    await conn.execute(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, available_at) VALUES"
        " (gen_random_uuid(), 'odd', 't', 'a', 'infinity'),"
        " (gen_random_uuid(), 'odd', 't', 'b', '-infinity'),"
        " (gen_random_uuid(), 'odd', 't', 'c', now() + interval '1 hour')"
    )
    stats = (await service.dl.stats("odd"))["odd"]
    assert stats.oldest_ready_age_sec is None
    assert stats.total == 3


async def test_finished_jobs_are_not_read(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """20,000 finished jobs beside a few queued ones: the statement reads no row of the
    table in order (no sequential scan), and the finished jobs count nowhere."""
    service = await start_service(run_workers=False)
    await conn.execute(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, attempt, finished_at)"
        " SELECT gen_random_uuid(), 'q', 't', 'done-' || i, 'succeeded', 1, now()"
        " FROM generate_series(1, 20000) AS i"
    )
    for i in range(5):
        await service.dl.enqueue("t", lock_key=f"k-{i}", queue="q")
    await conn.execute("ANALYZE dl_jobs")
    stats = (await service.dl.stats())["q"]
    assert (stats.total, stats.ready) == (5, 5)
    plan = "\n".join(row[0] for row in await conn.fetch("EXPLAIN " + queries.QUEUE_STATS.sql, None))
    assert "Seq Scan on dl_jobs" not in plan, plan
