"""How stale a read served by a streaming standby may be, decided without I/O.

A standby replays the primary's WAL: what it shows is the primary as it was a little while
ago. That while is measured from WAL positions rather than from
`now() - pg_last_xact_replay_timestamp()`, which grows on an idle primary without any lag (no
transaction to replay, however caught up the standby is). At each check the primary's
current position is sampled with this process's monotonic clock; everything the primary had
written at a sample the standby has replayed past is visible there, so its reads are behind
by at most the time since the latest such sample. A standby that has replayed everything the
primary had at the check is not behind at all.

Which reads may be stale, and which never, is decided in one place: `dataloader.client`
(section "reads that may be stale").
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final, Literal

#: Samples of the primary's position kept: at one check a second, about a minute of history.
SAMPLES_KEPT: Final = 64

#: Why a read that may be stale was served by the primary.
Fallback = Literal["unavailable", "lagging", "error"]


class LagTracker:
    """The standby's lag from its replayed position and samples of the primary's position."""

    def __init__(self, kept: int = SAMPLES_KEPT) -> None:
        #: (the primary's position, when it was read), oldest first.
        self._samples: deque[tuple[int, float]] = deque(maxlen=kept)

    def observe(
        self,
        primary_position: int,
        primary_at: float,
        replayed: int | None,
        replay_age_sec: float | None,
        now: float,
    ) -> float | None:
        """How far behind the standby is (seconds) at `now`, given the primary's position
        read at `primary_at` and, read after it, the standby's replayed position (None: the
        server is no standby, nothing to replay) and the age of its last replayed commit
        (None: none replayed since it started). None when it cannot be told (behind, with no
        sample or commit to bound it): take it as too far behind."""
        if replayed is None:
            return 0.0
        self._samples.append((primary_position, primary_at))
        if replayed >= primary_position:
            return 0.0
        bounds = [] if replay_age_sec is None else [max(0.0, replay_age_sec)]
        seen = next((at for position, at in reversed(self._samples) if position <= replayed), None)
        if seen is not None:
            bounds.append(max(0.0, now - seen))
        return min(bounds) if bounds else None


@dataclass(frozen=True, slots=True)
class Freshness:
    """Where a read that may be stale was served: by the replica, `lag_sec` behind the
    primary when last measured, or by the primary (`fallback`: why not by the replica)."""

    source: Literal["replica", "primary"]
    lag_sec: float | None = None
    fallback: Fallback | None = None

    def header(self) -> str:
        """The value of `X-Dataloader-Read-From`: `replica; lag=0.412s`, `primary;
        fallback=lagging` …"""
        if self.source == "replica":
            return f"replica; lag={self.lag_sec or 0.0:.3f}s"
        return "primary" if self.fallback is None else f"primary; fallback={self.fallback}"

    def sentence(self) -> str:
        """What a page says of the lists and counts it shows."""
        if self.source == "replica":
            return (
                "Lists and counts on this page were read from a replica,"
                f" {self.lag_sec or 0.0:.1f} s behind the primary when last measured."
            )
        why = {
            "unavailable": "the replica cannot be reached",
            "lagging": "the replica is too far behind",
            "error": "the replica failed to answer",
            None: "",
        }[self.fallback]
        return "Lists and counts on this page were read from the primary" + (
            f" ({why})." if why else "."
        )


class ReadsSeen:
    """Where the reads that may be stale of one answer (a request, a page) were served."""

    def __init__(self) -> None:
        self._seen: list[Freshness] = []

    def note(self, freshness: Freshness) -> None:
        self._seen.append(freshness)

    @property
    def freshness(self) -> Freshness | None:
        """The stalest of them: the replica's largest lag when any read was served there,
        else the primary's (and why); None when the answer read nothing that may be stale."""
        replica = [f for f in self._seen if f.source == "replica"]
        if replica:
            return max(replica, key=lambda f: f.lag_sec or 0.0)
        return self._seen[0] if self._seen else None


_reads_seen: ContextVar[ReadsSeen | None] = ContextVar("dataloader_reads_seen", default=None)


@contextlib.contextmanager
def observing_reads() -> Iterator[ReadsSeen]:
    """Collect where the reads that may be stale made inside this block (and the coroutines
    it awaits) were served."""
    seen = ReadsSeen()
    token = _reads_seen.set(seen)
    try:
        yield seen
    finally:
        _reads_seen.reset(token)


def note_read(freshness: Freshness) -> None:
    """Tell the answer being made (if any observes its reads) where a read was served."""
    seen = _reads_seen.get()
    if seen is not None:
        seen.note(freshness)


def current_freshness() -> Freshness | None:
    """How stale what the answer being made has read so far may be (None: nothing of it)."""
    seen = _reads_seen.get()
    return None if seen is None else seen.freshness
