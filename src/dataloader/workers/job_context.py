"""What a task's handler receives: its job, typed args, progress, checkpoints, cancellation,
resources."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sized
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel

from dataloader.core import limits
from dataloader.core.models import Stage
from dataloader.exceptions import JobCanceled, JobLost
from dataloader.storage.db import CONNECTION_ERRORS
from dataloader.storage.protocol import ClaimedJob, WorkerProtocol

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

    from dataloader.client import Client
    from dataloader.config import Settings
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
        #: The next stages the run asked for (`JobContext.then`), enqueued with its success.
        self.stages: list[Stage] = []


class ProcessAccess:
    """What a handler may reach of its process, through `app` (the `AppContext`)."""

    app: AppContext

    @property
    def engine(self) -> AsyncEngine:
        """SQLAlchemy engine of the target database (`DL_TARGET_DSN`, else the queue's)."""
        return self.app.engine

    @property
    def sessionmaker(self) -> async_sessionmaker[AsyncSession]:
        """Sessions of `engine`."""
        return self.app.sessionmaker

    @property
    def resources(self) -> Any:
        """What the startup hook returned (`Runner(startup=…)`; None without one)."""
        return self.app.resources

    @property
    def client(self) -> Client:
        """The process's client: enqueue follow-up jobs, read others."""
        return self.app.client

    @property
    def settings(self) -> Settings:
        return self.app.settings


class JobFacts:
    """What a handler may read of its job (`job`): the same for an `async def` handler's
    `JobContext` and a plain `def` handler's `ThreadContext`."""

    job: ClaimedJob

    @property
    def job_id(self) -> uuid.UUID:
        return self.job.job_id

    @property
    def resume_from(self) -> Any:
        """The last checkpoint saved with `checkpoint`, as JSON gives it back (None: start
        from the beginning). When the attempt starts, it is the one an earlier attempt saved:
        an attempt after a failure, after the reaper rescued the job from a worker that died
        or went silent, or after a client's retry continues from there (a re-run starts from
        the beginning). Once this attempt saves one, it is that one."""
        return self.job.checkpoint

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


class JobContext(ProcessAccess, JobFacts, Generic[ArgsT]):
    """Handed to `async def handler(ctx)`.

    `args` are the job's arguments (an instance of the task's model, or the dict); `attempt`
    counts from 1; `resume_from` is where an earlier attempt got to (`checkpoint`).

    Cancellation is cooperative: call `check_cancelled()` (or use `iterate`, which calls it
    between items) and the job ends `canceled`. When the job stops being ours (lease reaped,
    lock connection lost) the handler's task is cancelled outright.

    What a task may use: `engine` and `sessionmaker` (SQLAlchemy, on `DL_TARGET_DSN`, or the
    queue's database when unset), `resources` (what the process's startup hook built),
    `client` (to enqueue follow-up jobs), `settings`. `app` is the process's `AppContext`.
    """

    def __init__(
        self,
        job: ClaimedJob,
        args: ArgsT,
        *,
        app: AppContext,
        state: RunState,
        protocol: WorkerProtocol,
    ) -> None:
        self.job = job
        self.args = args
        self.app = app
        self._state = state
        self._protocol = protocol
        self.log = logging.getLogger(f"dataloader.pipeline.{job.task}")

    @property
    def cancel_requested(self) -> bool:
        return self._state.cancel_requested

    def check_cancelled(self) -> None:
        """Raise JobCanceled if cancel was requested, JobLost if the job is no longer ours."""
        if self._state.lost_reason is not None:
            raise JobLost(self._state.lost_reason)
        if self._state.cancel_requested:
            raise JobCanceled("cancel requested")

    def then(
        self,
        task: str,
        args: dict[str, Any] | BaseModel | None = None,
        *,
        lock_key: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        delay: timedelta | None = None,
        partition_key: str | None = None,
    ) -> None:
        """Enqueue a job of `task` with `args` once this one succeeds, in the same transaction
        as the success: if this attempt fails or is cancelled, nothing of it is written (a
        retry asks again), and a job that ends failed names the stages it stopped before in
        its journal (`stopped_before`). Its lock_key and partition_key are this job's unless
        given; its queue the stage task's own, else this job's. Call it any number of times:
        the stages are enqueued in order. InvalidJob at once for args that are not a JSON
        object."""
        if isinstance(args, BaseModel):
            args = args.model_dump(mode="json")
        self._state.stages.append(
            Stage(
                task,
                args or {},
                lock_key=lock_key,
                queue=queue,
                priority=priority,
                delay=delay,
                partition_key=partition_key,
            )
        )

    async def set_progress(self, progress: dict[str, Any] | None = None, **fields: Any) -> None:
        """Replace the job's `progress` (any JSON object); also learns of a cancel request."""
        value = {**(progress or {}), **fields}
        await self._write(self._protocol.set_progress, limits.args_json(value))

    async def checkpoint(self, value: Any) -> None:
        """Save a resumable cursor (any JSON value: a row id, a date, a dict, a pydantic
        model; None clears it): an attempt that follows a failure, a crash or a hand-back
        reads it as `resume_from`. Save it after the work it stands for is committed, so that
        resuming repeats at most what came after it.

        Fenced like every write of the run: raises JobLost, and changes nothing, once the job
        is no longer this run's (its lease was reaped, it was handed back). A value that is
        not JSON or is larger than DL_MAX_RESULT_BYTES raises ValueError and is not saved."""
        text = limits.result_json(value, self.app.settings.max_result_bytes, "the checkpoint")
        await self._write(self._protocol.set_checkpoint, text)
        # as the next attempt will read it back: JSON, not the object given
        self.job = replace(self.job, checkpoint=None if text is None else json.loads(text))

    async def _write(self, statement: Any, value_json: str | None) -> None:
        """Run a fenced write of this run. A connection lost on the way (a server restart, a
        terminated session) is retried a few times on a new one: the write is idempotent, and
        a brief outage of the queue's database is no fault of the job's."""
        for pause in (*PROGRESS_RETRY_PAUSES_SEC, None):
            try:
                cancel = await statement(self.job.job_id, self.job.claim_token, value_json)
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
