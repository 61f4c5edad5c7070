"""Finishing jobs: release the advisory lock, then write the outcome, until it is written.

Every outcome (success, failure, cancel, hand-back, backoff) joins one queue, and one writer
task writes them: each flush decides every outcome it holds (`core.transitions.after_attempt`,
with the task's retry policy) and writes them all in one fenced statement
(`storage.transitions.settle`). A job's slot is free as soon as its outcome is queued. The writer
starts as soon as something is queued and flushes again as soon as it is done, so an idle
worker adds no delay and a busy one writes many jobs per commit while its slots already run the
next jobs.

Each outcome is decided on the facts of the job as claimed. A job whose row changed meanwhile
(a client asked to cancel or re-run it) comes back with its facts now and is decided again in
the same flush; a row someone else holds (a pipeline fencing its writes with FOR SHARE) is tried
at the next flush. A statement that fails for another reason than a lost connection is tried
again outcome by outcome, so that one outcome the database refuses cannot hold up the others.

Until its outcome is written, a job stays in the process's running set: the heartbeat keeps its
lease alive. A write that fails (a connection cut, the server restarting, a timeout) is retried
with backoff until it lands, or until the job turns out to be no longer ours (every write is
fenced on the claim's token; the heartbeat also says so). A write whose answer was lost may have
committed: the next jobs it handed off are looked up and run in the slots kept for them
(`protocol.ClaimAnswerLost`), and its outcomes written again (those it wrote find their job no
longer ours). So a job that succeeded is never
reaped as `lost`, nor run again, because the database was briefly unreachable when it ended.
An outcome whose write fails MAX_WRITE_ERRORS times for another reason is given up: its lease
is left to expire and the reaper decides. When the process stops, a write still failing is
given up once the job's lease has run out by this process's clock (the reaper decides then) or
at once after a second stop signal (one whose row another session holds, after a few passes).

A flush releases its jobs' advisory locks (on the lock connection) while it writes their
outcomes: the two round trips overlap. The release is the shorter statement, so a job waiting on
the same lock_key, not claimable until the status write, finds the key free; one claimed before
the release landed backs off without delay (its key's holder is found to be nobody).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from dataloader import metrics
from dataloader.base import JobStatus
from dataloader.core.retry import Linear, RetryPolicy
from dataloader.core.transitions import Ended, JobFacts, Outcome, Transition, after_attempt
from dataloader.logger import log_context
from dataloader.storage.db import CONNECTION_ERRORS
from dataloader.storage.protocol import ClaimAnswerLost, ClaimedJob
from dataloader.storage.transitions import Applied, Fence, settle
from dataloader.tasks import Task
from dataloader.workers.runtime import RunningJob, WorkerRuntime

log = logging.getLogger(__name__)

#: Outcomes waiting for the writer beyond which a finishing job waits for a flush.
MAX_PENDING = 5000
#: First and longest pause between attempts at a failing write.
RETRY_FIRST_SEC = 0.05
RETRY_MAX_SEC = 2.0
#: Failed writes of one outcome, other than lost connections, after which it is given up: the
#: lease is no longer kept alive and the reaper decides (an error that repeats would otherwise
#: keep the job running, and its lock_key blocked, for ever).
MAX_WRITE_ERRORS = 5
#: Decisions of one outcome in one pass whose job changed under them (a cancel or re-run
#: requested just then) before it waits for the next pass.
MAX_REDECISIONS = 3
#: Passes a hurried stop still tries an outcome whose row another session held (the job's own
#: heartbeat or progress write, for a moment), with the usual backoff: seven seconds at most.
MAX_BUSY_PASSES_HURRIED = 8


@dataclass(eq=False, slots=True)
class _Pending:
    running: RunningJob
    outcome: Outcome
    unlocked: bool
    #: The facts the outcome is decided on: the claim's, then the row's if it changed.
    facts: JobFacts
    #: Failed writes that were not a lost connection (a bug, a constraint): bounded.
    errors: int = 0
    #: Failed writes of any kind (lost connections included).
    failures: int = 0
    #: Passes that left it unwritten (a failed write, or its row held elsewhere).
    passes: int = 0
    #: Its write made nothing claimable: the job ended for good, and the next job of its key
    #: was handed to this worker. Its queue need not be woken.
    quiet: bool = False


#: Outcomes whose end may hand the next job of their lock_key to this worker: the job held its
#: lock and let it go (a job backed off never had it; one handed back may have lost it).
HANDS_OFF = frozenset({Ended.SUCCEEDED, Ended.FAILED, Ended.CANCELED})


def decide(
    outcome: Outcome, facts: JobFacts, task: Task | None, default_retry: RetryPolicy
) -> Transition:
    """The transition of an attempt's outcome: the task's retry policy decides a failure's
    delay (`default_retry`, Linear(DL_RETRY_BASE_SEC), when it has none or when its own
    misbehaves). The worker, `run_task` and the in-memory queue decide alike."""
    policy = task.retry if task is not None and task.retry is not None else default_retry
    return after_attempt(outcome, facts, policy, fallback=default_retry)


class SlotKeeper(Protocol):
    """The queue workers, as the completer sees them: a free slot of a queue can be kept for
    the next job of a lock_key an outcome frees, which the outcome's write then claims."""

    def keep_slot(self, queue: str) -> bool:
        """Keep a free slot of `queue` (False: none is free, or the queue is not served)."""

    def release_slot(self, queue: str) -> None:
        """Give a kept slot back (the job, if one was handed, has a slot of its own now)."""

    def take_handed(self, job: ClaimedJob) -> None:
        """Run a job claimed for this worker by an outcome's write, in the slot kept for it."""


