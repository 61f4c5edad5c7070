"""Reaper (spec §6.5): jobs whose lease expired go back to `queued`, or become `lost` when the
lease expired on their last attempt. Every replica runs one; `FOR UPDATE SKIP LOCKED` keeps
them from touching the same job twice."""

from __future__ import annotations

import asyncio
import logging

from dataloader.storage.db import CONNECTION_ERRORS
from dataloader.storage.repositories import JobRepository
from dataloader.workers.waiting import jittered, wait_any

log = logging.getLogger(__name__)

#: Jobs per statement; a pass repeats until fewer come back.
BATCH = 500


class Reaper:
    """Periodic sweep of expired leases."""

    def __init__(self, repo: JobRepository, period_sec: float, reaper_id: str) -> None:
        self._repo = repo
        self._period = period_sec
        self._id = reaper_id

    async def run(self, stopping: asyncio.Event) -> None:
        """Sweep at start, then every period (jittered) until `stopping` is set."""
        while not stopping.is_set():
            try:
                await self.run_once()
            except Exception as exc:  # keep sweeping: the next pass may get through
                log.warning(
                    "reaper pass failed: %r", exc, exc_info=not isinstance(exc, CONNECTION_ERRORS)
                )
            await wait_any(stopping, timeout=jittered(self._period))

    async def run_once(self) -> dict[str, int]:
        """One full pass; returns {new status: count}."""
        totals: dict[str, int] = {}
        while True:
            reaped = await self._repo.reap_expired(BATCH, self._id)
            for job_id, status in reaped:
                totals[status] = totals.get(status, 0) + 1
                log.warning("lease expired: job %s is now %s", job_id, status)
            if len(reaped) < BATCH:
                return totals
