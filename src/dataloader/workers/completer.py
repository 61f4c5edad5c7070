"""Finishing jobs: release the advisory lock, then write the outcome.

Successes — the hot path — are batched: a job that succeeds joins the batch being collected and
its slot is free at once; one flush unlocks all of the batch's keys in one round trip and marks
them succeeded in one statement. A flush starts as soon as the previous one is done, so an idle
worker adds no delay and a busy one writes many jobs per commit, while its slots already run
the next jobs. Until the flush, the job is still `running` with a live lease: a crash in
between only means the job runs again (at-least-once). Other outcomes are rare and written one
by one, holding their slot until written.

The lock is released before the status is written: a job waiting on the same lock_key is not
claimable until the status write, and then finds the key free (no needless backoff).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from dataloader.logger import log_context
from dataloader.storage.db import CONNECTION_ERRORS
from dataloader.storage.repositories import ClaimedJob
from dataloader.workers.runtime import RunningJob, WorkerRuntime

log = logging.getLogger(__name__)

#: Successes waiting for a flush beyond which a finishing job waits for the flush.
MAX_PENDING = 5000


class Result(Enum):
    SUCCEEDED = "succeeded"
    CANCELED = "canceled"
    FAILED = "failed"
    RELEASED = "released"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a run ended."""

    result: Result
    error: str | None = None
    retryable: bool = True
    refund: bool = False


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
        self._batch: list[ClaimedJob] = []
        self._flusher: asyncio.Task[None] | None = None

    async def finish(self, running: RunningJob, outcome: Outcome) -> None:
        """Unlock and record. A success is only queued for the next flush (unless too many
        are pending already); other outcomes are written before this returns."""
        if outcome.result is not Result.SUCCEEDED:
            await self._rt.locks.unlock([running.job.lock_hash])
            await self._record_one(running, outcome)
            self._on_written(running.job.queue)
            return
        self._batch.append(running.job)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_all(), name="dataloader-completer")
        elif len(self._batch) >= self._max_pending:
            await self.wait_flushed()  # back-pressure: the database is slower than the jobs

    async def wait_flushed(self) -> None:
        """Return once every queued success is written (or could not be)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.wait([self._flusher])  # never cancels or re-raises the shared flush

    async def _flush_all(self) -> None:
        while self._batch:
            batch, self._batch = self._batch, []
            try:
                await self._flush(batch)
            except Exception as exc:  # keep flushing later batches; leases cover this one
                log.error("flushing %d succeeded job(s) failed", len(batch), exc_info=exc)
            for queue in {job.queue for job in batch}:
                self._on_written(queue)  # a job waiting on a lock_key may be claimable now

    async def _flush(self, jobs: list[ClaimedJob]) -> None:
        await self._rt.locks.unlock(job.lock_hash for job in jobs)
        try:
            ours = await self._rt.repo.complete_many(
                [(job.job_id, job.claim_seq) for job in jobs], self._rt.worker_id
            )
        except Exception as exc:
            # The leases will expire and the reaper will requeue the jobs (at-least-once).
            log.error(
                "could not record %d succeeded job(s): %r",
                len(jobs),
                exc,
                exc_info=not isinstance(exc, CONNECTION_ERRORS),
            )
            return
        for job in jobs:
            with log_context(job_id=str(job.job_id), queue=job.queue, task=job.task):
                if job.job_id in ours:
                    log.info("job succeeded")
                else:
                    log.warning("job finished but was no longer ours")

    async def _record_one(self, running: RunningJob, outcome: Outcome) -> None:
        job, repo, worker = running.job, self._rt.repo, self._rt.worker_id
        try:
            if outcome.result is Result.CANCELED:
                written = await repo.mark_canceled(job.job_id, job.claim_seq, worker)
                log.info("job canceled" if written else "job stopped but was no longer ours")
            elif outcome.result is Result.FAILED:
                kind = await repo.fail(
                    job.job_id,
                    job.claim_seq,
                    outcome.error or "error",
                    retryable=outcome.retryable,
                    retry_base_sec=self._rt.settings.retry_base_sec,
                    worker_id=worker,
                )
                log.warning("job attempt failed (%s): %s", kind or "not ours", outcome.error)
            else:
                kind = await repo.release(
                    job.job_id,
                    job.claim_seq,
                    refund=outcome.refund,
                    worker_id=worker,
                    reason=outcome.error or "released",
                )
                log.warning("job handed back (%s): %s", kind or "not ours", outcome.error)
        except Exception as exc:
            # The lease will expire and the reaper will requeue the job.
            log.error(
                "could not record the job's outcome (%s): %r",
                outcome.result.value,
                exc,
                exc_info=not isinstance(exc, CONNECTION_ERRORS),
            )
