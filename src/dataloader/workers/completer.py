"""Finishing jobs: release the advisory lock, then write the outcome, until it is written.

Every outcome (success, failure, cancel, hand-back, backoff) joins one queue, and one writer
task writes them: successes batched, one statement per flush; the others one by one. A job's
slot is free as soon as its outcome is queued. The writer starts as soon as something is queued
and flushes again as soon as it is done, so an idle worker adds no delay and a busy one writes
many jobs per commit while its slots already run the next jobs.

Until its outcome is written, a job stays in the process's running set: the heartbeat keeps its
lease alive. A write that fails (a connection cut, the server restarting, a timeout) is retried
with backoff until it lands, or until the job turns out to be no longer ours (every write is
fenced on the claim's token; the heartbeat also says so). So a job that succeeded is never
reaped as `lost`, nor run again, because the database was briefly unreachable when it ended.
When the process stops, a write still failing is given up once the job's lease has run out by
this process's clock (the reaper decides then) or at once after a second stop signal.

The lock is released before the status is written: a job waiting on the same lock_key is not
claimable until the status write, and then finds the key free (no needless backoff).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from dataloader.logger import log_context
from dataloader.storage.db import CONNECTION_ERRORS
from dataloader.storage.repositories import BUSY, Written
from dataloader.workers.runtime import RunningJob, WorkerRuntime

log = logging.getLogger(__name__)

#: Outcomes waiting for the writer beyond which a finishing job waits for a flush.
MAX_PENDING = 5000
#: First and longest pause between attempts at a failing write.
RETRY_FIRST_SEC = 0.05
RETRY_MAX_SEC = 2.0
#: Hand-backs whose attempt is refunded, per job; later ones consume an attempt.
MAX_REFUNDED_HANDBACKS = 3
#: Failed writes of one outcome, other than lost connections, after which it is given up: the
#: lease is no longer kept alive and the reaper decides (an error that repeats would otherwise
#: keep the job running, and its lock_key blocked, for ever).
MAX_WRITE_ERRORS = 5


class Result(Enum):
    SUCCEEDED = "succeeded"
    CANCELED = "canceled"
    FAILED = "failed"
    RELEASED = "released"
    #: Claimed but not started (its lock_key is busy): back to the queue, attempt refunded.
    BACKOFF = "backoff"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a run ended."""

    result: Result
    error: str | None = None
    retryable: bool = True
    refund: bool = False
    #: BACKOFF: seconds before a job whose key is held outside dataloader is claimable again.
    delay_sec: float = 0.0


@dataclass(eq=False, slots=True)
class _Pending:
    running: RunningJob
    outcome: Outcome
    unlocked: bool
    #: Failed writes that were not a lost connection (a bug, a constraint): bounded.
    errors: int = 0


