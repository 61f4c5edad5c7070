"""`dataloader.testing.run_task` against the real worker: both run a task through the same
executor, so the edge cases of a run (its timeout, a result it cannot store, an error its task
declares final) end the same way inline as on a worker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dataloader import testing
from dataloader.base import JobStatus
from dataloader.workers.job_context import JobContext
from dataloader.workers.pipelines.registry import TaskRegistry

from .conftest import StartService

QUEUE = "inline"


class Refused(Exception):
    """An error the task declares final (`non_retryable`)."""


def declare(registry: TaskRegistry) -> None:
    """The edge cases, as tasks of `registry`."""

    @registry.task("inline.slow", queue=QUEUE, timeout=0.1, max_attempts=1)
    async def slow(ctx: JobContext[dict[str, Any]]) -> None:
        await asyncio.sleep(60)

    @registry.task("inline.huge", queue=QUEUE, max_attempts=3)
    async def huge(ctx: JobContext[dict[str, Any]]) -> str:
        return "x" * 2000  # over the limit of 1024 bytes the service is given

    @registry.task("inline.refused", queue=QUEUE, max_attempts=3, non_retryable=(Refused,))
    async def refused(ctx: JobContext[dict[str, Any]]) -> None:
        raise Refused("the source said no")

    @registry.task("inline.cancelled", queue=QUEUE, max_attempts=2, retry=0)
    async def cancelled(ctx: JobContext[dict[str, Any]]) -> None:
        raise asyncio.CancelledError  # the task's own cancellation: a failure, retried


@pytest.mark.parametrize(
    ("task", "status", "error"),
    [
        (
            "inline.slow",
            JobStatus.FAILED,
            "TaskTimeout: the task ran longer than its timeout of 0.1s",
        ),
        (
            "inline.huge",
            JobStatus.FAILED,
            "result: the result is 2002 bytes of JSON, more than DL_MAX_RESULT_BYTES (1024)",
        ),
        ("inline.refused", JobStatus.FAILED, "Refused: the source said no"),
        ("inline.cancelled", JobStatus.QUEUED, "task was cancelled"),
    ],
)
async def test_a_task_ends_inline_as_it_ends_on_a_worker(
    start_service: StartService,
    registry: TaskRegistry,
    task: str,
    status: JobStatus,
    error: str,
) -> None:
    declare(registry)
    service = await start_service(
        workers=[{"queue": QUEUE, "concurrency": 2}], max_result_bytes=1024
    )
    job = await service.dl.enqueue(task, lock_key="k")
    known = registry.get(task)
    assert known is not None
    assert known.max_attempts is not None
    inline = await testing.run_task(
        task, registry=registry, settings=service.settings, max_attempts=known.max_attempts
    )
    assert (inline.status, inline.error) == (status, error)

    ended = await service.dl.wait(job.job_id, timeout=30)
    if status is JobStatus.QUEUED:  # retried: the worker's first attempt ended so
        events = await service.dl.events(job.job_id)
        requeued = [e.payload for e in events if e.kind == "requeue"]
        assert [p["error"] for p in requeued if p] == [error]
        assert (ended.status, ended.attempt, ended.error) == (JobStatus.FAILED, 2, error)
    else:
        assert (ended.status, ended.attempt, ended.error) == (status, 1, error)
