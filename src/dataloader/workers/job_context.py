"""What a pipeline handler receives: its job, typed args, progress, cancellation, resources."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sized
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from dataloader.exceptions import JobCanceled, JobLost
from dataloader.storage.db import CONNECTION_ERRORS
from dataloader.storage.repositories import ClaimedJob

if TYPE_CHECKING:
    from dataloader.context import AppContext

ArgsT = TypeVar("ArgsT")

#: Pauses before each new try of a progress write whose connection was lost.
PROGRESS_RETRY_PAUSES_SEC = (0.05, 0.2, 0.5, 1.0)
T = TypeVar("T")


class RunState:
    """Flags the worker flips while a job runs; the pipeline observes them."""

    def __init__(self) -> None:
        self.cancel_requested = False
        self.lost_reason: str | None = None


class JobContext(Generic[ArgsT]):
    """Handed to `async def handler(ctx)`.

    Cancellation is cooperative: call `check_cancelled()` (or use `iterate`, which calls it
    between items) and the job ends `canceled`. When the job stops being ours (lease reaped,
    lock connection lost) the handler's task is cancelled outright.

    `app` is the process's `AppContext`: its asyncpg `pool` and SQLAlchemy `engine` /
    `sessionmaker` all connect to the queue's own database (`DL_DB_DSN` or the embedded one),
    not to some other target: a pipeline loading into another database opens its own engine.
    """

    def __init__(
        self,
        job: ClaimedJob,
        args: ArgsT,
        *,
        app: AppContext,
        state: RunState,
    ) -> None:
        self.job = job
        self.args = args
        self.app = app
        self._state = state
        self.log = logging.getLogger(f"dataloader.pipeline.{job.task}")

    @property
    def job_id(self) -> uuid.UUID:
        return self.job.job_id

    @property
    def attempt(self) -> int:
        """1 on the first run, 2 on the first retry..."""
        return self.job.attempt

    @property
    def claim_seq(self) -> int:
        """How many times the job was claimed, this run included (informative: after a
        failover to an asynchronous standby a number may be handed out again; fence on
        `claim_token`)."""
        return self.job.claim_seq

    @property
    def claim_token(self) -> uuid.UUID:
        """This run's fencing token: the job row's `claim_token` while the run owns the job,
        drawn at random by each claim, so no other run ever shares it. A pipeline writing
        elsewhere fences its own writes on it: in the transaction of those writes,
        `SELECT 1 FROM dl_jobs WHERE job_id = … AND status = 'running' AND claim_token = …
        FOR SHARE`, and write only if the row is there (FOR SHARE keeps the reaper from taking
        the job until the transaction ends; keep such transactions shorter than the lease)."""
        return self.job.claim_token

    @property
    def cancel_requested(self) -> bool:
        return self._state.cancel_requested

    def check_cancelled(self) -> None:
        """Raise JobCanceled if cancel was requested, JobLost if the job is no longer ours."""
        if self._state.lost_reason is not None:
            raise JobLost(self._state.lost_reason)
        if self._state.cancel_requested:
            raise JobCanceled("cancel requested")

    async def set_progress(self, progress: dict[str, Any] | None = None, **fields: Any) -> None:
        """Replace the job's `progress` (any JSON object); also learns of a cancel request.

        A connection lost on the way (a server restart, a terminated session) is retried a few
        times on a new one: the write is idempotent, and a brief outage of the queue's
        database is no fault of the job's."""
        value = {**(progress or {}), **fields}
        for pause in (*PROGRESS_RETRY_PAUSES_SEC, None):
            try:
                cancel = await self.app.repo.set_progress(
                    self.job.job_id, self.job.claim_token, value
                )
                break
            except CONNECTION_ERRORS:
                if pause is None:
                    raise
                await asyncio.sleep(pause)
        if cancel is None:
            self._state.lost_reason = self._state.lost_reason or "job is no longer ours"
            raise JobLost(self._state.lost_reason)
        self._state.cancel_requested = self._state.cancel_requested or cancel

    async def iterate(
        self, items: Iterable[T] | AsyncIterable[T], total: int | None = None
    ) -> AsyncIterator[T]:
        """Yield items (chunks), checking cancellation before each and writing progress
        `{done, total}` after each."""
        if total is None and isinstance(items, Sized):
            total = len(items)
        done = 0
        self.check_cancelled()
        async for item in _aiter(items):
            self.check_cancelled()
            yield item
            done += 1
            await self.set_progress(done=done, total=total)


async def _aiter(items: Iterable[T] | AsyncIterable[T]) -> AsyncIterator[T]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item
