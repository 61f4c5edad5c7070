"""Running a task of a durable process: read the process, call its processor, decide the save.

    claimed task ─► process + last events ─► before_step ─┬─ run ─► processor (attempts,
                                                          │        each under the step timeout)
                                                          ├─ remove ─► removal
                                                          └─ gone, stale timer, in error, zombie
                    ─► Outcome of the task's job, with the process's save as its effect

A task is a job of its namespace's queue: the worker claims it, locks its lock_key (the
process's own: one task of a process at a time), keeps its lease alive and writes its outcome
as any job's (`workers.base`, the completer). What differs is the call and what the outcome
carries: the processor gets the task and the process, and its result becomes a
`storage.processes.StepSave`, written in the transaction of the task's end, only if that
write passes the task's fence. So a step that lost its claim writes nothing, and a process
never shows a step whose task did not end.

A processor that raises is called again in the same claim (the process's other tasks wait
behind it, in order), `attempts` times in all, after the delays of the namespace's retry
policy; then the process goes to `error`. A step that outruns the step timeout, or whose
earlier attempt died half-way (a second claim of the task), is a zombie, unless the processor
is idempotent (`core.processes.before_step`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Final

from dataloader import metrics
from dataloader.core.models import NewJob
from dataloader.core.processes import (
    ZOMBIE_DETAIL,
    Before,
    Namespace,
    Process,
    ProcessResult,
    ProcessTask,
    Refusal,
    StepWrite,
    TaskArgs,
    TaskKind,
    after_step,
    before_step,
    lock_key_of,
    on_failure,
    on_removal,
    on_zombie,
    priority_of,
    refused_error,
    task_name_of,
)
from dataloader.core.retry import Linear, delay_of
from dataloader.core.transitions import Ended, Outcome
from dataloader.exceptions import NonRetryableError, Retry, TaskTimeout
from dataloader.storage.connections import Connections
from dataloader.storage.db import CONNECTION_ERRORS
from dataloader.storage.processes import StepInput, StepSave, step_input
from dataloader.tasks import Task
from dataloader.workers.executor import (
    cut_short,
    error_text,
    start_call,
    traceback_text,
    within_timeout,
)
from dataloader.workers.runtime import RunningJob

log = logging.getLogger(__name__)

#: Delays between a processor's attempts when its namespace names no retry policy.
DEFAULT_RETRY: Final = Linear(1.0)

#: The tasks that end canceled without running, and their error.
_NOT_RUN: Final = {
    Before.GONE: refused_error(Refusal.NOT_FOUND, "the process was removed before the task ran"),
    Before.STALE_TIMER: "the timer was replaced or unset before it fired",
}

#: The tasks that fail without running, refused by their process's state as they would have
#: been at submit, and their error.
_REFUSED: Final = {
    Before.IN_ERROR: refused_error(Refusal.IN_ERROR, "the process is in error: only a repair runs"),
    Before.NOT_IN_ERROR: refused_error(
        Refusal.NOT_IN_ERROR, "the process is not in error (repaired already): nothing to repair"
    ),
}


class ProcessSteps:
    """Runs the tasks of durable processes for a worker: reads each process on
    `connections`, bounds what a step stores to `max_result_bytes`."""

    def __init__(self, connections: Connections, max_result_bytes: int) -> None:
        self._connections = connections
        self._max_bytes = max_result_bytes

    async def execute(self, task: Task, running: RunningJob) -> Outcome:
        """Run the task of `running` (a job of `task`, a namespace's processor) and return
        the outcome of its job, with the process's save as its effect."""
        namespace = task.process
        assert namespace is not None
        job = running.job
        try:
            args = TaskArgs.of_job(job.args)
        except ValueError as exc:
            return Outcome(Ended.FAILED, f"invalid args: {exc}", retryable=False)
        if job.lock_key is None:  # enqueued by hand, without its process's key
            return Outcome(Ended.FAILED, "a process's task needs its lock_key", retryable=False)
        try:
            async with self._connections.connection() as conn:
                found = await step_input(
                    conn, args.process_ref, namespace.history, job.job_id, job.lock_key
                )
        except CONNECTION_ERRORS as exc:
            # nothing of the step ran: back to the queue with the attempt refunded (a second
            # attempt would be taken for a zombie's)
            return Outcome(
                Ended.HANDED_BACK,
                f"the process could not be read ({exc!r}); the step did not run",
                refund=True,
            )
        if found is not None and found.busy:
            # claimed beside another task of its process, whose save is not in yet: back to
            # the queue (attempt refunded), behind that task
            return Outcome(
                Ended.BACKED_OFF, "another task of the process runs", holder="running job"
            )
        facts = None if found is None else found.facts
        before = before_step(facts, args, job.job_id, job.attempt, idempotent=namespace.idempotent)
        if before in _NOT_RUN:
            return Outcome(Ended.CANCELED, _NOT_RUN[before])
        assert found is not None
        assert facts is not None
        if before in _REFUSED:
            return Outcome(Ended.FAILED, _REFUSED[before], retryable=False)
        if before is Before.ZOMBIE:
            zombie = on_zombie(facts, job.job_id)
            return self._broken(namespace, found, args, running, zombie, _ZOMBIE)
        if args.kind is TaskKind.REMOVE:
            removal = on_removal(facts, job.job_id)
            return Outcome(
                Ended.SUCCEEDED, effects=self._save(namespace, found, args, running, removal)
            )
        return await self._run(task, namespace, found, args, running)

    async def _run(
        self,
        task: Task,
        namespace: Namespace,
        found: StepInput,
        args: TaskArgs,
        running: RunningJob,
    ) -> Outcome:
        job = running.job
        call = ProcessTask(args.kind, args.args, job.job_id)
        started = time.monotonic()
        pipeline = start_call(
            running,
            call_processor(task, call, found.process),
            timeout_sec=None,  # each attempt has its own: the step timeout
            name=f"dataloader-process-step-{job.job_id}",
        )
        await asyncio.wait([pipeline])
        elapsed = time.monotonic() - started
        duration_ms = round(elapsed * 1000)
        metrics.observe_process_stage("task_processing", namespace.name, elapsed)
        if pipeline.cancelled():
            return cut_short(running, duration_ms)
        facts = found.facts
        exc = pipeline.exception()
        if isinstance(exc, TaskTimeout) and not namespace.idempotent:
            zombie = on_zombie(facts, job.job_id)
            return self._broken(namespace, found, args, running, zombie, _ZOMBIE, exc, duration_ms)
        if exc is not None:
            text = error_text(exc)
            write = on_failure(facts, job.job_id, text)
            return self._broken(namespace, found, args, running, write, text, exc, duration_ms)
        try:
            saved = after_step(facts, args, job.job_id, pipeline.result(), self._max_bytes)  # type: ignore[arg-type]
        except ValueError as problem:
            text = f"result: {problem}"
            write = on_failure(facts, job.job_id, text)
            return self._broken(namespace, found, args, running, write, text, None, duration_ms)
        return Outcome(
            Ended.SUCCEEDED,
            result=saved.response_json,
            duration_ms=duration_ms,
            effects=self._save(namespace, found, args, running, saved),
        )

    def _broken(
        self,
        namespace: Namespace,
        found: StepInput,
        args: TaskArgs,
        running: RunningJob,
        write: StepWrite,
        error: str,
        raised: BaseException | None = None,
        duration_ms: int | None = None,
    ) -> Outcome:
        """The task fails for good, and its process goes to `error` with it."""
        return Outcome(
            Ended.FAILED,
            error,
            retryable=False,
            duration_ms=duration_ms,
            raised=raised,
            traceback=None if raised is None else traceback_text(raised),
            effects=self._save(namespace, found, args, running, write),
        )

    def _save(
        self,
        namespace: Namespace,
        found: StepInput,
        args: TaskArgs,
        running: RunningJob,
        write: StepWrite,
    ) -> StepSave:
        """What the task's end writes to its process: `write`, and the job of a new timer."""
        job = running.job
        assert job.lock_key is not None  # `execute` fails a task without one
        timer_job = None
        timer = write.new_timer
        if timer is not None:
            timer_job = NewJob(
                task=task_name_of(namespace.name),
                lock_key=lock_key_of(namespace.name, args.process_id),
                args=TaskArgs(
                    found.process_ref, args.process_id, timer.kind, timer=True
                ).as_job_args(),
                queue=found.facts.queue,
                priority=priority_of(True, namespace.priority),
                max_attempts=job.max_attempts,
                lease_ttl_sec=job.lease_ttl_sec,
                available_at=timer.at,
                delay=None if timer.in_sec is None else timedelta(seconds=timer.in_sec),
            )
        return StepSave(
            namespace=namespace.name,
            process_ref=found.process_ref,
            lock_key=job.lock_key,
            task_id=job.job_id,
            write=write,
            timer_job=timer_job,
            stage=_stage_of(write),
        )


#: The error of a zombie's task.
_ZOMBIE: Final = f"{ZOMBIE_DETAIL}: an attempt of this task started and did not end"


def _stage_of(write: StepWrite) -> str:
    """Which of progressor's stages the save of `write` is timed as."""
    if write.removed:
        return "process_removing"
    if write.detail == ZOMBIE_DETAIL:
        return "zombie_collection"
    return "task_completion"


async def call_processor(
    task: Task,
    call: ProcessTask,
    process: Process,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> ProcessResult:
    """Call `task`'s processor for `call` on `process` until it returns, its namespace's
    `attempts` times at most, each call under the step timeout, `sleep` between them for the
    retry policy's delay; the last error is raised (a step timeout at once, unless the
    processor is idempotent: a zombie)."""
    namespace = task.process
    assert namespace is not None
    policy = namespace.retry or DEFAULT_RETRY
    attempt = 1
    while True:
        this = ProcessTask(call.kind, call.args, call.task_id, attempt)
        try:
            result: Any = await within_timeout(
                task.handler(this, process), namespace.step_timeout_sec
            )
        except TaskTimeout:
            if not namespace.idempotent:
                raise  # a zombie: the step may have done half of its work
            if attempt >= namespace.attempts:
                raise
            delay, _ = delay_of(policy, attempt, DEFAULT_RETRY)
        except NonRetryableError:
            raise
        except Exception as exc:
            if attempt >= namespace.attempts:
                raise
            if isinstance(exc, Retry):
                delay = exc.after_sec
            else:
                delay, _ = delay_of(policy, attempt, DEFAULT_RETRY)
            log.info(
                "processor of %s failed (attempt %d of %d), again in %.3gs: %s",
                namespace.name,
                attempt,
                namespace.attempts,
                delay,
                error_text(exc),
            )
        else:
            return result  # type: ignore[no-any-return]
        await sleep(delay)
        attempt += 1
