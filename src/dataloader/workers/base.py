"""One queue's worker: claim as many jobs as there are free slots, lock, run, finish.

claim (batch ≤ free slots) ─► advisory lock ─┬─ busy ─► backoff (attempt refunded)
                                             └─ held ─► task ─► unlock ─► finish

A task runs in an asyncio task of its own, cancelled after its `timeout` (the attempt then
fails with TaskTimeout, retried like any failure) or when the job stops being ours. How it
ended becomes an `Outcome`: its return value as JSON (refused, failing the attempt at once,
when it is not JSON or exceeds DL_MAX_RESULT_BYTES: never cut), or its error, with the delay it
asked for (`Retry(after=…)`) or whether it may be retried at all (NonRetryableError, the
task's `non_retryable` types). Backoffs and outcomes are decided and written by the completer,
which retries them until they land.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dataloader import metrics
from dataloader.core import limits
from dataloader.core.transitions import Ended, Outcome
from dataloader.exceptions import (
    InvalidJob,
    InvalidJobArgs,
    JobCanceled,
    JobLost,
    NonRetryableError,
    Retry,
    TaskTimeout,
)
from dataloader.logger import log_context
from dataloader.storage.db import storable_text
from dataloader.storage.protocol import ClaimedJob
from dataloader.workers.batches import Batch, BatchItem, HandlerStats, Settle, count
from dataloader.workers.claims import QueueClaims
from dataloader.workers.completer import Completer
from dataloader.workers.job_context import JobContext
from dataloader.workers.locks import LockConnectionLost
from dataloader.workers.pipelines.registry import Task
from dataloader.workers.runtime import RunningJob, WorkerRuntime
from dataloader.workers.stages import stage_jobs, stages_of
from dataloader.workers.waiting import wait_any

if TYPE_CHECKING:
    from dataloader.context import AppContext

log = logging.getLogger(__name__)

#: Longest error text stored in `dl_jobs.error`.
MAX_ERROR_CHARS = 4000


class Slots:
    """Slots that run claimed jobs, each a single job or a batch of a batched task's: what
    both kinds of worker share (`QueueWorker`, one queue's own slots, and
    `workers.processors.SharedSlots`, slots shared by several queues)."""

    #: Whether several queues share these slots.
    shared = False

    def __init__(self, concurrency: int, runtime: WorkerRuntime, completer: Completer) -> None:
        self.concurrency = concurrency
        self._rt = runtime
        self._completer = completer
        self._slot_freed = asyncio.Event()
        self._jobs: set[asyncio.Task[None]] = set()
        #: Set while the last claims found nothing, none of the jobs runs and none waits for
        #: its outcome to be written.
        self.idle = asyncio.Event()
        #: When (monotonic) the claim that last set `idle` started.
        self.idle_claim_started = 0.0

    @property
    def busy(self) -> int:
        """Slots in use."""
        return len(self._jobs)

    @property
    def job_tasks(self) -> set[asyncio.Task[None]]:
        return set(self._jobs)

    async def _start(self, jobs: list[ClaimedJob], claimed_at: float) -> None:
        """Lock the jobs and run them, a unit per slot (`_units`): the claim brought no more
        units than there are free slots (see `QueueClaims.claim`)."""
        for unit in await self._units(jobs):
            task = asyncio.create_task(
                self._execute_units([unit], claimed_at), name=f"dataloader-job-{unit[0].job.job_id}"
            )
            self._jobs.add(task)
            task.add_done_callback(self._finished)

    async def _units(self, jobs: list[ClaimedJob]) -> list[list[RunningJob]]:
        """Lock each job's key and back off those busy; the others, running now (their leases
        kept alive from here on), grouped in units: a single job, or up to its task's
        `batch_size` jobs of a batched task."""
        try:
            locked = await self._rt.locks.try_lock(job.lock_hash for job in jobs)
        except Exception as exc:  # nothing was locked: give them back at once
            if not isinstance(exc, LockConnectionLost):
                log.warning("locking %d job(s) failed: %r", len(jobs), exc)
            for job in jobs:
                await self._backoff(job, 0.0, f"the jobs could not be locked ({exc!r})")
            return []
        busy: list[ClaimedJob] = []
        units: list[list[RunningJob]] = []
        filling: dict[str, list[RunningJob]] = {}  # the batch of each task being filled
        for job in jobs:  # no await in this loop: every lock taken gets its job in the running set
            if job.lock_hash not in locked:
                busy.append(job)
                continue
            locked.discard(job.lock_hash)  # a colliding hash later in the batch is busy
            running = self._rt.running[job.job_id] = RunningJob(job)
            _count_start(job)
            size = self._batch_size_of(job.task)
            unit = filling.get(job.task)
            if unit is None or len(unit) >= size:
                unit = []
                units.append(unit)
                if size > 1:
                    filling[job.task] = unit
            unit.append(running)
        if self._rt.wakes_heartbeat(jobs):
            self._rt.job_started.set()
        for job in busy:
            await self._backoff(job, self._rt.settings.claim_backoff_sec, "lock_key is busy")
        return units

    async def _hand_back(self, unit: list[RunningJob], why: str) -> None:
        """Return a unit that will not run to the queue, its attempts refunded."""
        for running in unit:
            await self._completer.finish(running, Outcome(Ended.HANDED_BACK, why, refund=True))

    def _batch_size_of(self, task: str) -> int:
        found = self._rt.registry.get(task)
        return 1 if found is None else found.batch_size

    async def _backoff(self, job: ClaimedJob, delay: float, why: str) -> None:
        """Hand a job that cannot run now back to the queue (written by the completer, which
        keeps its lease alive until then). `delay` applies only if the key turns out to be
        held outside dataloader (see `queries.BACKOFF_JOB`)."""
        with log_context(job_id=str(job.job_id), queue=job.queue, task=job.task):
            log.info("%s (%r); handing the job back", why, job.lock_key)
        running = RunningJob(job)
        self._rt.running[job.job_id] = running
        await self._completer.finish(
            running, Outcome(Ended.BACKED_OFF, error=why, backoff_sec=delay)
        )

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._jobs.discard(task)
        self._slot_freed.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("job task crashed", exc_info=task.exception())

    async def _execute_units(self, units: list[list[RunningJob]], claimed_at: float) -> None:
        """Run one slot's units one after another: a cycle of the slot, measured from the
        claim that took them (`claimed_at`, monotonic). Once `stopping` says so, the units not
        started yet go back to the queue."""
        queue = units[0][0].job.queue
        in_progress = metrics.TASKS_IN_PROGRESS.labels(queue)
        count = sum(map(len, units))
        in_progress.inc(count)
        try:
            for unit in units:
                found = self._rt.registry.get(unit[0].job.task)
                if self._stopping_now() or any(r.handback for r in unit):
                    await self._hand_back(unit, "worker shutting down")
                elif found is not None and found.batched:
                    await self._execute_batch(unit, found)
                else:
                    await self._execute(unit[0])
        finally:
            in_progress.dec(count)
            metrics.CYCLE_DURATION.labels(queue).observe(time.monotonic() - claimed_at)

    def _stopping_now(self) -> bool:
        """Whether the worker stops: a unit not started yet is not started."""
        return False

    async def _execute(self, running: RunningJob) -> None:
        job = running.job
        if not self._rt.locks.holds(job.lock_hash):  # the lock connection died meanwhile
            running.lose("the lock connection was lost before the job started")
        with log_context(job_id=str(job.job_id), queue=job.queue, task=job.task):
            log.debug("job started (attempt %d of %d)", job.attempt, job.max_attempts)
            try:
                outcome = await self._run_pipeline(running)
            except BaseException:
                self._rt.running.pop(job.job_id, None)
                await self._rt.locks.unlock([job.lock_hash])
                raise
        # The completer takes the job out of the running set once its outcome is written.
        await self._completer.finish(running, outcome)

    async def _run_pipeline(self, running: RunningJob) -> Outcome:
        job = running.job
        found = self._rt.registry.get(job.task)
        if found is None:
            # retryable: during a rolling deploy another replica may know the task
            return Outcome(Ended.FAILED, f"no task registered as {job.task!r}")
        try:
            args = found.parse_args(job.args)
            ctx = JobContext(
                job, args, app=self._rt.app, state=running.state, protocol=self._rt.protocol
            )
            task: asyncio.Task[object] = asyncio.create_task(
                found.handler(ctx)
                if found.timeout_sec is None
                else within_timeout(found.handler(ctx), found.timeout_sec),
                name=f"dataloader-pipeline-{job.job_id}",
            )
        except InvalidJobArgs as exc:
            return Outcome(Ended.FAILED, f"invalid args: {exc}", retryable=False)
        except Exception as exc:  # a broken args model or handler: retrying cannot help
            log.error("task could not start", exc_info=exc)
            return Outcome(Ended.FAILED, _error_text(exc), retryable=False)
        started = time.monotonic()
        running.attach(task)
        await asyncio.wait([task])
        duration_ms = round((time.monotonic() - started) * 1000)
        outcome = outcome_of(running, found, duration_ms, self._rt.settings.max_result_bytes)
        return self._with_stages(running, found, outcome)

    def _with_stages(self, running: RunningJob, task: Task, outcome: Outcome) -> Outcome:
        """The outcome with the next stages it enqueues (a success: `running.stages`) or
        stops before (a failure). A stage that cannot be enqueued (args its task refuses)
        fails the job: retrying would make the same stage."""
        stages = stages_of(task, running.state.stages, outcome.result)
        if not stages:
            return outcome
        names = tuple(stage.task for stage in stages)
        if outcome.ended is not Ended.SUCCEEDED:
            return replace(outcome, stages=names)
        try:
            running.stages = stage_jobs(running.job, stages, self._rt.app.client)
        except (InvalidJob, InvalidJobArgs) as exc:
            why = f"next stage: {exc}"
            return Outcome(
                Ended.FAILED, why, retryable=False, duration_ms=outcome.duration_ms, stages=names
            )
        return replace(outcome, stages=names)

    async def _execute_batch(self, unit: list[RunningJob], task: Task) -> None:
        """Run a batched task's jobs in one call of its handler; each settlement is queued for
        writing as the handler makes it, the jobs left open once it ends after that."""
        runs = {running.job.job_id: running for running in unit}
        for running in unit:
            if not self._rt.locks.holds(running.job.lock_hash):
                running.lose("the lock connection was lost before the job started")
        queue = unit[0].job.queue
        with log_context(queue=queue, task=task.name):
            try:
                stats = await call_batch_handler(
                    list(runs.values()),
                    task,
                    app=self._rt.app,
                    settle=lambda job, outcome: self._completer.enqueue(runs[job.job_id], outcome),
                    max_result_bytes=self._rt.settings.max_result_bytes,
                )
            except BaseException:
                unsettled = [r for r in runs.values() if not r.finished]
                for running in unsettled:
                    self._rt.running.pop(running.job.job_id, None)
                await self._rt.locks.unlock([r.job.lock_hash for r in unsettled])
                raise
            if stats.last_error is not None:
                log.warning(
                    "batch of %d: %d done, %d error(s), last: %s",
                    len(unit),
                    stats.processed,
                    stats.errors,
                    stats.last_error,
                )
        metrics.observe_batch(queue, task.name, stats)
        await self._completer.backpressure()


class QueueWorker(Slots):
    """Serves one queue with `concurrency` slots of its own."""

    def __init__(
        self, queue: str, concurrency: int, runtime: WorkerRuntime, completer: Completer
    ) -> None:
        super().__init__(concurrency, runtime, completer)
        self.queue = queue
        self._wakeup = asyncio.Event()
        #: Slots kept for jobs the completer may be handed (the next job of a key it frees),
        #: and slots a claim in flight may fill: neither may be promised twice.
        self._kept = 0
        self._claiming = 0
        self._stopping: asyncio.Event | None = None
        self.claims = QueueClaims(queue, runtime)
        #: Jobs a slot takes per claim.
        self.batch_size = declared_batch_size(runtime, queue)

    def keep_slot(self) -> bool:
        """Keep a free slot for a job an outcome's write may claim for this worker (see
        `Completer`); False when none is free or the worker stops claiming."""
        if self._stopping is None or self._stopping.is_set():
            return False
        if len(self._jobs) + self._kept + self._claiming >= self.concurrency:
            return False
        self._kept += 1
        return True

    def release_slot(self) -> None:
        """Give back a slot kept by `keep_slot`."""
        self._kept -= 1
        self._slot_freed.set()

    def take_handed(self, job: ClaimedJob) -> None:
        """Run a job claimed for this worker by an outcome's write (its slot was kept). Its
        key was let go just before that write: it is locked again first, like a claimed job's."""
        self.idle.clear()
        task = asyncio.create_task(
            self._run_handed(job, time.monotonic()), name=f"dataloader-job-{job.job_id}"
        )
        self._jobs.add(task)
        task.add_done_callback(self._finished)

    async def _run_handed(self, job: ClaimedJob, claimed_at: float) -> None:
        if self._stopping is not None and self._stopping.is_set():
            await self._backoff(job, 0.0, "the worker is stopping")
            return
        try:
            locked = job.lock_hash in await self._rt.locks.try_lock([job.lock_hash])
        except Exception as exc:
            await self._backoff(job, 0.0, f"the job could not be locked ({exc!r})")
            return
        if locked:
            self._rt.running[job.job_id] = RunningJob(job)
            _count_start(job)
            if self._rt.wakes_heartbeat([job]):
                self._rt.job_started.set()
            await self._execute_units([[self._rt.running[job.job_id]]], claimed_at)
        else:
            await self._backoff(job, self._rt.settings.claim_backoff_sec, "lock_key is busy")

    def wake(self) -> None:
        """Something may be ready (notification, poll, a finished job freeing a lock_key)."""
        self._wakeup.set()

    @property
    def claims_started(self) -> int:
        return self.claims.started

    @property
    def claims_answered(self) -> int:
        return self.claims.answered

    async def run(self, stopping: asyncio.Event) -> None:
        """Claim and start jobs until `stopping` is set."""
        self._stopping = stopping
        while not stopping.is_set():
            free = self.concurrency - len(self._jobs) - self._kept
            if free <= 0:
                self._slot_freed.clear()
                await wait_any(self._slot_freed, stopping)
                continue
            if not self._rt.locks.ready.is_set():
                await wait_any(self._rt.locks.ready, stopping)
                continue
            if self._rt.presence.lapsed():
                await self._rt.presence.wait_renewed(stopping)
                continue
            self._wakeup.clear()
            try:
                claim_started = time.monotonic()
                self._claiming = free  # until the jobs claimed have their slots
                claimed = await self.claims.claim(free * self.batch_size, claim_started, free)
                self._claiming = min(len(claimed.jobs), free)
                if claimed.moved or claimed.held or self._jobs or self._outcomes_pending():
                    self.idle.clear()
                else:
                    self.idle_claim_started = claim_started
                    self.idle.set()
                if claimed.jobs:
                    await self._start(claimed.jobs, claim_started)
                self._claiming = 0
                if claimed.more:
                    continue
                timeout = self.claims.idle_timeout()
            except Exception as exc:  # the loop must outlive any database trouble
                self._claiming = 0
                timeout = self.claims.failure_pause(exc)
            await wait_any(self._wakeup, stopping, timeout=timeout)

    def _outcomes_pending(self) -> bool:
        """Whether a job of this queue has ended but its outcome is not written yet: a
        failure written later may make it ready again (the write wakes this queue)."""
        return any(r.job.queue == self.queue for r in self._rt.running.values())


