"""Demo pipelines used by the README and the tests (always registered)."""

from __future__ import annotations

import asyncio
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from dataloader.workers.job_context import JobContext
from dataloader.workers.pipelines.registry import pipeline


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="allow")


class SleepArgs(BaseModel):
    """`demo.sleep`: sleep `seconds` in `chunks` equal parts."""

    seconds: Annotated[float, Field(ge=0, le=86_400, allow_inf_nan=False)]
    chunks: Annotated[int, Field(ge=1, le=100_000)] = 10


class FailArgs(BaseModel):
    """`demo.fail`: raise on the first `fail_times` attempts, then succeed."""

    fail_times: Annotated[int, Field(ge=0, le=1_000_000)]


class DemoFailure(RuntimeError):
    """The error `demo.fail` raises on purpose."""


@pipeline("demo.noop", args=NoArgs)
async def noop(ctx: JobContext[NoArgs]) -> None:
    """Return at once."""


@pipeline("demo.sleep", args=SleepArgs)
async def sleep(ctx: JobContext[SleepArgs]) -> None:
    """Sleep in chunks, writing progress {done, total} after each; stops on cancel between."""
    step = ctx.args.seconds / ctx.args.chunks
    async for _ in ctx.iterate(range(ctx.args.chunks)):
        await asyncio.sleep(step)


@pipeline("demo.fail", args=FailArgs)
async def fail(ctx: JobContext[FailArgs]) -> None:
    """Fail on purpose until the attempt number passes `fail_times`."""
    if ctx.attempt <= ctx.args.fail_times:
        raise DemoFailure(f"demo.fail: attempt {ctx.attempt} of {ctx.args.fail_times} failing")
