"""A periodic summary, per queue, of the jobs this process ended, logged at INFO.

A log line per job costs more than running a no-op job does (formatting, the caller's frame,
masking, JSON), so at full drain rate two lines per job took 40 % of the service's CPU. The
per-job lines ("job started", "job succeeded", …) are therefore logged at DEBUG, and this
summary says at INFO what each queue did: one line per queue and period, only for queues that
ended jobs in it. Failures and hand-backs keep their own WARNING lines per job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

log = logging.getLogger("dataloader.workers")


class JobSummary:
    """Counts of ended jobs by queue and by how they ended (the journal entry of their end:
    `done`, `retry`, `failed`, `canceled`, `backoff`, …), logged and reset every period."""

    def __init__(self, period_sec: float) -> None:
        self.period_sec = period_sec
        self._counts: dict[str, Counter[str]] = {}

    def count(self, queue: str, ended: str) -> None:
        """One job of `queue` ended as `ended`."""
        counts = self._counts.get(queue)
        if counts is None:
            counts = self._counts[queue] = Counter()
        counts[ended] += 1

    def flush(self) -> None:
        """Log one line per queue that ended jobs since the last flush, and start again."""
        counts, self._counts = self._counts, {}
        for queue, ended in sorted(counts.items()):
            shown = ", ".join(f"{n:,} {kind}" for kind, n in ended.most_common())
            log.info(
                "queue %s: %s in the last %gs",
                queue,
                shown,
                self.period_sec,
                extra={"queue": queue, "ended": dict(ended), "period_sec": self.period_sec},
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Flush every period until `stop`, then once more (what the last period ended)."""
        if self.period_sec <= 0:
            return
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.period_sec)
            self.flush()
            if stop.is_set():
                return
