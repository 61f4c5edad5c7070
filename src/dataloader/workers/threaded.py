"""Plain `def` tasks: a synchronous handler (a database driver, pandas, an HTTP client) runs in a
worker thread, so that it never holds the event loop that runs the process's other jobs.

Its context, `ThreadContext`, offers what `JobContext` offers, synchronously: each write
(progress, checkpoint) is handed to the worker's loop and waited for, so it is fenced and retried
as an `async def` handler's is. A thread cannot be interrupted: cancellation is cooperative. A
cancel request, a timeout, a lost job or a stop makes `check_cancelled` (and `iterate`, between
items) raise; until the handler returns, its job keeps its slot, its lease and its lock_key, so
that it never runs twice at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sized
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from dataloader.exceptions import JobCanceled
from dataloader.workers.job_context import ArgsT, JobContext, JobFacts, ProcessAccess

T = TypeVar("T")

#: Why a plain `def` handler's `check_cancelled` raises once its run is being stopped (a
#: timeout, a hand-back at shutdown) without a cancel request or a lost lease.
STOPPED = "the run is being stopped (a timeout or the worker's stop)"


class ThreadContext(ProcessAccess, JobFacts, Generic[ArgsT]):
    """Handed to a plain `def handler(ctx)`, in its worker thread: the job, its args,
    `set_progress`, `checkpoint`, `then`, `check_cancelled`, `iterate` and the process's
    resources, as `JobContext` has them, without `await`. `run(coro)` runs a coroutine of the
    process (its client, an async engine) on the worker's loop and returns its result."""

    def __init__(self, inner: JobContext[ArgsT], loop: asyncio.AbstractEventLoop) -> None:
        self._inner = inner
        self._loop = loop
        self.app = inner.app
        self.job = inner.job
        self.args: ArgsT = inner.args
        self.log: logging.Logger = inner.log
        #: Set by the worker when the run is being stopped: `check_cancelled` raises.
        self.stopping = False

    @property
    def cancel_requested(self) -> bool:
        return self._inner.cancel_requested

    def check_cancelled(self) -> None:
        """Raise JobCanceled if cancel was requested (or the run is being stopped), JobLost if
        the job is no longer ours: call it often, as a thread cannot be stopped otherwise."""
        self._inner.check_cancelled()
        if self.stopping:
            raise JobCanceled(STOPPED)

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
        """As `JobContext.then` (the stages are this run's own: a list the loop reads once the
        handler has returned)."""
        self._inner.then(
            task,
            args,
            lock_key=lock_key,
            queue=queue,
            priority=priority,
            delay=delay,
            partition_key=partition_key,
        )

    def set_progress(self, progress: dict[str, Any] | None = None, **fields: Any) -> None:
        """As `JobContext.set_progress`, waited for."""
        self.run(self._inner.set_progress(progress, **fields))

    def checkpoint(self, value: Any) -> None:
        """As `JobContext.checkpoint`, waited for."""
        self.run(self._inner.checkpoint(value))
        self.job = self._inner.job  # its checkpoint, as the next attempt reads it

    def iterate(self, items: Iterable[T], total: int | None = None) -> Iterator[T]:
        """Yield items (chunks), checking cancellation before each and writing progress
        `{done, total}` after each."""
        if total is None and isinstance(items, Sized):
            total = len(items)
        self.check_cancelled()
        for done, item in enumerate(items, start=1):
            self.check_cancelled()
            yield item
            self.set_progress(done=done, total=total)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the worker's event loop and return its result (from the handler's
        thread only: the loop must be free to run it)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()


async def in_thread(
    threads: ThreadPoolExecutor, handler: Callable[[Any], object], ctx: ThreadContext[Any]
) -> object:
    """Call the plain `def` `handler(ctx)` in one of `threads` (with the caller's context
    variables: the job's log fields) and return what it returns. Cancelling this coroutine
    (a timeout, a lost job, a hand-back) asks the handler to stop (`ctx.stopping`) and waits
    for it to return: the thread cannot be stopped, and the job must not be released, nor run
    elsewhere, while it runs. The cancellation is raised once it has returned."""
    loop = asyncio.get_running_loop()
    call = loop.run_in_executor(threads, contextvars.copy_context().run, handler, ctx)
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        ctx.stopping = True
        while not call.done():
            try:
                await asyncio.shield(call)
            except asyncio.CancelledError:
                continue  # a second stop: still waiting for the thread
            except BaseException:
                break  # what it raised no longer matters: the run is cancelled
        raise


def task_threads(size: int) -> ThreadPoolExecutor:
    """The threads plain `def` handlers run in: at most `size` at once (`DL_TASK_THREADS`);
    a handler beyond them waits for one, its job running meanwhile."""
    return ThreadPoolExecutor(max_workers=size, thread_name_prefix="dataloader-task")
