"""Domain vocabulary shared by every layer: job statuses and event kinds.

The values are the spec's (`dl_status` enum and the `dl_job_events.kind` journal); they are
stored in the database, so they never change.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    """Values of the spec's `dl_status` enum."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    LOST = "lost"

    @property
    def is_terminal(self) -> bool:
        """True for the statuses a job never leaves."""
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.LOST}
)


class EventKind(StrEnum):
    """Kinds written to the `dl_job_events` journal."""

    QUEUED = "queued"
    PICKED = "picked"
    BACKOFF = "backoff"
    HEARTBEAT = "heartbeat"
    REQUEUE = "requeue"
    DONE = "done"
    FAILED = "failed"
    CANCEL_REQUESTED = "cancel_requested"
    CANCELED = "canceled"
    LOST = "lost"