class Completer:
    """Writes the outcomes of this process's jobs."""

    def __init__(
        self,
        runtime: WorkerRuntime,
        on_written: Callable[[str], None],
        slots: SlotKeeper | None = None,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self._rt = runtime
        self._on_written = on_written
        self._slots = slots
        self._max_pending = max_pending
        self._default_retry: RetryPolicy = Linear(runtime.settings.retry_base_sec)
        self._queue: list[_Pending] = []
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self._hurried = False
        #: Writes that failed since the last one that landed (for the log).
        self.failed_writes = 0
        #: Outcomes found with their row held by another session, to be tried again.
        self.busy_writes = 0

    async def finish(self, running: RunningJob, outcome: Outcome) -> None:
        """Queue the outcome; the job stays in the running set (its lease alive) until it is
        written. Waits only when too many outcomes are pending already (back-pressure)."""
        self.enqueue(running, outcome)
        await self.backpressure()

    def enqueue(self, running: RunningJob, outcome: Outcome) -> None:
        """Queue the outcome without waiting (a batch handler's settlements, as it makes
        them); the caller waits on `backpressure` once it can."""
        running.finished = True
        unlocked = not running.locked  # a job backed off at its claim never got its lock
        facts = running.job.facts(cancel_requested=running.state.cancel_requested)
        self._queue.append(_Pending(running, outcome, unlocked, facts))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all(), name="dataloader-completer")

    async def backpressure(self) -> None:
        """Wait for a flush when too many outcomes are pending already."""
        if len(self._queue) >= self._max_pending:
            await self.wait_flushed()

    async def wait_flushed(self) -> None:
        """Return once every queued outcome is written (or given up)."""
        while self._writer is not None and not self._writer.done():
            await asyncio.wait([self._writer])  # never cancels or re-raises the shared writer

    def close(self, *, hurry: bool = False) -> None:
        """The process is stopping: give up a failing write once its job's lease has run out
        by our clock, or at once with `hurry` (a second stop signal)."""
        self._closing = True
        self._hurried = self._hurried or hurry

    async def _write_all(self) -> None:
        delay = RETRY_FIRST_SEC
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                failed = await self._write(batch)
            except Exception as exc:  # a bug, not the database: keep the outcomes, try again
                log.error("writing %d outcome(s) failed", len(batch), exc_info=exc)
                failed = batch
            retried = set(map(id, failed))
            woken = {p.running.job.queue for p in batch if id(p) not in retried and not p.quiet}
            for queue in woken:
                self._on_written(queue)  # a job waiting on a freed lock_key may be claimable
            failed = [p for p in failed if not self._give_up(p)]
            if not failed:
                delay = RETRY_FIRST_SEC
                continue
            self._queue[:0] = failed  # retried first, in their order
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_SEC)

    async def _write(self, batch: list[_Pending]) -> list[_Pending]:
        """Unlock while writing every outcome in one statement; returns those to try again (a
        write that failed, a row held elsewhere, a job that kept changing, and a second outcome
        of one job: a statement names each job once).

        When the statement fails for another reason than a lost connection, the outcomes are
        written one by one: one outcome the database refuses (an operator's trigger, a bug)
        must not hold up the others, nor count towards their MAX_WRITE_ERRORS, after which
        they would be given up to the reaper and run again."""
        locked = [p for p in batch if not p.unlocked]
        for p in locked:
            p.unlocked = True
        unlocking = asyncio.create_task(self._unlock(locked)) if locked else None
        try:
            return await self._write_outcomes(batch)
        finally:
            if unlocking is not None:
                await unlocking

    async def _write_outcomes(self, batch: list[_Pending]) -> list[_Pending]:
        todo, later = _one_per_job(batch)
        try:
            return later + await self._write_rounds(todo)
        except Exception as exc:
            todo = [p for p in todo if self._pending(p)]
            if isinstance(exc, CONNECTION_ERRORS) or len(todo) <= 1:
                self._write_failed(todo, exc)
                return later + todo
            log.warning(
                "writing %d outcomes in one statement failed (%r); writing them one by one",
                len(todo),
                exc,
            )
        again = list(later)
        for i, p in enumerate(todo):
            try:
                again += await self._write_rounds([p])
            except Exception as exc:
                self._write_failed([p], exc)
                again.append(p)
                if isinstance(exc, CONNECTION_ERRORS):  # the database is gone: the rest later
                    again += todo[i + 1 :]
                    break
        return again

    async def _write_rounds(self, todo: list[_Pending]) -> list[_Pending]:
        """Write `todo` in one statement, deciding again at once (up to MAX_REDECISIONS times)
        those whose job changed meanwhile (`storage.transitions.settle`); returns those left
        for the next pass (rows held elsewhere, jobs that kept changing)."""
        todo = await self._find_holders(todo)
        if not todo:
            return []
        pending = {p.running.job.job_id: p for p in todo}
        settled = await settle(
            [Fence(job_id, p.facts, p.running.job.claim_token) for job_id, p in pending.items()],
            lambda fence: self._decide(pending[fence.job_id], fence.facts),
            functools.partial(self._write_decided, pending),
            rounds=MAX_REDECISIONS,
        )
        self.busy_writes += len(settled.busy)
        again = []
        for job_id, fence in (settled.busy | settled.changing).items():
            p = pending[job_id]
            p.facts = fence.facts
            again.append(p)
        return again

    async def _find_holders(self, batch: list[_Pending]) -> list[_Pending]:
        """Backoffs depend on who holds the lock_key: ask (a job no longer ours is done)."""
        todo = []
        for p in batch:
            if p.outcome.ended is Ended.BACKED_OFF and p.outcome.holder is None:
                holder = await self._rt.protocol.lock_key_holder(p.running.job)
                if holder is None:
                    self._written(p, None)
                    continue
                p.outcome = replace(p.outcome, holder=holder)
            todo.append(p)
        return todo

    def _pending(self, pending: _Pending) -> bool:
        """Whether the outcome is still to be written (not written, not given up)."""
        return self._rt.running.get(pending.running.job.job_id) is pending.running

    async def _write_decided(
        self, pending: dict[uuid.UUID, _Pending], items: list[tuple[Fence, Transition]]
    ) -> dict[uuid.UUID, Applied]:
        """Write decided outcomes (one round of `settle`), handing the next job of a freed
        lock_key to a slot kept for it. What this round wrote, or found no longer ours, is
        accounted for at once: a later round that fails must not lose it."""
        decided = [(pending[fence.job_id], fence.facts, t) for fence, t in items]
        kept = self._keep_slots([p for p, _, _ in decided])
        try:
            applied = await self._rt.protocol.finish(
                [(p.running.job, facts, t) for p, facts, t in decided],
                self._rt.worker_id,
                hand_off=[p.running.job.job_id for p in kept],
                stages={
                    p.running.job.job_id: p.running.stages
                    for p, _, t in decided
                    if p.running.stages and t.status is JobStatus.SUCCEEDED
                },
                effects={
                    p.running.job.job_id: p.outcome.effects
                    for p, _, _ in decided
                    if p.outcome.effects is not None
                },
            )
        except ClaimAnswerLost as lost:  # the jobs it handed off run in the slots kept for them
            for job in lost.jobs:
                assert self._slots is not None
                self._slots.take_handed(job)
            raise
        finally:
            for p in kept:  # no await from here until the handed jobs have slots of their own
                assert self._slots is not None
                self._slots.release_slot(p.running.job.queue)
        for p, _, transition in decided:
            found = applied.get(p.running.job.job_id)
            if found is None:
                self._written(p, None)
            elif found.state == "written":
                handed = self._rt.protocol.handed_job(found)
                if handed is not None:
                    assert self._slots is not None
                    self._slots.take_handed(handed)
                    p.quiet = transition.finished
                self._written(p, transition, found.collision)
        return applied

    def _keep_slots(self, todo: list[_Pending]) -> list[_Pending]:
        """The outcomes that may hand this worker the next job of their lock_key: a slot of
        the job's queue is kept for it (none while the process stops: the slots keep no job)."""
        if self._slots is None or self._closing:
            return []
        return [
            p
            for p in todo
            if p.outcome.ended in HANDS_OFF
            and p.running.job.lock_hash is not None  # a lock_free job frees no key
            and self._slots.keep_slot(p.running.job.queue)
        ]

    def _decide(self, pending: _Pending, facts: JobFacts) -> Transition:
        task = self._rt.registry.get(pending.running.job.task)
        return decide(pending.outcome, facts, task, self._default_retry)

    async def _unlock(self, locked: list[_Pending]) -> None:
        """Release the advisory locks of `locked`, in one round trip. A failure leaves nothing
        to retry: the hashes are no longer reserved in this process, a lost connection took
        its locks with it, and the lock holder's audit releases any lock the server still
        holds for none of our jobs."""
        try:
            await self._rt.locks.unlock(p.running.job.lock_hash for p in locked)
        except Exception as exc:
            log.warning("could not release %d advisory lock(s): %r", len(locked), exc)

    def _written(
        self, pending: _Pending, written: Transition | None, collision: bool = False
    ) -> None:
        """The write landed (or found the job no longer ours): the job leaves the running set."""
        if self.failed_writes:
            log.warning("outcome writes work again after %d failure(s)", self.failed_writes)
            self.failed_writes = 0
        job, outcome = pending.running.job, pending.outcome
        self._forget(pending)
        self._rt.summary.count(job.queue, "no_longer_ours" if written is None else written.journal)
        if written is not None:
            self._rt.ended[job.queue, written.journal] += 1
            metrics.count_ended(job.queue, job.task, written.journal)
        if outcome.duration_ms is not None:
            metrics.of(metrics.JOB_DURATION, job.queue, job.task).observe(
                outcome.duration_ms / 1000
            )
        level, message, *args = _report(outcome, written)
        if not collision and not log.isEnabledFor(level):
            return  # binding the job's log context costs more than the rest of this
        with log_context(job_id=str(job.job_id), queue=job.queue, task=job.task):
            log.log(level, message, *args, exc_info=_traceback(outcome, written))
            if collision:
                log.warning(
                    "lock_key %r shares its hashtext with the lock_key of a job that waited"
                    " for it (journalled as lock_key_collision)",
                    job.lock_key,
                )

    def _write_failed(self, pending: list[_Pending], exc: Exception) -> None:
        """Count a failed write of `pending` (a lost connection is no error of theirs)."""
        self.failed_writes += len(pending)
        lost_connection = isinstance(exc, CONNECTION_ERRORS)
        for p in pending:
            p.failures += 1
            if not lost_connection:
                p.errors += 1
        log.warning(
            "could not write %d outcome(s), retrying: %r",
            len(pending),
            exc,
            exc_info=not lost_connection,
        )

    def _give_up(self, pending: _Pending) -> bool:
        """Whether to stop retrying an unwritten outcome: the job is no longer ours
        (heartbeat), or the process is stopping and the lease has run out, or a second signal
        came and its write failed (a row held elsewhere only holds it for a moment: it is
        tried a few more times first)."""
        running = pending.running
        pending.passes += 1
        expired = time.monotonic() - running.lease_extended_at > running.job.lease_ttl_sec
        hurried = self._hurried and (
            pending.failures > 0 or pending.passes >= MAX_BUSY_PASSES_HURRIED
        )
        if running.gone:
            why = "it is no longer ours"
        elif pending.errors >= MAX_WRITE_ERRORS:
            why = f"{pending.errors} writes failed; its lease is left to expire"
            running.gone = True  # the heartbeat stops extending it: the reaper decides
        elif self._closing and (hurried or expired):
            why = "the process is stopping"
        else:
            return False
        log.error(
            "giving up writing the outcome (%s) of job %s: %s",
            pending.outcome.ended.value,
            running.job.job_id,
            why,
        )
        self._forget(pending)
        return True

    def _forget(self, pending: _Pending) -> None:
        job_id = pending.running.job.job_id
        if self._rt.running.get(job_id) is pending.running:
            del self._rt.running[job_id]


