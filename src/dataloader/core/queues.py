"""A queue as operators see and steer it: its settings (paused), its audit log, its
throughput. No I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

#: The windows of a queue's throughput, in seconds: the last 1, 5 and 60 minutes.
THROUGHPUT_WINDOWS_SEC: Final = (60, 300, 3600)

#: What an ended attempt counts as in a queue's throughput, by the journal kind of its end
#: (`core.transitions`); ends of other kinds (a backoff, a re-run) are not counted.
THROUGHPUT_KINDS: Final = {
    "done": "succeeded",
    "failed": "failed",
    "requeue": "retried",
    "canceled": "canceled",
    "lost": "lost",
}


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """A queue's limits across every replica (None: no limit)."""

    #: Jobs of the queue running at once.
    max_running: int | None = None
    #: Jobs of one partition_key of the queue running at once.
    max_running_per_partition: int | None = None
    #: Jobs started per second (a bucket of one second's worth: short bursts up to that).
    max_per_second: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_running", "max_running_per_partition"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1
            ):
                raise ValueError(f"{name} must be an integer from 1 to 2147483647, or None")
        rate = self.max_per_second
        if rate is not None and (
            isinstance(rate, bool)
            or not isinstance(rate, int | float)
            or not 0.001 <= rate <= 1_000_000
        ):
            raise ValueError("max_per_second must be a number from 0.001 to 1000000, or None")

    @property
    def any(self) -> bool:
        """Whether any limit is set."""
        return any(
            v is not None
            for v in (self.max_running, self.max_running_per_partition, self.max_per_second)
        )


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """What an operator set on a queue, and who did it last."""

    queue: str
    paused: bool
    changed_at: datetime | None = None
    changed_by: str | None = None
    limits: QueueLimits = field(default_factory=QueueLimits)


@dataclass(frozen=True, slots=True)
class QueueEvent:
    """One entry of a queue's audit log: who did what, when."""

    event_id: int
    queue: str
    ts: datetime
    kind: str
    actor: str
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Throughput:
    """The attempts a queue's workers ended within the last `window_sec` seconds, by outcome.
    Each process adds its counts at its presence refresh (`DL_PRESENCE_PERIOD_SEC`): the
    latest attempts show up to one period late."""

    window_sec: int
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    canceled: int = 0
    lost: int = 0

    @property
    def per_minute(self) -> float:
        """Jobs ended (succeeded, failed, canceled or lost) per minute over the window."""
        ended = self.succeeded + self.failed + self.canceled + self.lost
        return ended * 60 / self.window_sec


def throughput_of(counts: Mapping[tuple[str, int], int]) -> list[Throughput]:
    """A queue's throughput in each window, from {(journal kind, window_sec): attempts}."""
    windows = []
    for window in THROUGHPUT_WINDOWS_SEC:
        by_outcome: dict[str, int] = {}
        for (kind, seen_in), n in counts.items():
            outcome = THROUGHPUT_KINDS.get(kind)
            if outcome is not None and seen_in == window:
                by_outcome[outcome] = by_outcome.get(outcome, 0) + n
        windows.append(Throughput(window, **by_outcome))
    return windows


@dataclass(frozen=True, slots=True)
class ThroughputPoint:
    """The attempts ended from `at` on, for one step of a throughput series, by outcome."""

    at: datetime
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    canceled: int = 0
    lost: int = 0

    @property
    def ended(self) -> int:
        return self.succeeded + self.failed + self.canceled + self.lost


def series_of(rows: Iterable[tuple[datetime, str, int]]) -> list[ThroughputPoint]:
    """Points of a throughput series from (step's start, journal kind, attempts), oldest
    first; a kind that is no outcome (a heartbeat) is left out."""
    by_step: dict[datetime, dict[str, int]] = {}
    for at, kind, n in rows:
        outcome = THROUGHPUT_KINDS.get(kind)
        if outcome is not None:
            counts = by_step.setdefault(at, {})
            counts[outcome] = counts.get(outcome, 0) + n
    return [ThroughputPoint(at, **counts) for at, counts in sorted(by_step.items())]
