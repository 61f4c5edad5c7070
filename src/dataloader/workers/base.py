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
from typing import Any

from dataloader.core import limits
from dataloader.core.transitions import Ended, Outcome
from dataloader.exceptions import (
    InvalidJobArgs,
    JobCanceled,
    JobLost,
    NonRetryableError,
    Retry,
    TaskTimeout,
)
from dataloader.logger import log_context
from dataloader.storage.db import CONNECTION_ERRORS, storable_text
from dataloader.storage.protocol import ClaimedJob
from dataloader.workers.completer import Completer
from dataloader.workers.job_context import JobContext
from dataloader.workers.locks import LockConnectionLost
from dataloader.workers.pipelines.registry import Task
from dataloader.workers.runtime import RunningJob, WorkerRuntime
from dataloader.workers.waiting import jittered, wait_any

log = logging.getLogger(__name__)

#: Longest error text stored in `dl_jobs.error`.
MAX_ERROR_CHARS = 4000
#: The most jobs one claim walks (locking each) after the last one parked some: a run of
#: 50,000 jobs of a running lock_key is parked in about ten claims.
MAX_WALK = 10_000
#: How long to wait before putting back again delayed jobs that are due but were not put back
#: (held by another session meanwhile), instead of trying again at once.
DUE_RETRY_SEC = 1.0
#: Delayed jobs come due put back per statement.
PUT_BACK_BATCH = 1000


class QueueWorker:
    """Serves one queue with `concurrency` slots."""

    def __init__(
        self, queue: str, concurrency: int, runtime: WorkerRuntime, completer: Completer
    ) -> None:
        self.queue = queue
        self._completer = completer
        self.concurrency = concurrency
        self._rt = runtime
        self._wakeup = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._jobs: set[asyncio.Task[None]] = set()
        #: Slots kept for jobs the completer may be handed (the next job of a key it frees),
        #: and slots a claim in flight may fill: neither may be promised twice.
        self._kept = 0
        self._claiming = 0
        self._stopping: asyncio.Event | None = None
        #: Set while the last claim found nothing, no job of this queue runs and none waits
        #: for its outcome to be written.
        self.idle = asyncio.Event()
        #: When (monotonic) the claim that last set `idle` started.
        self.idle_claim_started = 0.0
        #: Claim statements started and answered (one at a time: the n-th answered is the n-th
        #: started), for operators and tests.
        self.claims_started = 0
        self.claims_answered = 0
        #: How many jobs the next claim walks at least (see MAX_WALK).
        self._walk = 0
        #: When (monotonic) the queue's earliest delayed job is due, as the last claim saw it
        #: (infinity: none; see `_put_back_due`).
        self._due_at = 0.0

    @property
    def busy(self) -> int:
        """Slots in use."""
        return len(self._jobs)

    @property
    def job_tasks(self) -> set[asyncio.Task[None]]:
        return set(self._jobs)

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
        task = asyncio.create_task(self._run_handed(job), name=f"dataloader-job-{job.job_id}")
        self._jobs.add(task)
        task.add_done_callback(self._finished)

    async def _run_handed(self, job: ClaimedJob) -> None:
        if self._stopping is not None and self._stopping.is_set():
            await self._backoff(job, 0.0, "the worker is stopping")
            return
        try:
            locked = job.lock_hash in await self._rt.locks.try_lock([job.lock_hash])
        except Exception as exc:
            await self._backoff(job, 0.0, f"the job could not be locked ({exc!r})")
            return
        if locked:
            await self._execute(job)
        else:
            await self._backoff(job, self._rt.settings.claim_backoff_sec, "lock_key is busy")

    def wake(self) -> None:
        """Something may be ready (notification, poll, a finished job freeing a lock_key)."""
        self._wakeup.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Claim and start jobs until `stopping` is set."""
        settings = self._rt.settings
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
            self._wakeup.clear()
            try:
                claim_started = time.monotonic()
                put_back = await self._put_back_due(claim_started)
                self.claims_started += 1
                self._claiming = free  # until the jobs claimed have their slots
                claim = await self._rt.protocol.claim_round(
                    self.queue, free, self._rt.worker_id, walk=max(free, self._walk)
                )
                self.claims_answered += 1
                jobs = claim.jobs
                self._claiming = len(jobs)
                self._due_at = _due_at(claim_started, claim.next_due_in)
                if put_back == 0 and self._due_at <= claim_started:
                    self._due_at = claim_started + DUE_RETRY_SEC  # held elsewhere: not a spin
                parked = await self._rt.protocol.park(claim.blocked) if claim.blocked else 0
                # Jobs that could not run were parked: the next claim walks further, so that
                # a long run of them is parked in a few claims, not one slot's worth each.
                self._walk = min(max(self._walk, free) * 4, MAX_WALK) if parked else 0
                if jobs or parked or put_back or self._jobs or self._outcomes_pending():
                    self.idle.clear()
                else:
                    self.idle_claim_started = claim_started
                    self.idle.set()
                if jobs:
                    await self._start(jobs)
                self._claiming = 0
                if parked or put_back or self._due_at <= claim_started or not claim.exhausted:
                    # There may be more: jobs parked or put back leave others claimable, a
                    # delayed job is due, or the claim stopped at its walk (a batch comes back
                    # short when several candidates share a lock_key); nothing would wake us
                    # for them. A claim that walked every job needs no second look: whatever
                    # changes after it (a new job, a freed lock_key, a retry) wakes the queue.
                    continue
                timeout = self._idle_timeout()
            except Exception as exc:  # the loop must outlive any database trouble
                self._claiming = 0
                log.warning("claim on %s failed: %r", self.queue, exc, exc_info=_unexpected(exc))
                timeout = jittered(min(settings.poll_interval_sec, 1.0))
                self._due_at = 0.0  # unknown: look again
            await wait_any(self._wakeup, stopping, timeout=timeout)

    async def _put_back_due(self, now: float) -> int | None:
        """Put back the queue's delayed jobs that have come due, when the last claim said one
        is (each claim tells when the earliest is due: no statement runs for nothing); how
        many, or None when none was due."""
        if now < self._due_at:
            return None
        put_back, due_in = await self._rt.protocol.put_back_due(self.queue, PUT_BACK_BATCH)
        # more may be due already when a whole batch was put back
        self._due_at = now if put_back >= PUT_BACK_BATCH else _due_at(now, due_in)
        return put_back

    def _outcomes_pending(self) -> bool:
        """Whether a job of this queue has ended but its outcome is not written yet: a
        failure written later may make it ready again (the write wakes this queue)."""
        return any(r.job.queue == self.queue for r in self._rt.running.values())

    def _idle_timeout(self) -> float:
        """Sleep until the safety poll or the earliest delayed job, whichever comes first."""
        poll = jittered(self._rt.settings.poll_interval_sec)
        return max(0.0, min(poll, self._due_at - time.monotonic() + 0.001))

    async def _start(self, jobs: list[ClaimedJob]) -> None:
        """Lock each job's key; run those locked, back off the others."""
        try:
            locked = await self._rt.locks.try_lock(job.lock_hash for job in jobs)
        except Exception as exc:  # nothing was locked: give them back at once
            if not isinstance(exc, LockConnectionLost):
                log.warning("locking %d job(s) failed: %r", len(jobs), exc)
            for job in jobs:
                await self._backoff(job, 0.0, f"the jobs could not be locked ({exc!r})")
            return
        busy: list[ClaimedJob] = []
        for job in jobs:  # no await in this loop: every lock taken gets its job started
            if job.lock_hash in locked:
                locked.discard(job.lock_hash)  # a colliding hash later in the batch is busy
                task = asyncio.create_task(self._execute(job), name=f"dataloader-job-{job.job_id}")
                self._jobs.add(task)
                task.add_done_callback(self._finished)
            else:
                busy.append(job)
        for job in busy:
            await self._backoff(job, self._rt.settings.claim_backoff_sec, "lock_key is busy")

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

    async def _execute(self, job: ClaimedJob) -> None:
        running = RunningJob(job)
        self._rt.running[job.job_id] = running
        if job.lease_ttl_sec / 3 < self._rt.beat_period:  # its lease needs sooner beats
            self._rt.job_started.set()
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
        return outcome_of(running, found, duration_ms, self._rt.settings.max_result_bytes)


