"""Test helpers: run a task inline, without a database or workers, and see what a worker would
make of it.

    from dataloader.testing import run_task

    async def test_build_report() -> None:
        run = await run_task("reports.build", {"region": "eu"})
        assert run.status == "succeeded"
        assert run.result == {"region": "eu", "rows": 200}

The task runs as a worker runs it: its args are checked and parsed by its model, its timeout
applies, `ctx.set_progress`, `ctx.checkpoint` and `ctx.iterate` work (their writes are kept in
the returned `TaskRun`), and how it ended is decided by the same rules: a success stores its
JSON result, an exception is retried after the task's retry policy's delay unless it is
non-retryable or the attempts are spent, `ctx.check_cancelled()` after `cancel=True` cancels.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from dataloader.base import JobStatus
from dataloader.config import Settings
from dataloader.core import limits
from dataloader.core.retry import Linear
from dataloader.core.transitions import Ended, Outcome, after_attempt
from dataloader.exceptions import InvalidJobArgs
from dataloader.storage.protocol import ClaimedJob
from dataloader.workers.base import outcome_of, within_timeout
from dataloader.workers.job_context import JobContext
from dataloader.workers.pipelines.registry import Task, TaskRegistry
from dataloader.workers.pipelines.registry import registry as default_registry
from dataloader.workers.runtime import RunningJob

if TYPE_CHECKING:
    from dataloader.context import AppContext


@dataclass
class TaskRun:
    """What one inline run of a task did, and where a worker would send its job next."""

    #: `succeeded`, `queued` (to be retried after `retry_in_sec`), `failed` or `canceled`.
    status: JobStatus
    #: The stored result (its JSON, read back) when it succeeded.
    result: Any = None
    #: `Type: message` of what ended the attempt, when it did not succeed.
    error: str | None = None
    #: Seconds before the next attempt, when the job would be retried.
    retry_in_sec: float | None = None
    #: The last progress the task wrote (`ctx.set_progress`, `ctx.iterate`).
    progress: dict[str, Any] = field(default_factory=dict)
    #: Every checkpoint the task saved, in order (as JSON read back).
    checkpoints: list[Any] = field(default_factory=list)
    duration_ms: int = 0


class _Row:
    """The job's row as the task's writes see it: progress and checkpoints kept here."""

    def __init__(self, run: TaskRun, cancel: bool) -> None:
        self._run = run
        self._cancel = cancel

    async def set_progress(self, job_id: uuid.UUID, token: uuid.UUID, value: str) -> bool:
        self._run.progress = json.loads(value)
        return self._cancel

    async def set_checkpoint(self, job_id: uuid.UUID, token: uuid.UUID, value: str | None) -> bool:
        self._run.checkpoints.append(None if value is None else json.loads(value))
        return self._cancel


class _InlineApp:
    """What a task may reach of its process: settings and `resources` (given), nothing that
    needs a database."""

    def __init__(self, settings: Settings, resources: Any) -> None:
        self.settings = settings
        self.resources = resources

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"ctx.{name} is not available in run_task (no database)")


async def run_task(
    task: str | Task,
    args: Any = None,
    *,
    registry: TaskRegistry | None = None,
    attempt: int = 1,
    max_attempts: int = 3,
    resume_from: Any = None,
    cancel: bool = False,
    resources: Any = None,
    settings: Settings | None = None,
) -> TaskRun:
    """Run `task` (a name in `registry`, by default the module-level one, or a `Task`) once,
    inline, as attempt `attempt` of `max_attempts`, with `args` (a dict or the task's model;
    InvalidJobArgs if they break it, as enqueue would say). `resume_from` is the checkpoint an
    earlier attempt saved; `cancel` asks the job to stop (the task sees it at its next
    check); `resources` is what `ctx.resources` gives."""
    found = _task(task, registry)
    if args is None:
        values: dict[str, Any] = {}
    elif hasattr(args, "model_dump"):
        values = args.model_dump(mode="json")
    else:
        values = dict(args)
    found.check_args(values)
    job = ClaimedJob(
        job_id=uuid.uuid4(),
        queue=found.queue or "test",
        task=found.name,
        args=json.loads(limits.args_json(values)),
        lock_key="test",
        lock_hash=0,
        partition_key="",
        priority=found.priority or 100,
        attempt=attempt,
        max_attempts=max_attempts,
        lease_ttl_sec=found.lease_ttl_sec or 300,
        cancel_requested=cancel,
        claim_seq=attempt,
        claim_token=uuid.uuid4(),
        checkpoint=resume_from,
    )
    settings = settings if settings is not None else Settings(_env_file=None)
    run = TaskRun(status=JobStatus.RUNNING)
    running = RunningJob(job)
    ctx: JobContext[Any] = JobContext(
        job,
        found.parse_args(job.args),
        app=cast("AppContext", _InlineApp(settings, resources)),
        state=running.state,
        protocol=cast(Any, _Row(run, cancel)),
    )
    coro = found.handler(ctx)
    started = time.monotonic()
    pipeline: asyncio.Task[object] = asyncio.create_task(
        coro if found.timeout_sec is None else within_timeout(coro, found.timeout_sec)
    )
    running.attach(pipeline)
    await asyncio.wait([pipeline])
    run.duration_ms = round((time.monotonic() - started) * 1000)
    outcome = outcome_of(running, found, run.duration_ms, settings.max_result_bytes)
    return _decided(run, outcome, job, found, settings)


def _task(task: str | Task, registry: TaskRegistry | None) -> Task:
    if isinstance(task, Task):
        return task
    found = (registry if registry is not None else default_registry).get(task)
    if found is None:
        raise InvalidJobArgs(f"no task registered as {task!r}")
    return found


def _decided(
    run: TaskRun, outcome: Outcome, job: ClaimedJob, task: Task, settings: Settings
) -> TaskRun:
    """Fill `run` with where the job goes after `outcome`, by the worker's rules."""
    default_retry = Linear(settings.retry_base_sec)
    policy = task.retry if task.retry is not None else default_retry
    transition = after_attempt(outcome, job.facts(), policy, fallback=default_retry)
    run.status = transition.status
    if outcome.ended is Ended.SUCCEEDED and isinstance(outcome.result, str):
        run.result = json.loads(outcome.result)
    if outcome.ended is not Ended.SUCCEEDED:
        run.error = outcome.error
    if transition.status is JobStatus.QUEUED:
        run.retry_in_sec = transition.retry_in_sec
    return run
