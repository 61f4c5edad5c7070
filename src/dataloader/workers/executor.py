"""Running a task: one call of its handler, for a single job or a batch, and what it ended as.

    running job ─► args, context ─► handler call ─► (returned | raised | cancelled) ─► Outcome
                                    under timeout, stopped with the job

The worker (`workers.base`) and `dataloader.testing` run a task through the same `Executor`:
they differ only in what they hand it (the process's `AppContext` and `WorkerProtocol`, or
stand-ins in memory) and in what they do with the `Outcome` (the completer writes it, the
test helper decides it in memory). Claims, slots, locks and writes are not its business.

The call itself is not tied to a task's handler: `start_call` runs any handler's coroutine as
the job's asyncio task, cancelled after its timeout (TaskTimeout) or when the job stops being
ours (`RunningJob.lose`, `RunningJob.hand_back`: the stop signal); `call_outcome` turns how it
ended into an `Outcome`, by rules shared by every kind of handler (`cut_short`, `raised`), the
returned value by the caller's own rule (`returned`). A task's handler's value is its JSON
result (refused, failing the attempt at once, when it is not JSON or exceeds
DL_MAX_RESULT_BYTES: never cut).

A batched task's handler (`batch_size`) is called once for its jobs (`Executor.execute_batch`),
which it settles itself (`workers.batches.Batch`); the jobs it leaves open are settled here,
by the same rules, once it has returned or raised.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

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
from dataloader.logger.utils import mask_text
from dataloader.storage.db import storable_text
from dataloader.tasks import Task
from dataloader.workers.batches import Batch, BatchItem, HandlerStats, Settle, count
from dataloader.workers.job_context import JobContext
from dataloader.workers.runtime import RunningJob
from dataloader.workers.stages import stage_jobs, stages_of
from dataloader.workers.threaded import ThreadContext, in_thread, task_threads

if TYPE_CHECKING:
    from dataloader.context import AppContext
    from dataloader.storage.protocol import WorkerProtocol
    from dataloader.workers.processes import ProcessSteps

log = logging.getLogger(__name__)

#: Longest error text stored in `dl_jobs.error`.
MAX_ERROR_CHARS = 4000
#: Longest traceback kept in the journal (its end: the frames nearest the error).
MAX_TRACEBACK_CHARS = 16_000

#: Turns what a handler returned, and how long its call took (ms), into an outcome.
Returned = Callable[[object, int], Outcome]


class Executor:
    """Runs tasks' handlers for a worker's jobs (or an inline run's): builds each job's
    context from `app` (what the handler may reach) and `protocol` (where its progress and
    checkpoints are written), and bounds results to `max_result_bytes`. With `build_stages`, a
    success's next stages are built as jobs (`RunningJob.stages`), with the checks of any
    enqueue (through `app.client`); without, only named in the outcome (a run without a
    database).

    One executor serves every job of its worker: nothing in it belongs to a single run."""

    def __init__(
        self,
        *,
        app: AppContext,
        protocol: WorkerProtocol,
        max_result_bytes: int,
        build_stages: bool = True,
        threads: ThreadPoolExecutor | None = None,
    ) -> None:
        self.app = app
        self.protocol = protocol
        self.max_result_bytes = max_result_bytes
        self.build_stages = build_stages
        # bound once: a run passes it along without making one
        self._returned: Returned = self._result
        self._steps: ProcessSteps | None = None
        self._threads_given = threads
        self._own_threads: ThreadPoolExecutor | None = None

    def _threads(self) -> ThreadPoolExecutor:
        """The threads plain `def` handlers run in: the worker process's, else (an inline
        run) this executor's own, made at the first such handler."""
        if self._threads_given is not None:
            return self._threads_given
        if self._own_threads is None:
            self._own_threads = task_threads(self.app.settings.task_threads)
        return self._own_threads

    @staticmethod
    def _loop() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def _process_steps(self) -> ProcessSteps:
        """The runner of durable processes' tasks (made at the first one)."""
        if self._steps is None:
            # here, not at the top: the process steps run their calls with this module's rules
            from dataloader.workers.processes import ProcessSteps

            self._steps = ProcessSteps(self.protocol.db, self.max_result_bytes)
        return self._steps

    async def execute(self, task: Task | None, running: RunningJob) -> Outcome:
        """Run `task` (None: no task of the job's name is registered here) for the job of
        `running` and return what it ended as: with its next stages, and their jobs built
        (`running.stages`) when it succeeded. Stopped by `running` (see `start_call`)."""
        job = running.job
        if task is None:
            # retryable: during a rolling deploy another replica may know the task
            return Outcome(Ended.FAILED, f"no task registered as {job.task!r}")
        if task.process is not None:
            return await self._process_steps().execute(task, running)
        try:
            args = task.parse_args(job.args)
            ctx = JobContext(job, args, app=self.app, state=running.state, protocol=self.protocol)
            call = (
                in_thread(self._threads(), task.handler, ThreadContext(ctx, self._loop()))
                if task.threaded
                else task.handler(ctx)
            )
            pipeline = start_call(
                running,
                call,
                timeout_sec=task.timeout_sec,
                name=f"dataloader-pipeline-{job.job_id}",
            )
        except InvalidJobArgs as exc:
            return Outcome(Ended.FAILED, f"invalid args: {exc}", retryable=False)
        except Exception as exc:  # a broken args model or handler: retrying cannot help
            log.error("task could not start", exc_info=exc)
            return Outcome(Ended.FAILED, error_text(exc), retryable=False)
        started = time.monotonic()
        await asyncio.wait([pipeline])
        duration_ms = round((time.monotonic() - started) * 1000)
        outcome = call_outcome(running, task.non_retryable, duration_ms, self._returned)
        return self._with_stages(running, task, outcome)

    def _result(self, value: object, duration_ms: int) -> Outcome:
        """A handler's return value as the job's stored result: JSON within the limit."""
        try:
            result = limits.result_json(value, self.max_result_bytes)
        except Exception as problem:  # never a cut: the attempt fails, and says why
            why = str(problem) if isinstance(problem, ValueError) else error_text(problem)
            return Outcome(Ended.FAILED, f"result: {why}", retryable=False, duration_ms=duration_ms)
        return Outcome(Ended.SUCCEEDED, result=result, duration_ms=duration_ms)

    def _with_stages(self, running: RunningJob, task: Task, outcome: Outcome) -> Outcome:
        """The outcome with the next stages it enqueues (a success: `running.stages`) or
        stops before (a failure). A stage that cannot be enqueued (args its task refuses)
        fails the job: retrying would make the same stage."""
        stages = stages_of(task, running.state.stages, outcome.result)
        if not stages:
            return outcome
        names = tuple(stage.task for stage in stages)
        if outcome.ended is not Ended.SUCCEEDED or not self.build_stages:
            return replace(outcome, stages=names)
        try:
            running.stages = stage_jobs(running.job, stages, self.app.client)
        except (InvalidJob, InvalidJobArgs) as exc:
            why = f"next stage: {exc}"
            return Outcome(
                Ended.FAILED, why, retryable=False, duration_ms=outcome.duration_ms, stages=names
            )
        return replace(outcome, stages=names)

    async def execute_batch(
        self, task: Task, runs: list[RunningJob], settle: Settle
    ) -> HandlerStats:
        """Call a batched task's handler once for `runs` (jobs whose args break the task's
        model fail at once, without it) and settle every job through `settle`, as the handler
        settles it, the others once it has ended; returns what the call did. Stopped, for all
        of them, by any of `runs` (see `RunningJob.on_stop`)."""
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
            app=self.app,
            settle=settle,
            cancel_requested=lambda job_id: by_id[job_id].state.cancel_requested,
            max_result_bytes=self.max_result_bytes,
        )
        try:
            coro = task.handler(batch)
            pipeline: asyncio.Task[object] = asyncio.create_task(
                coro if task.timeout_sec is None else within_timeout(coro, task.timeout_sec),
                name=f"dataloader-batch-{items[0].job_id}",
            )
        except Exception as exc:  # a handler that is not a coroutine function: retrying cannot help
            log.error("batch handler could not start", exc_info=exc)
            failed = Outcome(Ended.FAILED, error_text(exc), retryable=False)
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