def _due_at(now: float, due_in: float | None) -> float:
    """When (monotonic) a job due in `due_in` seconds (None: no job) is due."""
    return float("inf") if due_in is None else now + due_in


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
    lost = running.state.lost_reason
    if pipeline.cancelled():
        if lost is not None:  # our side failed the job (lock or lease): refunded, bounded
            return Outcome(Ended.HANDED_BACK, lost, refund=True, duration_ms=duration_ms)
        if running.handback:
            return Outcome(
                Ended.HANDED_BACK, "worker shutting down", refund=True, duration_ms=duration_ms
            )
        return Outcome(Ended.FAILED, "task was cancelled", duration_ms=duration_ms)
    exc = pipeline.exception()
    if exc is None:
        try:
            result = limits.result_json(pipeline.result(), max_result_bytes)
        except Exception as problem:  # never a cut: the attempt fails, and says why
            why = str(problem) if isinstance(problem, ValueError) else _error_text(problem)
            return Outcome(Ended.FAILED, f"result: {why}", retryable=False, duration_ms=duration_ms)
        return Outcome(Ended.SUCCEEDED, result=result, duration_ms=duration_ms)
    if isinstance(exc, JobCanceled):
        return Outcome(Ended.CANCELED, duration_ms=duration_ms)
    if isinstance(exc, JobLost):
        return Outcome(Ended.HANDED_BACK, str(exc), refund=True, duration_ms=duration_ms)
    text = _error_text(exc)
    if isinstance(exc, Retry):
        log.info("task asked to be retried in %gs: %s", exc.after_sec, exc.reason)
        return Outcome(Ended.FAILED, text, retry_after_sec=exc.after_sec, duration_ms=duration_ms)
    log.warning("task raised %s", text, exc_info=exc)
    retryable = not isinstance(exc, (NonRetryableError, *task.non_retryable))
    return Outcome(Ended.FAILED, text, retryable=retryable, duration_ms=duration_ms)


def _unexpected(exc: BaseException) -> bool:
    """Whether a failure deserves a traceback in the log (a lost connection does not)."""
    return not isinstance(exc, CONNECTION_ERRORS)


def _error_text(exc: BaseException) -> str:
    """`Type: message`, storable in a text column (no NUL, no lone surrogate, bounded)."""
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable error>"
    text = f"{type(exc).__name__}: {message}"[:MAX_ERROR_CHARS]
    return storable_text(text)
