"""Plain `def` tasks run in a worker thread: the event loop stays free for the process's other
jobs and its liveness; the context's writes work from the thread; cancellation is cooperative,
and a stopped handler keeps its job (slot, lease, lock_key) until it returns."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from dataloader import ThreadContext
from dataloader.config import Settings
from dataloader.runner import Runner
from dataloader.tasks import TaskRegistry
from dataloader.testing import run_task
from dataloader.workers.job_context import JobContext

from .helpers import wait_until


async def test_a_plain_def_task_runs_in_a_thread_with_its_context(
    make_settings: Callable[..., Settings], registry: TaskRegistry
) -> None:
    settings = make_settings(workers=[{"queue": "default", "concurrency": 2}])
    seen: dict[str, Any] = {}

    @registry.task("t.sync", queue="default")
    def load(ctx: ThreadContext[dict[str, Any]]) -> dict[str, int]:
        seen["thread"] = threading.current_thread().name
        rows = 0
        for chunk in ctx.iterate(range(3)):
            time.sleep(0.4)  # a blocking driver call: it holds this thread, not the loop
            rows += chunk
        ctx.checkpoint({"rows": rows})
        ctx.then("t.after", {"rows": rows})
        seen["enqueued"] = ctx.run(ctx.client.enqueue("t.other", queue="elsewhere")).job_id
        return {"rows": rows, "attempt": ctx.attempt}

    @registry.task("t.after", queue="default")
    async def after(ctx: JobContext[dict[str, Any]]) -> None:
        seen["after"] = ctx.args

    async with Runner(settings, registry) as runner:
        job_id = (await runner.client.enqueue("t.sync", lock_key="k")).job_id
        job = await runner.client.wait(job_id, timeout=30)
        assert runner.manager is not None
        await wait_until(lambda: _true("after" in seen), what="the next stage")
        other = await runner.client.get(seen["enqueued"])
        assert runner.manager.watchdog.last_hold is None  # the loop was never held

    assert seen["thread"].startswith("dataloader-task")
    assert (job.status, job.result) == ("succeeded", {"rows": 3, "attempt": 1})
    assert job.progress == {"done": 3, "total": 3}
    assert job.checkpoint == {"rows": 3}
    assert seen["after"] == {"rows": 3}
    assert other.queue == "elsewhere"


async def _true(value: bool) -> bool:
    return value


async def test_a_cancel_stops_a_plain_def_task_at_its_next_check(
    make_settings: Callable[..., Settings], registry: TaskRegistry
) -> None:
    settings = make_settings(workers=[{"queue": "default", "concurrency": 1}])
    started = threading.Event()

    @registry.task("t.sync", queue="default")
    def poll(ctx: ThreadContext[dict[str, Any]]) -> None:
        started.set()
        while True:
            ctx.check_cancelled()
            time.sleep(0.02)

    async with Runner(settings, registry) as runner:
        job_id = (await runner.client.enqueue("t.sync", lock_key="k")).job_id
        await wait_until(lambda: _true(started.is_set()), what="the handler")
        await runner.client.cancel(job_id)
        job = await runner.client.wait(job_id, timeout=30)
    assert job.status == "canceled"


async def test_a_timed_out_plain_def_task_keeps_its_lock_key_until_it_returns(
    make_settings: Callable[..., Settings], registry: TaskRegistry
) -> None:
    """A thread cannot be stopped: past its timeout the handler is asked to stop, and its job
    ends (failed: the timeout) only once it has returned, so the next job of its lock_key
    never overlaps it."""
    settings = make_settings(workers=[{"queue": "default", "concurrency": 2}])
    returned_at: list[float] = []
    next_started_at: list[float] = []
    asked_to_stop: list[bool] = []

    @registry.task("t.slow", queue="default", timeout=0.3, max_attempts=1)
    def slow(ctx: ThreadContext[dict[str, Any]]) -> None:
        time.sleep(1.5)  # ignores its stop meanwhile
        asked_to_stop.append(ctx.cancel_requested or _raises(ctx.check_cancelled))
        returned_at.append(time.monotonic())

    @registry.task("t.next", queue="default")
    async def next_job(ctx: JobContext[dict[str, Any]]) -> None:
        next_started_at.append(time.monotonic())

    async with Runner(settings, registry) as runner:
        first = (await runner.client.enqueue("t.slow", lock_key="k")).job_id
        second = (await runner.client.enqueue("t.next", lock_key="k")).job_id
        first_job = await runner.client.wait(first, timeout=30)
        await runner.client.wait(second, timeout=30)

    assert first_job.status == "failed"
    assert "timeout" in (first_job.error or "")
    assert asked_to_stop == [True]
    assert next_started_at[0] >= returned_at[0]


def _raises(check: Callable[[], None]) -> bool:
    try:
        check()
    except Exception:
        return True
    return False


async def test_a_plain_def_task_runs_inline_in_the_test_helpers() -> None:
    registry = TaskRegistry()

    @registry.task("t.sync")
    def double(ctx: ThreadContext[dict[str, Any]]) -> int:
        ctx.set_progress(done=1)
        return int(ctx.args["n"]) * 2

    run = await run_task("t.sync", {"n": 21}, registry=registry)
    assert (run.status, run.result, run.progress) == ("succeeded", 42, {"done": 1})