# --- a handler's call, whatever the handler -----------------------------------------------------


def start_call(
    running: RunningJob,
    coro: Coroutine[Any, Any, object],
    *,
    timeout_sec: float | None,
    name: str,
) -> asyncio.Task[object]:
    """Run `coro`, a handler's call for the job of `running`, as the job's asyncio task
    (`running.task`): cancelled after `timeout_sec` (it then fails with TaskTimeout), or when
    the job stops being ours (at once if it has already). Await it, then `call_outcome`."""
    pipeline: asyncio.Task[object] = asyncio.create_task(
        coro if timeout_sec is None else within_timeout(coro, timeout_sec), name=name
    )
    running.attach(pipeline)
    return pipeline


def call_outcome(
    running: RunningJob,
    non_retryable: tuple[type[BaseException], ...],
    duration_ms: int,
    returned: Returned,
) -> Outcome:
    """What the ended call of `running` (`start_call`) ended as: `returned` says what its
    value makes; an exception or a cancellation ends it by the rules of every handler
    (`raised`, with `non_retryable` the handler's own types of final errors; `cut_short`)."""
    pipeline = running.task
    assert pipeline is not None
    if pipeline.cancelled():
        return cut_short(running, duration_ms)
    exc = pipeline.exception()
    if exc is None:
        return returned(pipeline.result(), duration_ms)
    return raised(exc, non_retryable, duration_ms)


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


