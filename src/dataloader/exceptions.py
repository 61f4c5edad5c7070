"""Exceptions raised by dataloader.

DataloaderError
├── ConfigError             bad environment / settings: the service refuses to start
├── JobNotFound             no job with that id
├── InvalidJobArgs          task arguments rejected by the task's pydantic model
├── InvalidJob              a new job's field out of bounds (also a ValueError)
├── IdempotencyConflict     an idempotency_key already names a job with other fields
├── UnknownTask             a job sent to a queue whose live processes all lack its task
├── DatabaseUnavailable     PostgreSQL refused, lost or stopped answering a connection
├── ProcessNotFound         no live durable process has that namespace and id
├── ProcessConflict         a process's state refuses the request (a call to one in error…)
├── ProcessTaskFailed       a process's task ended without a response (the process is in error)
├── ProcessTimeout          a process's task did not answer in time (it still runs; also a
│                           TimeoutError)
└── JobInterrupted          raised inside a pipeline: stop now
    ├── JobCanceled         cancel was requested (cooperative stop between chunks)
    └── JobLost             the job is no longer ours (lease reaped, lock connection lost)

NonRetryableError           raise from a task: the job fails at once, no retries
Retry                       raise from a task: try again after a delay the task chooses
TaskTimeout                 how an attempt that outran its task's `timeout` fails
NotRetryable                a client's retry of a job that cannot be retried (also ValueError)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import timedelta

from dataloader.core.retry import seconds


class DataloaderError(Exception):
    """Base class of dataloader's own errors."""


class ConfigError(DataloaderError):
    """A setting is invalid; the message names the environment variable."""


class JobNotFound(DataloaderError):
    """No job has the requested id."""


class InvalidJobArgs(DataloaderError):
    """Task arguments do not match the task's declared model."""


class InvalidJob(DataloaderError, ValueError):
    """A field of a new job is out of bounds or unstorable; the message names the field and
    the limit (see `dataloader.core.limits`)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class IdempotencyConflict(DataloaderError):
    """A job was enqueued with an idempotency_key that already names a job whose fields
    differ: the same key must always mean the same job."""

    def __init__(self, idempotency_key: str, job_id: uuid.UUID, fields: Sequence[str]) -> None:
        super().__init__(
            f"idempotency_key {idempotency_key!r} already names job {job_id}, whose"
            f" {', '.join(fields)} differ(s) from this request"
        )
        self.idempotency_key = idempotency_key
        self.job_id = job_id
        self.fields = tuple(fields)


class NotRetryable(DataloaderError, ValueError):
    """A client asked to retry a job that cannot be retried; the message says why."""


#: Known task names listed when a task is unknown; the rest are counted.
SHOWN_TASKS = 20


class UnknownTask(DataloaderError):
    """A job of a task sent to a queue that live processes serve while none of them knows
    the task: they would claim it and fail it (see `core.routing`, DL_ALLOW_UNKNOWN_TASKS)."""

    def __init__(self, task: str, known_tasks: Iterable[str], queue: str) -> None:
        super().__init__(
            f"task {task!r} is unknown ({_describe_known(known_tasks)}), and live processes"
            f" serve queue {queue!r}: they would fail its jobs; set DL_ALLOW_UNKNOWN_TASKS=true"
            " to accept it anyway (e.g. during a rolling deploy)"
        )
        self.task = task
        self.queue = queue


def _describe_known(tasks: Iterable[str]) -> str:
    """The known names for UnknownTask's message, the first `SHOWN_TASKS` of them."""
    names = sorted(tasks)
    if not names:
        return "no live process knows any task"
    shown = ", ".join(names[:SHOWN_TASKS])
    rest = len(names) - SHOWN_TASKS
    return f"known: {shown}" + (f" and {rest} more" if rest > 0 else "")


class DatabaseUnavailable(DataloaderError):
    """PostgreSQL refused a connection, lost it or stopped answering on it: an outage, worth
    retrying later (the driver's error is the cause)."""


class ProcessNotFound(DataloaderError):
    """No live durable process has the requested namespace and id (never started, or
    removed)."""

    def __init__(self, namespace: str, process_id: str) -> None:
        super().__init__(f"process {process_id!r} of namespace {namespace!r} not found")
        self.namespace = namespace
        self.process_id = process_id


class ProcessConflict(DataloaderError):
    """The process's state refuses the request: a call or a start-over to a process in
    `error` (only a repair is accepted there), a repair of one that is not in error, a start
    of a taken id with other args. `reason` is a `core.processes.Refusal` value."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ProcessTaskFailed(DataloaderError):
    """A task of a process ended without a response: its processor failed on every attempt
    (the process is now in `error`), or it was canceled. `task_id` is its job."""

    def __init__(self, message: str, task_id: uuid.UUID) -> None:
        super().__init__(message)
        self.task_id = task_id


class ProcessTimeout(DataloaderError, TimeoutError):
    """A task of a process did not answer within the caller's timeout. It stays queued or
    running: its response can be read later by `task_id` (`Client.processes.response`)."""

    def __init__(self, task_id: uuid.UUID, timeout: float | None) -> None:
        super().__init__(f"task {task_id} of the process has not answered within {timeout} s")
        self.task_id = task_id


class JobInterrupted(DataloaderError):
    """The running pipeline must stop now."""


class JobCanceled(JobInterrupted):
    """Cancellation was requested for the job; raised at the next cancellation check."""


class JobLost(JobInterrupted):
    """The job no longer belongs to this worker (lease reaped or advisory lock lost)."""


class NonRetryableError(Exception):
    """Raise from a pipeline to fail the job at once, without further attempts."""


class Retry(Exception):
    """Raise from a task to try the job again after `after` (seconds or a timedelta) instead
    of the retry policy's delay. The attempt counts: with none left, the job fails."""

    def __init__(self, after: float | timedelta, reason: str = "the task asked to be retried"):
        super().__init__(reason)
        self.after_sec = seconds(after, "Retry(after=…)")
        self.reason = reason


class TaskTimeout(Exception):
    """An attempt ran longer than its task's `timeout`: it was cancelled and failed."""


__all__ = [
    "ConfigError",
    "DatabaseUnavailable",
    "DataloaderError",
    "IdempotencyConflict",
    "InvalidJob",
    "InvalidJobArgs",
    "JobCanceled",
    "JobInterrupted",
    "JobLost",
    "JobNotFound",
    "NonRetryableError",
    "NotRetryable",
    "ProcessConflict",
    "ProcessNotFound",
    "ProcessTaskFailed",
    "ProcessTimeout",
    "Retry",
    "TaskTimeout",
    "UnknownTask",
]
