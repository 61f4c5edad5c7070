"""Domain vocabulary shared by every layer.

The values are the spec's `dl_status` enum; they are stored in the database, so they never
change. (The journal's event kinds are listed in docs/protocol.md.)
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