def declared_batch_size(runtime: WorkerRuntime, queue: str) -> int:
    """The largest `batch_size` of the tasks declared on `queue` (1 when none is batched)."""
    return max((t.batch_size for t in runtime.registry.tasks() if t.queue == queue), default=1)


async def call_batch_handler(
    runs: list[RunningJob],
    task: Task,
    *,
    app: AppContext,
    settle: Settle,
    max_result_bytes: int,
) -> HandlerStats:
    """Call a batched task's handler once for `runs` (jobs whose args break the task's model
    fail at once, without it) and settle every job; returns what the call did. The worker and
    `dataloader.testing.run_batch` call it alike."""
    items: list[BatchItem[Any]] = []
    stats = HandlerStats()
    for running in runs:
        try:
            items.append(BatchItem(running.job, task.parse_args(running.job.args)))
        except InvalidJobArgs as exc:
            outcome = Outcome(Ended.FAILED, f"invalid args: {exc}", retryable=False)
            count(stats, outcome, running.job)
            settle(running.job, outcome)
    if not items:
        return stats
    by_id = {r.job.job_id: r for r in runs}
    batch: Batch[Any] = Batch(
        items,
        app=app,
        settle=settle,
        cancel_requested=lambda job_id: by_id[job_id].state.cancel_requested,
        max_result_bytes=max_result_bytes,
    )
    try:
        coro = task.handler(batch)
        pipeline: asyncio.Task[object] = asyncio.create_task(
            coro if task.timeout_sec is None else within_timeout(coro, task.timeout_sec),
            name=f"dataloader-batch-{items[0].job_id}",
        )
    except Exception as exc:  # a handler that is not a coroutine function: retrying cannot help
        log.error("batch handler could not start", exc_info=exc)
        failed = Outcome(Ended.FAILED, _error_text(exc), retryable=False)
        batch.close_all(lambda job: replace(failed))
        return _merged(stats, batch.stats)
    stop = _StopOnce(pipeline)
    for item in items:
        running = by_id[item.job_id]
        running.on_stop = stop
        if running.state.lost_reason is not None or running.handback:
            stop()
    await asyncio.wait([pipeline])
    batch.close_all(lambda job: _unsettled(pipeline, by_id[job.job_id], task))
    return _merged(stats, batch.stats)


