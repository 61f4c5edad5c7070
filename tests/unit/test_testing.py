"""dataloader.testing.run_task: a task run inline, decided by the worker's rules."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from dataloader import (
    Fixed,
    InvalidJobArgs,
    JobContext,
    JobStatus,
    NonRetryableError,
    Retry,
    TaskRegistry,
)
from dataloader.testing import run_task


class ReportArgs(BaseModel):
    region: str


registry = TaskRegistry()


@registry.task("reports.build", queue="reports", args=ReportArgs)
async def build(ctx: JobContext[ReportArgs]) -> dict[str, Any]:
    resumed_from = ctx.resume_from
    async for _ in ctx.iterate(range(3)):
        pass
    await ctx.checkpoint({"page": 3})
    return {"region": ctx.args.region, "resumed_from": resumed_from, "db": ctx.resources}


@registry.task("reports.flaky", retry=Fixed(7))
async def flaky(ctx: JobContext[dict[str, Any]]) -> None:
    raise ConnectionError("upstream down")


@registry.task("reports.later")
async def later(ctx: JobContext[dict[str, Any]]) -> None:
    raise Retry(after=42, reason="not published yet")


@registry.task("reports.bad")
async def bad(ctx: JobContext[dict[str, Any]]) -> None:
    raise NonRetryableError("bad file")


@registry.task("reports.slow", timeout=0.05)
async def slow(ctx: JobContext[dict[str, Any]]) -> None:
    await asyncio.sleep(60)


@registry.task("reports.careful")
async def careful(ctx: JobContext[dict[str, Any]]) -> str:
    await ctx.set_progress(step="start")
    ctx.check_cancelled()
    return "done"


@registry.task("reports.unstorable")
async def unstorable(ctx: JobContext[dict[str, Any]]) -> object:
    return object()


async def test_a_success_keeps_its_result_progress_and_checkpoints() -> None:
    run = await run_task(
        "reports.build",
        ReportArgs(region="eu"),
        registry=registry,
        resources="fake-db",
        resume_from={"page": 1},
    )
    assert run.status is JobStatus.SUCCEEDED
    assert run.result == {"region": "eu", "resumed_from": {"page": 1}, "db": "fake-db"}
    assert run.progress == {"done": 3, "total": 3}
    assert run.checkpoints == [{"page": 3}]
    assert run.error is None


async def test_args_that_break_the_model_are_refused_as_enqueue_would() -> None:
    with pytest.raises(InvalidJobArgs, match=r"args\.region"):
        await run_task("reports.build", {"region": 5}, registry=registry)


@pytest.mark.parametrize(
    ("task", "attempt", "status", "retry_in_sec", "error"),
    [
        ("reports.flaky", 1, JobStatus.QUEUED, 7.0, "ConnectionError: upstream down"),
        ("reports.flaky", 3, JobStatus.FAILED, None, "ConnectionError: upstream down"),
        ("reports.later", 1, JobStatus.QUEUED, 42.0, "Retry: not published yet"),
        ("reports.bad", 1, JobStatus.FAILED, None, "NonRetryableError: bad file"),
        ("reports.slow", 3, JobStatus.FAILED, None, "TaskTimeout: the task ran longer"),
        ("reports.unstorable", 1, JobStatus.FAILED, None, "result: "),
    ],
)
async def test_each_ending_is_decided_as_a_worker_would(
    task: str, attempt: int, status: JobStatus, retry_in_sec: float | None, error: str
) -> None:
    run = await run_task(task, registry=registry, attempt=attempt, max_attempts=3)
    assert (run.status, run.retry_in_sec) == (status, retry_in_sec)
    assert run.error is not None
    assert run.error.startswith(error)


async def test_a_cancel_request_is_seen_at_the_task_s_next_check() -> None:
    run = await run_task("reports.careful", registry=registry, cancel=True)
    assert run.status is JobStatus.CANCELED
    assert run.progress == {"step": "start"}
    assert (await run_task("reports.careful", registry=registry)).result == "done"


async def test_what_needs_a_database_says_so() -> None:
    local = TaskRegistry()

    @local.task("uses.client")
    async def uses_client(ctx: JobContext[dict[str, Any]]) -> None:
        await ctx.client.enqueue("x", lock_key="k")

    run = await run_task("uses.client", registry=local, max_attempts=1)
    assert run.status is JobStatus.FAILED
    assert run.error == "RuntimeError: ctx.client is not available in run_task (no database)"