class Completer:
    """Writes the outcomes of this process's jobs."""

    def __init__(
        self,
        runtime: WorkerRuntime,
        on_written: Callable[[str], None],
        max_pending: int = MAX_PENDING,
    ) -> None:
        self._rt = runtime
        self._on_written = on_written
        self._max_pending = max_pending
        self._queue: list[_Pending] = []
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self._hurried = False
        #: Writes that failed since the last one that landed (for the log).
        self.failed_writes = 0

    async def finish(self, running: RunningJob, outcome: Outcome) -> None:
        """Queue the outcome; the job stays in the running set (its lease alive) until it is
        written. Waits only when too many outcomes are pending already (back-pressure)."""
        running.finished = True
        unlocked = outcome.result is Result.BACKOFF  # a job backed off never got its lock
        self._queue.append(_Pending(running, outcome, unlocked))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all(), name="dataloader-completer")
        elif len(self._queue) >= self._max_pending:
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
            for queue in {p.running.job.queue for p in batch if id(p) not in retried}:
                self._on_written(queue)  # a job waiting on a freed lock_key may be claimable
            failed = [p for p in failed if not self._give_up(p)]
            if not failed:
                delay = RETRY_FIRST_SEC
                continue
            self._queue[:0] = failed  # retried first, in their order
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_SEC)

    async def _write(self, batch: list[_Pending]) -> list[_Pending]:
        """Unlock, then write each outcome once; returns those whose write failed."""
        await self._unlock(batch)
        failed: list[_Pending] = []
        successes = [p for p in batch if p.outcome.result is Result.SUCCEEDED]
        if successes:
            try:
                ours = await self._rt.repo.complete_many(
                    [(p.running.job.job_id, p.running.job.claim_token) for p in successes],
                    self._rt.worker_id,
                )
            except Exception as exc:
                self._write_failed(successes, exc)
                failed.extend(successes)
            else:
                for p in successes:
                    written = ours.get(p.running.job.job_id)
                    if written is not None and written.kind == BUSY:
                        failed.append(p)  # its row is held elsewhere: again at the next pass
                    else:
                        self._written(p, written)
        others_failing = False
        for p in batch:
            if p.outcome.result is Result.SUCCEEDED:
                continue
            if others_failing:  # the database is failing us: try the rest at the next pass
                failed.append(p)
                continue
            try:
                written = await self._write_one(p)
            except Exception as exc:
                self._write_failed([p], exc)
                failed.append(p)
                others_failing = True
            else:
                self._written(p, written)
        return failed

    async def _unlock(self, batch: list[_Pending]) -> None:
        """Release the advisory locks of jobs not yet unlocked, in one round trip. A failure
        leaves nothing to retry: the hashes are no longer reserved in this process, a lost
        connection took its locks with it, and the lock holder's audit releases any lock the
        server still holds for none of our jobs."""
        todo = [p for p in batch if not p.unlocked]
        for p in todo:
            p.unlocked = True
        if todo:
            try:
                await self._rt.locks.unlock(p.running.job.lock_hash for p in todo)
            except Exception as exc:
                log.warning("could not release %d advisory lock(s): %r", len(todo), exc)

    async def _write_one(self, pending: _Pending) -> Written | None:
        job, outcome = pending.running.job, pending.outcome
        repo, worker = self._rt.repo, self._rt.worker_id
        if outcome.result is Result.CANCELED:
            return await repo.mark_canceled(job.job_id, job.claim_token, worker)
        if outcome.result is Result.FAILED:
            return await repo.fail(
                job.job_id,
                job.claim_token,
                outcome.error or "error",
                retryable=outcome.retryable,
                retry_base_sec=self._rt.settings.retry_base_sec,
                worker_id=worker,
            )
        if outcome.result is Result.BACKOFF:
            holder = await repo.backoff(job, outcome.delay_sec, worker)
            return None if holder is None else Written(f"backoff ({holder} holds the key)")
        return await repo.release(
            job.job_id,
            job.claim_token,
            refund=outcome.refund,
            max_refunds=MAX_REFUNDED_HANDBACKS,
            worker_id=worker,
            reason=outcome.error or "released",
        )

    def _written(self, pending: _Pending, written: Written | None) -> None:
        """The write landed (or found the job no longer ours): the job leaves the running set."""
        if self.failed_writes:
            log.warning("outcome writes work again after %d failure(s)", self.failed_writes)
            self.failed_writes = 0
        job, outcome = pending.running.job, pending.outcome
        self._forget(pending)
        with log_context(job_id=str(job.job_id), queue=job.queue, task=job.task):
            if written is None:
                log.warning("job %s but was no longer ours", outcome.result.value)
            elif outcome.result is Result.SUCCEEDED:
                log.info("job succeeded")
            elif outcome.result is Result.FAILED:
                log.warning("job attempt failed (%s): %s", written.kind, outcome.error)
            elif outcome.result is Result.RELEASED:
                log.warning("job handed back (%s): %s", written.kind, outcome.error)
            elif outcome.result is Result.CANCELED:
                log.info("job canceled")
            if written is not None and written.collision:
                log.warning(
                    "lock_key %r shares its hashtext with the lock_key of a job that waited"
                    " for it (journalled as lock_key_collision)",
                    job.lock_key,
                )

    def _write_failed(self, pending: list[_Pending], exc: Exception) -> None:
        self.failed_writes += len(pending)
        lost_connection = isinstance(exc, CONNECTION_ERRORS)
        if not lost_connection:
            for p in pending:
                p.errors += 1
        log.warning(
            "could not write %d outcome(s), retrying: %r",
            len(pending),
            exc,
            exc_info=not lost_connection,
        )

    def _give_up(self, pending: _Pending) -> bool:
        """Whether to stop retrying a failed write: the job is no longer ours (heartbeat), or
        the process is stopping and the lease has run out (or a second signal came)."""
        running = pending.running
        expired = time.monotonic() - running.lease_extended_at > running.job.lease_ttl_sec
        if running.gone:
            why = "it is no longer ours"
        elif pending.errors >= MAX_WRITE_ERRORS:
            why = f"{pending.errors} writes failed; its lease is left to expire"
            running.gone = True  # the heartbeat stops extending it: the reaper decides
        elif self._closing and (self._hurried or expired):
            why = "the process is stopping"
        else:
            return False
        log.error(
            "giving up writing the outcome (%s) of job %s: %s",
            pending.outcome.result.value,
            running.job.job_id,
            why,
        )
        self._forget(pending)
        return True

    def _forget(self, pending: _Pending) -> None:
        job_id = pending.running.job.job_id
        if self._rt.running.get(job_id) is pending.running:
            del self._rt.running[job_id]
