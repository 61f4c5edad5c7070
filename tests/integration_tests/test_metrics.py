"""The jobs' metrics at `/metrics`, scraped and parsed: what was enqueued, started and ended per
queue and task, the wait, run, claim and maintenance histograms, the queue gauges read at each
scrape, and the listener. The process's registry outlives a test, so each test names queues
of its own."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
from prometheus_client import REGISTRY

from dataloader import NonRetryableError
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext

from .conftest import StartService
from .helpers import wait_until
from .test_batches import scrape

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "dataloader.json"
#: A series a dashboard query names.
SERIES = re.compile(r"\b((?:dataloader|queue)_[a-z_]+)\b")


def sample(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_jobs_are_counted_by_queue_task_and_outcome(
    start_service: StartService, registry: TaskRegistry
) -> None:
    queue = f"m-{uuid.uuid4().hex[:8]}"

    @registry.task("t.metered", queue=queue)
    async def metered(ctx: JobContext[dict[str, Any]]) -> None:
        what = ctx.args["do"]
        if what == "fail":
            raise NonRetryableError("no")
        if what == "retry" and ctx.attempt == 1:
            raise RuntimeError("once more")

    service = await start_service(workers=[{"queue": queue, "concurrency": 2}])
    jobs = [
        await service.dl.enqueue("t.metered", {"do": what}, lock_key=f"k{i}")
        for i, what in enumerate(["ok", "ok", "retry", "fail"])
    ]
    for job in jobs:
        await service.dl.wait(job.job_id, timeout=30)
    canceled = await service.dl.enqueue(
        "t.metered", {"do": "ok"}, lock_key="later", available_at=timedelta(hours=1)
    )
    await service.dl.cancel(canceled.job_id)

    samples = await scrape(service.client)
    labels = {"queue": queue, "task": "t.metered"}
    assert sample(samples, "dataloader_jobs_enqueued_total", **labels) == 5
    assert sample(samples, "dataloader_jobs_started_total", **labels) == 5  # a retry is one more
    ended = {
        outcome: sample(samples, "dataloader_jobs_ended_total", **labels, outcome=outcome)
        for outcome in ("succeeded", "failed", "retried", "canceled", "lost")
    }
    # the canceled job never ran, and it ended all the same
    assert ended == {"succeeded": 3, "failed": 1, "retried": 1, "canceled": 1, "lost": 0}
    assert sample(samples, "dataloader_job_wait_seconds_count", queue=queue) == 5
    assert sample(samples, "dataloader_job_duration_seconds_count", **labels) == 5
    assert sample(samples, "dataloader_claim_duration_seconds_count", queue=queue) >= 1
    assert sample(samples, "dataloader_listener_up") == 1


async def test_every_cancel_is_counted_whether_the_job_was_queued_or_running(
    start_service: StartService, registry: TaskRegistry
) -> None:
    queue = f"m-{uuid.uuid4().hex[:8]}"
    started = asyncio.Event()

    @registry.task("t.long", queue=queue)
    async def long(ctx: JobContext[dict[str, Any]]) -> None:
        started.set()
        while True:  # a long task that checks for a cancel between its chunks of work
            ctx.check_cancelled()
            await asyncio.sleep(0.05)

    service = await start_service(workers=[{"queue": queue, "concurrency": 1}])
    running = await service.dl.enqueue("t.long", {}, lock_key="a")
    await asyncio.wait_for(started.wait(), 30)
    queued = await service.dl.enqueue("t.long", {}, lock_key="b")  # the one slot is taken
    for job in (queued, running):
        await service.dl.cancel(job.job_id)
        assert (await service.dl.wait(job.job_id, timeout=30)).status == "canceled"

    samples = await scrape(service.client)
    labels = {"queue": queue, "task": "t.long", "outcome": "canceled"}
    assert sample(samples, "dataloader_jobs_ended_total", **labels) == 2


async def test_lost_jobs_are_counted_by_the_reaper(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    queue = f"m-{uuid.uuid4().hex[:8]}"
    service = await start_service(workers=[{"queue": queue, "concurrency": 1}])
    await conn.execute(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, attempt, max_attempts,"
        " lease_expires_at, started_at) VALUES (gen_random_uuid(), $1, 't.gone', 'k', 'running',"
        " 1, 1, now() - interval '1 minute', now())",
        queue,
    )

    async def counted() -> bool:
        samples = await scrape(service.client)
        labels = {"queue": queue, "task": "t.gone", "outcome": "lost"}
        return sample(samples, "dataloader_jobs_ended_total", **labels) == 1

    await wait_until(counted, what="the lost job counted")
    samples = await scrape(service.client)
    assert sample(samples, "dataloader_maintenance_duration_seconds_count", task="reaper") >= 1


async def test_queue_gauges_are_read_at_each_scrape(start_service: StartService) -> None:
    queue = f"m-{uuid.uuid4().hex[:8]}"
    service = await start_service(run_workers=False)
    for i in range(2):
        await service.dl.enqueue("t.any", queue=queue, lock_key=f"k{i}")
    samples = await scrape(service.client)
    assert sample(samples, "dataloader_queue_ready_jobs", queue=queue) == 2
    assert sample(samples, "dataloader_queue_oldest_ready_age_seconds", queue=queue) >= 0
    await service.dl.cancel((await service.dl.list(queue=queue)).jobs[0].job_id)
    assert sample(await scrape(service.client), "dataloader_queue_ready_jobs", queue=queue) == 1


def test_the_grafana_dashboard_reads_only_metrics_that_exist() -> None:
    """docs/grafana/dataloader.json: every series its queries name is one this process
    exposes (a renamed metric would leave a panel empty)."""
    exposed = {
        sample_name
        for family in REGISTRY.collect()
        for sample_name in (
            family.name,
            f"{family.name}_total",
            f"{family.name}_bucket",
            f"{family.name}_count",
            f"{family.name}_sum",
        )
    }
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    named = {name for expr in exprs for name in SERIES.findall(expr)}
    assert len(named) >= 10
    assert named <= exposed, named - exposed
