"""Test helpers: run a task inline, without a database or workers, and see what a worker would
make of it (`run_task`); a queue in memory with PostgreSQL's semantics (`InMemoryQueue`).

    from dataloader.testing import run_task

    async def test_build_report() -> None:
        run = await run_task("reports.build", {"region": "eu"})
        assert run.status == "succeeded"
        assert run.result == {"region": "eu", "rows": 200}

The task runs as a worker runs it, through the worker's own executor (`workers.executor`):
its args are checked and parsed by its model, its timeout applies, `ctx.set_progress`,
`ctx.checkpoint` and `ctx.iterate` work (their writes are kept in the returned `TaskRun`), and
how it ended is decided by the same rules: a success stores its JSON result, an exception is
retried after the task's retry policy's delay unless it is non-retryable or the attempts are
spent, `ctx.check_cancelled()` after `cancel=True` cancels.

A durable process's processor is tested with `ProcessHarness` (`dataloader.testing_processes`):
its processes in memory, their tasks run by the workers' rules, timers on a clock of its own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from dataloader.base import JobStatus
from dataloader.config import Settings
from dataloader.core import limits
from dataloader.core.models import EnqueueResult, JobState, QueueStats, Stage, new_job_id
from dataloader.core.retry import Linear
from dataloader.core.transitions import (
    Ended,
    JobFacts,
    Keep,
    Outcome,
    Request,
    Transition,
    on_cancel,
    on_expired,
)
from dataloader.exceptions import IdempotencyConflict, InvalidJob, InvalidJobArgs, JobNotFound
from dataloader.storage.protocol import ClaimedJob
from dataloader.tasks import Task, TaskRegistry
from dataloader.tasks import registry as default_registry
from dataloader.testing_processes import ProcessHarness as ProcessHarness  # durable processes
from dataloader.workers.batches import HandlerStats
from dataloader.workers.completer import decide
from dataloader.workers.executor import Executor
from dataloader.workers.runtime import RunningJob
from dataloader.workers.stages import stages_of

if TYPE_CHECKING:
    from dataloader.context import AppContext
    from dataloader.storage.protocol import WorkerProtocol


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
    #: The next stages its success enqueues (the task's `then=`, then `ctx.then`'s), in order;
    #: none when it did not succeed.
    stages: list[Stage] = field(default_factory=list)


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


def _executor(settings: Settings, resources: Any, row: _Row | None) -> Executor:
    """The worker's executor, with what an inline run gives its task: `settings` and
    `resources` (nothing that needs a database), its writes kept in `row` (None for a batch,
    which writes none). A success's next
    stages are named, not built (their checks need the queue's client)."""
    return Executor(
        app=cast("AppContext", _InlineApp(settings, resources)),
        protocol=cast("WorkerProtocol", row),
        max_result_bytes=settings.max_result_bytes,
        build_stages=False,
    )


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
    if found.batched:
        raise TypeError(f"task {found.name!r} takes batches: run it with run_batch")
    job = _inline_job(found, args, attempt, max_attempts, resume_from, cancel)
    settings = settings if settings is not None else Settings(_env_file=None)
    run = TaskRun(status=JobStatus.RUNNING)
    running = RunningJob(job)
    outcome = await _executor(settings, resources, _Row(run, cancel)).execute(found, running)
    run.duration_ms = outcome.duration_ms or 0
    if outcome.ended is Ended.SUCCEEDED:
        run.stages = stages_of(found, running.state.stages, outcome.result)
    return _decided(run, outcome, job, found, settings)


@dataclass
class BatchRun:
    """What one inline call of a batch handler did: each job's run, in the order given, and
    the handler's statistics as the worker counts them."""

    runs: list[TaskRun]
    stats: HandlerStats


async def run_batch(
    task: str | Task,
    args: list[Any],
    *,
    registry: TaskRegistry | None = None,
    attempt: int = 1,
    max_attempts: int = 3,
    resources: Any = None,
    settings: Settings | None = None,
) -> BatchRun:
    """Call a batched task's handler (`batch_size`) once, inline, with one job per element of
    `args` (each a dict or the task's model; InvalidJobArgs if one breaks it), as attempt
    `attempt` of `max_attempts`; each job goes where a worker would send it after the handler's
    settlement, or after none (`left unsettled`, or the handler's exception)."""
    found = _task(task, registry)
    if not found.batched:
        raise TypeError(f"task {found.name!r} takes one job per call: run it with run_task")
    settings = settings if settings is not None else Settings(_env_file=None)
    jobs = [_inline_job(found, values, attempt, max_attempts, None, False) for values in args]
    settled: dict[uuid.UUID, Outcome] = {}
    stats = await _executor(settings, resources, None).execute_batch(
        found,
        [RunningJob(job) for job in jobs],
        lambda job, outcome: settled.__setitem__(job.job_id, outcome),
    )
    runs = []
    for job in jobs:
        outcome = settled[job.job_id]
        run = TaskRun(status=JobStatus.RUNNING, duration_ms=outcome.duration_ms or 0)
        runs.append(_decided(run, outcome, job, found, settings))
    return BatchRun(runs, stats)


def _inline_job(
    task: Task, args: Any, attempt: int, max_attempts: int, resume_from: Any, cancel: bool
) -> ClaimedJob:
    """A claimed job of `task` for an inline run, its args checked as enqueue checks them."""
    if args is None:
        values: dict[str, Any] = {}
    elif hasattr(args, "model_dump"):
        values = args.model_dump(mode="json")
    else:
        values = dict(args)
    task.check_args(values)
    return ClaimedJob(
        job_id=uuid.uuid4(),
        queue=task.queue or "test",
        task=task.name,
        args=json.loads(limits.args_json(values)),
        lock_key="test",
        lock_hash=0,
        partition_key="",
        priority=task.priority or 100,
        attempt=attempt,
        max_attempts=max_attempts,
        lease_ttl_sec=task.lease_ttl_sec or 300,
        cancel_requested=cancel,
        claim_seq=attempt,
        claim_token=uuid.uuid4(),
        checkpoint=resume_from,
    )


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
    transition = decide(outcome, job.facts(), task, Linear(settings.retry_base_sec))
    run.status = transition.status
    if outcome.ended is Ended.SUCCEEDED and isinstance(outcome.result, str):
        run.result = json.loads(outcome.result)
    if outcome.ended is not Ended.SUCCEEDED:
        run.error = outcome.error
    if transition.status is JobStatus.QUEUED:
        run.retry_in_sec = transition.retry_in_sec
    return run


# --- a queue in memory ------------------------------------------------------------------------

#: What the in-memory clock's 0 stands for, in the `JobState`s it gives.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
#: The fields that must match for an idempotency key to name the same job.
_SAME_JOB_FIELDS = ("queue", "task", "args", "lock_key", "priority", "max_attempts")


@dataclass
class _Job:
    """One job's row."""

    job_id: uuid.UUID
    queue: str
    task: str
    args: dict[str, Any]
    lock_key: str | None  # None: it excludes no other job
    idempotency_key: str | None
    priority: int
    max_attempts: int
    lease_ttl_sec: int
    created: int
    created_at: float
    available_at: float
    status: JobStatus = JobStatus.QUEUED
    attempt: int = 0
    handbacks: int = 0
    claim_seq: int = 0
    claim_token: uuid.UUID | None = None
    lease_expires_at: float | None = None
    cancel_requested: bool = False
    rerun_requested: bool = False
    started_at: float | None = None
    attempted_at: float | None = None
    finished_at: float | None = None
    result: Any = None
    error: str | None = None
    worker_id: str | None = None

    def facts(self) -> JobFacts:
        return JobFacts(
            status=self.status,
            attempt=self.attempt,
            max_attempts=self.max_attempts,
            handbacks=self.handbacks,
            cancel_requested=self.cancel_requested,
            rerun_requested=self.rerun_requested,
        )


class InMemoryQueue:
    """A queue in memory, with the semantics of dataloader's PostgreSQL queue for producers
    (enqueue with idempotency keys, priorities, delays; read, cancel, statistics) and for
    workers (claim with a visibility timeout, one running job per lock_key; complete, retry,
    fail, fenced by the claim), decided by the same rules (`core.transitions`). Time is a
    clock the test moves (`advance`): a delay or a lease runs out when the test says so.

    For tests of code that enqueues and works jobs, without a database. The behavioural suite
    of the repository runs the same scenarios against this queue and against PostgreSQL."""

    def __init__(
        self, *, registry: TaskRegistry | None = None, settings: Settings | None = None
    ) -> None:
        self.registry = registry if registry is not None else default_registry
        self.settings = settings if settings is not None else Settings(_env_file=None)
        self.now = 0.0
        self._jobs: dict[uuid.UUID, _Job] = {}
        self._by_key: dict[str, uuid.UUID] = {}

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass."""
        self.now += seconds

    # --- producers ------------------------------------------------------------------------

    async def enqueue(
        self,
        task: str,
        args: dict[str, Any] | None = None,
        *,
        lock_key: str | None = None,
        queue: str | None = None,
        idempotency_key: str | None = None,
        priority: int | None = None,
        available_at: timedelta | None = None,
        max_attempts: int | None = None,
    ) -> EnqueueResult:
        """Enqueue a job, as `Client.enqueue` does: the task's options as defaults, args
        checked by its model, `available_at` a delay from now; the same idempotency key with
        the same fields gives the same job, with others IdempotencyConflict."""
        known = self.registry.get(task)
        values = dict(args or {})
        if known is not None:
            known.check_args(values)
        chosen_queue = queue or (known.queue if known is not None else None)
        if chosen_queue is None:
            raise InvalidJob("queue", f"required: task {task!r} does not name its queue")
        job = _Job(
            job_id=new_job_id(),
            queue=chosen_queue,
            task=task,
            args=json.loads(limits.args_json(values)),
            lock_key=lock_key,
            idempotency_key=idempotency_key,
            priority=_first(priority, known.priority if known else None, 100),
            max_attempts=_first(
                max_attempts,
                known.max_attempts if known else None,
                self.settings.default_max_attempts,
            ),
            lease_ttl_sec=_first(
                known.lease_ttl_sec if known else None, self.settings.default_lease_ttl_sec
            ),
            created=len(self._jobs),
            created_at=self.now,
            available_at=self.now + (0.0 if available_at is None else available_at.total_seconds()),
        )
        if idempotency_key is not None and idempotency_key in self._by_key:
            holder = self._jobs[self._by_key[idempotency_key]]
            differs = [f for f in _SAME_JOB_FIELDS if getattr(holder, f) != getattr(job, f)]
            if differs:
                raise IdempotencyConflict(idempotency_key, holder.job_id, differs)
            return EnqueueResult(holder.job_id, holder.status, False)
        self._jobs[job.job_id] = job
        if idempotency_key is not None:
            self._by_key[idempotency_key] = job.job_id
        return EnqueueResult(job.job_id, job.status, True)

    async def get(self, job_id: uuid.UUID) -> JobState | None:
        job = self._jobs.get(job_id)
        return None if job is None else _state(job)

    async def cancel(self, job_id: uuid.UUID) -> JobState:
        """Queued: canceled now; running: asked to stop; finished: unchanged."""
        job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFound(f"no job {job_id}")
        decided = on_cancel(job.facts())
        if isinstance(decided, Transition):
            self._apply(job, decided)
        elif isinstance(decided, Request):
            job.cancel_requested = job.cancel_requested or decided.cancel
        return _state(job)

    async def stats(self, queue: str) -> QueueStats:
        """What `queue` holds now (`waiting`: due jobs whose lock_key's job runs)."""
        jobs = [j for j in self._jobs.values() if j.queue == queue]
        running_keys = _running_keys(jobs)
        queued = [j for j in jobs if j.status is JobStatus.QUEUED]
        due = [j for j in queued if j.available_at <= self.now]
        waiting = sum(j.lock_key in running_keys for j in due)
        return QueueStats(
            queue=queue,
            ready=len(due) - waiting,
            waiting=waiting,
            delayed=len(queued) - len(due),
            running=sum(j.status is JobStatus.RUNNING for j in jobs),
            failed=sum(j.status is JobStatus.FAILED for j in jobs),
            lost=sum(j.status is JobStatus.LOST for j in jobs),
            oldest_ready_age_sec=max((self.now - j.available_at for j in due), default=None),
        )

    # --- workers --------------------------------------------------------------------------

    async def claim(self, queue: str, limit: int = 1, worker_id: str = "test") -> list[ClaimedJob]:
        """Up to `limit` due jobs of `queue` in claim order (priority, then age), at most one
        per lock_key and none whose lock_key's job runs; each runs for its lease (its
        visibility timeout) unless completed, retried or failed first."""
        running_keys = _running_keys(self._jobs.values())
        due = sorted(
            (
                j
                for j in self._jobs.values()
                if j.queue == queue and j.status is JobStatus.QUEUED and j.available_at <= self.now
            ),
            key=lambda j: (j.priority, j.created_at, j.created),
        )
        claimed: list[ClaimedJob] = []
        for job in due:
            if len(claimed) >= limit or job.lock_key in running_keys:
                continue
            if job.lock_key is not None:
                running_keys.add(job.lock_key)
            job.status, job.attempt, job.claim_seq = (
                JobStatus.RUNNING,
                job.attempt + 1,
                job.claim_seq + 1,
            )
            job.claim_token, job.worker_id = uuid.uuid4(), worker_id
            job.lease_expires_at = self.now + job.lease_ttl_sec
            job.started_at = job.started_at if job.started_at is not None else self.now
            # a new attempt: its start, and no error of the one before
            job.attempted_at, job.error = self.now, None
            claimed.append(_claimed(job))
        return claimed

    async def complete(self, claim: ClaimedJob, result: Any = None) -> bool:
        """The claimed job succeeded with `result`; False (nothing written) if the claim is no
        longer the job's (its lease ran out and it was claimed again, it was cancelled…)."""
        text = limits.result_json(result, self.settings.max_result_bytes)
        return self._settle(claim, Outcome(Ended.SUCCEEDED, result=text))

    async def retry(self, claim: ClaimedJob, after_sec: float, error: str = "retry") -> bool:
        """The attempt failed: run the job again in `after_sec` (failed if none is left)."""
        return self._settle(claim, Outcome(Ended.FAILED, error, retry_after_sec=after_sec))

    async def fail(self, claim: ClaimedJob, error: str) -> bool:
        """The job failed for good."""
        return self._settle(claim, Outcome(Ended.FAILED, error, retryable=False))

    async def expire_leases(self) -> int:
        """The reaper's pass: running jobs whose lease ran out go back to the queue (lost on
        their last attempt); how many."""
        expired = [
            j
            for j in self._jobs.values()
            if j.status is JobStatus.RUNNING
            and j.lease_expires_at is not None
            and j.lease_expires_at <= self.now
        ]
        for job in expired:
            self._apply(job, on_expired(job.facts()))
        return len(expired)

    def _settle(self, claim: ClaimedJob, outcome: Outcome) -> bool:
        job = self._jobs.get(claim.job_id)
        if (
            job is None
            or job.status is not JobStatus.RUNNING
            or job.claim_token != claim.claim_token
        ):
            return False
        default_retry = Linear(self.settings.retry_base_sec)
        self._apply(job, decide(outcome, job.facts(), self.registry.get(job.task), default_retry))
        return True

    def _apply(self, job: _Job, t: Transition) -> None:
        """Write a decided transition, as the outcome statement writes it."""
        job.status, job.attempt, job.handbacks = t.status, t.attempt, t.handbacks
        if t.status is not JobStatus.RUNNING:
            job.claim_token, job.lease_expires_at = None, None
        if t.status is JobStatus.QUEUED:
            job.available_at = self.now + t.retry_in_sec
        if t.finished:
            job.finished_at = self.now
        if t.clear_start:
            job.started_at, job.attempted_at = None, None
        if not isinstance(t.error, Keep):
            job.error = t.error
        if not isinstance(t.result, Keep):
            job.result = None if t.result is None else json.loads(t.result)
        if not isinstance(t.cancel_requested, Keep):
            job.cancel_requested = t.cancel_requested
        if not isinstance(t.rerun_requested, Keep):
            job.rerun_requested = t.rerun_requested


def _first(*values: Any) -> Any:
    """The first value that is not None (a task's option left None falls through)."""
    return next(v for v in values if v is not None)


def _at(clock: float) -> datetime:
    return EPOCH + timedelta(seconds=clock)


def _maybe_at(clock: float | None) -> datetime | None:
    return None if clock is None else _at(clock)


def _running_keys(jobs: Iterable[_Job]) -> set[str]:
    """The lock_keys of the running jobs (a job without one holds none)."""
    return {j.lock_key for j in jobs if j.status is JobStatus.RUNNING and j.lock_key is not None}


def _claimed(job: _Job) -> ClaimedJob:
    assert job.claim_token is not None
    return ClaimedJob(
        job_id=job.job_id,
        queue=job.queue,
        task=job.task,
        args=job.args,
        lock_key=job.lock_key,
        lock_hash=None if job.lock_key is None else 0,
        partition_key="",
        priority=job.priority,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        lease_ttl_sec=job.lease_ttl_sec,
        cancel_requested=job.cancel_requested,
        claim_seq=job.claim_seq,
        claim_token=job.claim_token,
        handbacks=job.handbacks,
        rerun_requested=job.rerun_requested,
    )


def _state(job: _Job) -> JobState:
    return JobState(
        job_id=job.job_id,
        status=job.status,
        attempt=job.attempt,
        started_at=_maybe_at(job.started_at),
        finished_at=_maybe_at(job.finished_at),
        heartbeat_at=None,
        error=job.error,
        progress={},
        queue=job.queue,
        task=job.task,
        max_attempts=job.max_attempts,
        cancel_requested=job.cancel_requested,
        created_at=_at(job.created_at),
        available_at=_at(job.available_at),
        lock_key=job.lock_key,
        idempotency_key=job.idempotency_key,
        priority=job.priority,
        result=job.result,
        duration_ms=None,
        worker_id=job.worker_id,
        checkpoint=None,
        rerun_requested=job.rerun_requested,
        attempted_at=_maybe_at(job.attempted_at),
    )
