"""Periodic INFO lines that count events, in place of one line per event.

A log line costs more than running a no-op job or answering a trigger does (formatting, the
caller's frame, masking, JSON): at full rate, two lines per job took 40 % of the service's CPU,
and one line per request 13 %. So the line of each job ("job started", "job succeeded", …) and
of each request answered below 400 is logged at DEBUG, and a summary says at INFO what
happened: one line per subject (a queue, an HTTP route) and period, only for the subjects that
had events in it. Failures keep their own lines (a job's at WARNING, a refused request's at
INFO).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter


class Summary:
    """Counts of events by subject and kind, logged and reset every period."""

    def __init__(
        self,
        period_sec: float,
        logger: logging.Logger,
        *,
        subject: str,
        counts: str,
        label: str = "",
        item: str = "{n:,} {kind}",
    ) -> None:
        """`subject` and `counts` name the line's fields (`{"queue": "etl", "ended": {...}}`);
        the message starts with `label` and the subject, and `item` shows one kind's count."""
        self.period_sec = period_sec
        self._log = logger
        self._subject = subject
        self._counts_field = counts
        self._label = label
        self._item = item
        self._counts: dict[str, Counter[str]] = {}

    def count(self, subject: str, kind: str) -> None:
        """One event of `kind` for `subject`."""
        counts = self._counts.get(subject)
        if counts is None:
            counts = self._counts[subject] = Counter()
        counts[kind] += 1

    def flush(self) -> None:
        """Log one line per subject with events since the last flush, and start again."""
        counts, self._counts = self._counts, {}
        for subject, kinds in sorted(counts.items()):
            shown = ", ".join(self._item.format(n=n, kind=kind) for kind, n in kinds.most_common())
            self._log.info(
                "%s%s: %s in the last %gs",
                self._label,
                subject,
                shown,
                self.period_sec,
                extra={
                    self._subject: subject,
                    self._counts_field: dict(kinds),
                    "period_sec": self.period_sec,
                },
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Flush every period until `stop`, then once more (what the last period counted);
        a period of 0 turns the summary off."""
        if self.period_sec <= 0:
            return
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.period_sec)
            self.flush()
            if stop.is_set():
                return


def job_summary(period_sec: float) -> Summary:
    """What the process's jobs ended as, per queue, by the journal entry of their end:
    `queue etl: 12,000 done, 3 retry in the last 60s`."""
    return Summary(
        period_sec,
        logging.getLogger("dataloader.workers"),
        subject="queue",
        counts="ended",
        label="queue ",
    )


def request_summary(period_sec: float) -> Summary:
    """The requests the API answered, per route, by status:
    `POST /api/v1/jobs/trigger: 200 ×119,990, 422 ×10 in the last 60s`."""
    return Summary(
        period_sec,
        logging.getLogger("dataloader.access"),
        subject="route",
        counts="statuses",
        item="{kind} ×{n:,}",
    )
