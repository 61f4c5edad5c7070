"""Exceptions raised by dataloader.

DataloaderError
├── ConfigError             bad environment / settings: the service refuses to start
├── JobNotFound             no job with that id
├── InvalidJobArgs          task arguments rejected by the task's pydantic model
├── DatabaseUnavailable     PostgreSQL cannot be reached
└── JobInterrupted          raised inside a pipeline: stop now
    ├── JobCanceled         cancel was requested (cooperative stop between chunks)
    └── JobLost             the job is no longer ours (lease reaped, lock connection lost)

NonRetryableError           raise from a pipeline: the job fails at once, no retries
"""

from __future__ import annotations


class DataloaderError(Exception):
    """Base class of dataloader's own errors."""


class ConfigError(DataloaderError):
    """A setting is invalid; the message names the environment variable."""


class JobNotFound(DataloaderError):
    """No job has the requested id."""


class InvalidJobArgs(DataloaderError):
    """Task arguments do not match the task's declared model."""


class DatabaseUnavailable(DataloaderError):
    """PostgreSQL could not be reached."""


class JobInterrupted(DataloaderError):
    """The running pipeline must stop now."""


class JobCanceled(JobInterrupted):
    """Cancellation was requested for the job; raised at the next cancellation check."""


class JobLost(JobInterrupted):
    """The job no longer belongs to this worker (lease reaped or advisory lock lost)."""


class NonRetryableError(Exception):
    """Raise from a pipeline to fail the job at once, without further attempts."""