def cut_short(running: RunningJob, duration_ms: int | None) -> Outcome:
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


def raised(
    exc: BaseException, non_retryable: tuple[type[BaseException], ...], duration_ms: int | None
) -> Outcome:
    """A run whose task raised `exc` (`non_retryable`: the task's own final error types)."""
    if isinstance(exc, JobCanceled):
        return Outcome(Ended.CANCELED, duration_ms=duration_ms)
    if isinstance(exc, JobLost):
        return Outcome(Ended.HANDED_BACK, str(exc), refund=True, duration_ms=duration_ms)
    text = error_text(exc)
    if isinstance(exc, Retry):
        return Outcome(
            Ended.FAILED, text, retry_after_sec=exc.after_sec, duration_ms=duration_ms, raised=exc
        )
    retryable = not isinstance(exc, (NonRetryableError, *non_retryable))
    return Outcome(
        Ended.FAILED,
        text,
        retryable=retryable,
        duration_ms=duration_ms,
        raised=exc,
        traceback=traceback_text(exc),
    )


def traceback_text(exc: BaseException) -> str:
    """The traceback of `exc` as the log would show it, secrets masked as the log masks them,
    its last MAX_TRACEBACK_CHARS characters at most, storable in jsonb."""
    text = mask_text("".join(traceback.format_exception(exc)).rstrip())
    if len(text) > MAX_TRACEBACK_CHARS:
        text = "…" + text[-MAX_TRACEBACK_CHARS + 1 :]
    return storable_text(text)


def error_text(exc: BaseException) -> str:
    """`Type: message`, storable in a text column (no NUL, no lone surrogate, bounded)."""
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable error>"
    text = f"{type(exc).__name__}: {message}"[:MAX_ERROR_CHARS]
    return storable_text(text)


# --- a batch's call -----------------------------------------------------------------------------


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
        return cut_short(running, 0)
    exc = pipeline.exception()
    if exc is None:
        return Outcome(Ended.FAILED, "left unsettled by the batch handler")
    return raised(exc, task.non_retryable, None)


def _merged(first: HandlerStats, then: HandlerStats) -> HandlerStats:
    """`then` (the handler's call) with the jobs settled before it (`first`) added."""
    then.processed += first.processed
    then.errors += first.errors
    then.retried += first.retried
    if then.last_error is None:
        then.last_error = first.last_error
    return then
