"""Self-fencing: when a process must stop its own jobs because it could not prove, in time,
that it is alive. No I/O.

Two proofs keep a running job ours. Its lease, extended by the heartbeat: the reaper may take
the job once the lease expires. And the process's presence row (`dl_workers`), refreshed every
DL_PRESENCE_PERIOD_SEC: the reaper may take every job of a process whose row was not
refreshed within three of its periods (`GONE_AFTER_PERIODS`), by the database's clock, which
is how a killed process's jobs come back in seconds rather than a lease later.

Each deadline is counted on the process's own monotonic clock from the moment it *sent* the
write that got through: the database set its time (`now()`) after that, so by the time the
database may consider the lease expired or the process gone, the process has stopped the job,
with a margin (`fence_window`) for the stop and the hand-back to be written. Two runs of a job
never overlap, even when the process is only slow or cut off from the database.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Final

from dataloader.workers.waiting import wait_any

#: A job whose proof was last renewed this fraction of its validity ago is stopped...
LEASE_MARGIN: Final = 0.9
#: ...or this long before its validity runs out, if that is sooner: the time its hand-back needs
#: to be written before the reaper may take the job (and count the attempt).
MIN_SLACK_SEC: Final = 0.5
#: A process is gone, to the others, once its presence row was not refreshed for this many of
#: its periods (the database's clock: `storage.queries`, LIVE_WORKERS and EXPIRED_JOBS).
GONE_AFTER_PERIODS: Final = 3
#: Beats that may try to extend a lease before its job is stopped, so that one or two may
#: meet the row briefly locked. The window holds one beat more, its last on the deadline.
TRIES_PER_WINDOW: Final = 3
INF: Final = float("inf")


def fence_window(valid_sec: float) -> float:
    """How long after its last renewal (a lease of `valid_sec`, or a presence the others trust
    for `valid_sec`) a job is stopped unless the renewal comes again."""
    return min(valid_sec * LEASE_MARGIN, valid_sec - MIN_SLACK_SEC)


def beat_period_for(lease_ttl_sec: float) -> float:
    """The longest beat period that still gives a job three tries before its fence deadline,
    each with a period's time for its round trip: a beat may find the row locked by the job's
    own progress write, and one missed beat must not stop the job."""
    return fence_window(lease_ttl_sec) / (TRIES_PER_WINDOW + 1)


def presence_window(period_sec: float) -> float:
    """How long after sending its last presence refresh that got through a process may run its
    jobs: at the defaults (2 s), 5.4 s, before the others find it gone at 6 s."""
    return fence_window(GONE_AFTER_PERIODS * period_sec)


@dataclass(eq=False)
class PresenceFence:
    """Until when (monotonic) this process's presence vouches for its running jobs. Infinite
    before the first refresh (no job runs yet) and after a clean deregistration (no row: the
    others wait for the leases)."""

    period_sec: float
    valid_until: float = INF
    #: Set at each refresh that gets through (claims wait for it while the fence is lapsed).
    renewed: asyncio.Event = field(default_factory=asyncio.Event)
    #: Whether the last refresh failed: the database could not be reached from here.
    unreachable: bool = False
    #: When (monotonic) the first refresh after a failed one was sent: the database was back.
    back_at: float = -INF

    def refreshed(self, sent: float) -> None:
        """A refresh sent at `sent` (monotonic) got through (refreshes are sent one after
        another: each is later than the last)."""
        self.valid_until = sent + presence_window(self.period_sec)
        if self.unreachable:
            self.unreachable = False
            self.back_at = sent
        self.renewed.set()

    def failed(self) -> None:
        """A refresh could not reach the database."""
        self.unreachable = True

    def outage_wait(self, now: float | None = None) -> float:
        """How long the reaper waits before judging other processes, after an outage this
        process saw (0: not at all). The database away from here (a failover, a restart) was
        most likely away from every process: their leases ran out and their presence went
        stale through no fault of theirs, and a live one needs up to `GONE_AFTER_PERIODS` of
        its periods, once the database is back, to refresh its presence and write the
        hand-backs of the jobs it stopped (refunded: its side cut them short). Judged before
        that, those jobs would be taken back as if their process had died, an attempt spent
        each, and a durable process's task a zombie."""
        if self.unreachable:
            return self.period_sec  # asking now would fail anyway: look again in a period
        now = time.monotonic() if now is None else now
        return max(0.0, self.back_at + GONE_AFTER_PERIODS * self.period_sec - now)

    def vouched(self, sent: float) -> None:
        """A refresh sent at `sent` by the watchdog thread got through: the deadline moves
        forward (never back: the loop's own refreshes may have gone later). Only a float is
        written here, from that thread; the loop's `renewed` is set on the loop."""
        self.valid_until = max(self.valid_until, sent + presence_window(self.period_sec))

    def deregistered(self) -> None:
        """The row is gone: nobody can find this process gone any more."""
        self.valid_until = INF

    def lapsed(self, now: float | None = None) -> bool:
        """Whether the jobs must be stopped now."""
        return (time.monotonic() if now is None else now) >= self.valid_until

    async def wait_renewed(self, stopping: asyncio.Event) -> None:
        """Wait for the next refresh that gets through (or `stopping`): a lapsed process claims
        nothing, since it would have to stop the job at once."""
        self.renewed.clear()
        await wait_any(self.renewed, stopping)