def _report(outcome: Outcome, written: Transition | None) -> tuple[Any, ...]:
    """The log line of a written outcome: its level, message and arguments."""
    if written is None:
        return logging.WARNING, "job %s but was no longer ours", outcome.ended.value
    if outcome.ended is Ended.SUCCEEDED:
        return logging.DEBUG, "job succeeded"
    if outcome.ended is Ended.FAILED:
        if outcome.retry_after_sec is not None and written.status is JobStatus.QUEUED:
            return logging.INFO, "job asked to be retried (%s): %s", written.journal, outcome.error
        return logging.WARNING, "job attempt failed (%s): %s", written.journal, outcome.error
    if outcome.ended is Ended.HANDED_BACK:
        return logging.WARNING, "job handed back (%s): %s", written.journal, outcome.error
    if outcome.ended is Ended.CANCELED:
        return logging.DEBUG, "job canceled"
    if outcome.ended is Ended.UNSTARTED:
        return logging.DEBUG, "job given back before it started: %s", outcome.error
    return logging.DEBUG, "job backed off (%s holds the key)", outcome.holder


def _traceback(outcome: Outcome, written: Transition | None) -> BaseException | None:
    """What the log line of an outcome shows the traceback of: the error of a job that failed
    for good. A `Retry`, or an error that will be retried, is expected: its line says it."""
    if written is None or written.status is not JobStatus.FAILED:
        return None
    return outcome.raised


def _one_per_job(batch: list[_Pending]) -> tuple[list[_Pending], list[_Pending]]:
    """The outcomes to write now, one per job, and those of a job named already, for the next
    pass. A job has two outcomes pending only when a write of its earlier claim was still
    being retried while its lease expired and this process claimed it again: the earlier
    claim's outcome then finds the job no longer its own."""
    now: list[_Pending] = []
    later: list[_Pending] = []
    seen: set[object] = set()
    for p in batch:
        job_id = p.running.job.job_id
        (later if job_id in seen else now).append(p)
        seen.add(job_id)
    return now, later
