"""What one call of a batch handler did (`dataloader.HandlerStats`). No I/O.

The worker fills it from the handler's settlements (`workers.batches.count`); the metrics
(`metrics.observe_batch`) and the test runner (`dataloader.testing`) read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class HandlerStats:
    """What one call of a batch handler did, counted by the worker from its settlements."""

    #: Jobs settled `done`.
    processed: int = 0
    #: Jobs that did not succeed: settled `retry` or `fail`, or left unsettled.
    errors: int = 0
    #: Of those, the jobs sent to another attempt (`retry`, or left unsettled with one left).
    retried: int = 0
    #: Seconds from the call to its return.
    duration_sec: float = 0.0
    #: The last error of the batch (None: every job succeeded).
    last_error: str | None = None