class _StopOnce:
    """Cancels a batch's handler once, whichever of its jobs asks first: a second cancel would
    cut short the handler's own clean-up of the first."""

    def __init__(self, pipeline: asyncio.Task[object]) -> None:
        self._pipeline = pipeline
        self._stopped = False

    def __call__(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._pipeline.cancel()


def _unsettled(pipeline: asyncio.Task[object], running: RunningJob, task: Task) -> Outcome:
    """The outcome of a job its batch handler left unsettled, by how the handler ended."""
    if pipeline.cancelled():
        if running.state.lost_reason is None and not running.handback:
            # another job of the batch was lost: this one goes back, as the worker cut it short
            return Outcome(Ended.HANDED_BACK, "another job of its batch was lost", refund=True)
        return _cut_short(running, 0)
    exc = pipeline.exception()
    if exc is None:
        return Outcome(Ended.FAILED, "left unsettled by the batch handler")
    return _raised(exc, task, None)


def _merged(first: HandlerStats, then: HandlerStats) -> HandlerStats:
    """`then` (the handler's call) with the jobs settled before it (`first`) added."""
    then.processed += first.processed
    then.errors += first.errors
    then.retried += first.retried
    if then.last_error is None:
        then.last_error = first.last_error
    return then


async def within_timeout(coro: Coroutine[Any, Any, object], timeout: float) -> object:
    """Run a task's coroutine, cancelled after `timeout` seconds: it then fails with
    TaskTimeout. A TimeoutError of the task's own (an inner `asyncio.timeout`, a client
    library's) stays what it is. The limit is cooperative, like any cancellation: a task that
    swallows CancelledError runs on."""
    limit = asyncio.timeout(timeout)
    try:
        async with limit:
            return await coro
    except TimeoutError:
        if limit.expired():
            raise TaskTimeout(f"the task ran longer than its timeout of {timeout:g}s") from None
        raise


def outcome_of(running: RunningJob, task: Task, duration_ms: int, max_result_bytes: int) -> Outcome:
    """Translate how the task's asyncio task ended."""
    pipeline = running.task
    assert pipeline is not None
    if pipeline.cancelled():
        return _cut_short(running, duration_ms)
    exc = pipeline.exception()
    if exc is None:
        try:
            result = limits.result_json(pipeline.result(), max_result_bytes)
        except Exception as problem:  # never a cut: the attempt fails, and says why
            why = str(problem) if isinstance(problem, ValueError) else _error_text(problem)
            return Outcome(Ended.FAILED, f"result: {why}", retryable=False, duration_ms=duration_ms)
        return Outcome(Ended.SUCCEEDED, result=result, duration_ms=duration_ms)
    return _raised(exc, task, duration_ms)


def _cut_short(running: RunningJob, duration_ms: int | None) -> Outcome:
    """A run whose task was cancelled: by our side (lock or lease lost, shutdown), refunded;
    otherwise (someone cancelled the task itself) a failure."""
    lost = running.state.lost_reason
    if lost is not None:  # our side failed the job (lock or lease): refunded, bounded
        return Outcome(Ended.HANDED_BACK, lost, refund=True, duration_ms=duration_ms)
    if running.handback:
        return Outcome(
            Ended.HANDED_BACK, "worker shutting down", refund=True, duration_ms=duration_ms
        )
    return Outcome(Ended.FAILED, "task was cancelled", duration_ms=duration_ms)


def _raised(exc: BaseException, task: Task, duration_ms: int | None) -> Outcome:
    """A run whose task raised `exc`."""
    if isinstance(exc, JobCanceled):
        return Outcome(Ended.CANCELED, duration_ms=duration_ms)
    if isinstance(exc, JobLost):
        return Outcome(Ended.HANDED_BACK, str(exc), refund=True, duration_ms=duration_ms)
    text = _error_text(exc)
    if isinstance(exc, Retry):
        return Outcome(
            Ended.FAILED, text, retry_after_sec=exc.after_sec, duration_ms=duration_ms, raised=exc
        )
    retryable = not isinstance(exc, (NonRetryableError, *task.non_retryable))
    return Outcome(Ended.FAILED, text, retryable=retryable, duration_ms=duration_ms, raised=exc)


def _count_start(job: ClaimedJob) -> None:
    """A job's attempt starts in this process (metrics)."""
    metrics.JOBS_STARTED.labels(job.queue, job.task).inc()
    if job.waited_sec is not None:
        metrics.JOB_WAIT.labels(job.queue).observe(max(0.0, job.waited_sec))


def _error_text(exc: BaseException) -> str:
    """`Type: message`, storable in a text column (no NUL, no lone surrogate, bounded)."""
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable error>"
    text = f"{type(exc).__name__}: {message}"[:MAX_ERROR_CHARS]
    return storable_text(text)
