"""Batch handlers: one call of a task's handler for up to `batch_size` jobs of it.

    @dataloader.task("emails.send", queue="emails", args=Email, batch_size=100)
    async def send_emails(batch: dataloader.Batch[Email]) -> None:
        for item in batch:
            try:
                await mailer.send(item.args)
            except MailerBusy as exc:
                batch.retry(item, after=30, error=str(exc))
            else:
                batch.done(item, {"sent": True})

Each job of a batch is still a job of its own: claimed, locked on its lock_key, fenced on its
claim token, and settled on its own. The handler settles each one: `done` (with a result),
`retry` (after a delay it chooses, or the task's retry policy's), or `fail` (for good). Each
settlement is queued for writing at once, so a job settled early stays settled whatever
happens to the rest of the batch. What the handler leaves unsettled is decided when it returns
or raises, by the rules of a single job: retried when it returns (`left unsettled`), failed
with its exception when it raises (retried unless the error is non-retryable), handed back
with the attempt refunded when the worker stops or loses the batch's jobs.

The worker counts what the handler settled (`HandlerStats`: processed, errors, retried,
duration, last error); a handler has nothing to count or return.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from dataloader.core import limits
from dataloader.core.handler_stats import HandlerStats as HandlerStats  # still importable from here
from dataloader.core.retry import seconds
from dataloader.core.transitions import Ended, Outcome
from dataloader.storage.protocol import ClaimedJob
from dataloader.workers.job_context import ProcessAccess

if TYPE_CHECKING:
    from dataloader.context import AppContext

ArgsT = TypeVar("ArgsT")


@dataclass(frozen=True, slots=True)
class BatchItem(Generic[ArgsT]):
    """One job of a batch: its id, its args (an instance of the task's model, or the dict)
    and its claim (`job`: attempt, lock_key, claim token...)."""

    job: ClaimedJob
    args: ArgsT

    @property
    def job_id(self) -> uuid.UUID:
        return self.job.job_id

    @property
    def attempt(self) -> int:
        """1 on the first run, 2 on the first retry..."""
        return self.job.attempt

    @property
    def max_attempts(self) -> int:
        return self.job.max_attempts


#: Called with each job's outcome as the handler settles it (the worker queues its write).
Settle = Callable[[ClaimedJob, Outcome], None]


class Batch(ProcessAccess, Generic[ArgsT]):
    """Handed to `async def handler(batch)` of a task declared with `batch_size`: iterate it
    for its jobs (`BatchItem`), settle each with `done`, `retry` or `fail`.

    `engine`, `sessionmaker`, `resources`, `client` and `settings` are those a single job's
    `JobContext` offers. A job whose cancel was requested since the claim shows it in
    `cancel_requested(item)`; settling it is the handler's choice (`fail` it, or finish it).
    A batch holds one job at least."""

    def __init__(
        self,
        items: list[BatchItem[ArgsT]],
        *,
        app: AppContext,
        settle: Settle,
        cancel_requested: Callable[[uuid.UUID], bool],
        max_result_bytes: int,
    ) -> None:
        self.items = items
        self.app = app
        self.log = logging.getLogger(f"dataloader.pipeline.{items[0].job.task}")
        self._settle = settle
        self._cancel_requested = cancel_requested
        self._max_result_bytes = max_result_bytes
        self._open = {item.job_id: item for item in items}
        self._started = time.monotonic()
        self.stats = HandlerStats()

    def __iter__(self) -> Iterator[BatchItem[ArgsT]]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def unsettled(self) -> list[BatchItem[ArgsT]]:
        """The jobs not settled yet, in the batch's order."""
        return list(self._open.values())

    def cancel_requested(self, item: BatchItem[ArgsT]) -> bool:
        """Whether a client asked to cancel this job since it was claimed."""
        return self._cancel_requested(item.job_id)

    def done(self, item: BatchItem[ArgsT], result: Any = None) -> None:
        """The job succeeded; `result` (JSON, at most DL_MAX_RESULT_BYTES) is stored as its
        result. A result that cannot be stored fails the job instead, and says why."""
        try:
            text = limits.result_json(result, self._max_result_bytes)
        except ValueError as problem:
            self._close(item, Outcome(Ended.FAILED, f"result: {problem}", retryable=False))
            return
        self._close(item, Outcome(Ended.SUCCEEDED, result=text))

    def retry(
        self,
        item: BatchItem[ArgsT],
        *,
        after: float | timedelta | None = None,
        at: datetime | None = None,
        error: str = "the batch handler asked to retry it",
    ) -> None:
        """Try the job again: `after` a delay, `at` an instant (reckoned as a delay on this
        process's clock), or after the task's retry policy's delay when neither is given. The
        attempt counts: with none left, the job fails."""
        if after is not None and at is not None:
            raise ValueError("give after or at, not both")
        delay = None
        if after is not None:
            delay = seconds(after, "retry(after=…)")
        elif at is not None:
            if at.utcoffset() is None:
                raise ValueError("retry(at=…) must have a time zone offset")
            delay = max(0.0, (at - datetime.now(at.tzinfo)).total_seconds())
        self._close(item, Outcome(Ended.FAILED, error, retry_after_sec=delay))

    def fail(self, item: BatchItem[ArgsT], error: str) -> None:
        """The job failed for good: no further attempt."""
        self._close(item, Outcome(Ended.FAILED, error, retryable=False))

    def _close(self, item: BatchItem[ArgsT], outcome: Outcome) -> None:
        if self._open.pop(item.job_id, None) is None:
            if any(i.job_id == item.job_id for i in self.items):
                raise ValueError(f"job {item.job_id} of this batch is settled already")
            raise ValueError(f"job {item.job_id} is not in this batch")
        outcome.duration_ms = round((time.monotonic() - self._started) * 1000)
        count(self.stats, outcome, item.job)
        self._settle(item.job, outcome)

    def close_all(self, outcome_of: Callable[[ClaimedJob], Outcome]) -> None:
        """Settle every job left open with the outcome `outcome_of` gives it (the worker,
        once the handler has returned or raised), and stop the clock."""
        for item in self.unsettled:
            self._close(item, outcome_of(item.job))
        self.stats.duration_sec = time.monotonic() - self._started


def count(stats: HandlerStats, outcome: Outcome, job: ClaimedJob) -> None:
    """Add one job's settlement to `stats` (a job handed back, its attempt refunded because
    the worker stops or lost it, is retried without an error of its own)."""
    if outcome.ended is Ended.SUCCEEDED:
        stats.processed += 1
    elif outcome.ended is Ended.HANDED_BACK:
        stats.retried += 1
    else:
        stats.errors += 1
        stats.last_error = outcome.error
        if outcome.ended is Ended.FAILED and outcome.retryable and job.attempt < job.max_attempts:
            stats.retried += 1
