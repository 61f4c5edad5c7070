"""Runs the maintenance tasks, each in a loop of its own, while this process leads. Each loop,
and the bid for the lead, is supervised (`workers.supervisor`): one that raises is logged,
recorded as failed and restarted, and never stops the others."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from dataloader import metrics
from dataloader.maintenance.leader import Leadership
from dataloader.storage.db import CONNECTION_ERRORS
from dataloader.storage.maintenance import MaintenanceStore
from dataloader.workers.supervisor import Supervisor
from dataloader.workers.waiting import jittered, wait_any

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Periodic:
    """A maintenance task: `run(stopping)` every `period_sec` (jittered), or after
    `next_in_sec()` seconds when given. `run` returns what it did, recorded for /status."""

    name: str
    run: Callable[[asyncio.Event], Awaitable[dict[str, Any]]]
    period_sec: float
    next_in_sec: Callable[[], float] | None = None


class Maintenance:
    """Bids for the lease and, while this process holds it, runs `tasks`."""

    def __init__(
        self,
        leadership: Leadership,
        store: MaintenanceStore,
        tasks: list[Periodic],
        supervisor: Supervisor,
    ) -> None:
        self.leadership = leadership
        self._store = store
        self.tasks = tasks
        self.supervisor = supervisor

    async def run(self, stopping: asyncio.Event) -> None:
        """Bid and run until `stopping` is set (the lease is released then)."""
        loops = [
            asyncio.create_task(
                self.supervisor.run(
                    task.name, partial(self._loop, task), stopping, records_runs=True
                )
            )
            for task in self.tasks
        ]
        try:
            await self.supervisor.run("leader", self.leadership.run, stopping)
        finally:
            await asyncio.gather(*loops, return_exceptions=True)

    async def _loop(self, task: Periodic, stopping: asyncio.Event) -> None:
        # what raises here (a schedule's next slot, say) ends the loop: its supervisor
        # records that and starts it again
        leading = self.leadership.leading
        while not stopping.is_set():
            if not leading.is_set():
                await wait_any(stopping, leading)
                continue
            await self.run_once(task, stopping)
            delay = task.next_in_sec() if task.next_in_sec else jittered(task.period_sec)
            await wait_any(stopping, self.leadership.following, timeout=delay)

    async def run_once(self, task: Periodic, stopping: asyncio.Event) -> dict[str, Any]:
        """Run `task` once and record it; what it did ({} if it failed)."""
        started = time.monotonic()
        error: str | None = None
        detail: dict[str, Any] = {}
        try:
            detail = await task.run(stopping)
        except Exception as exc:  # recorded and logged: the next run may get through
            error = repr(exc)
            log.warning(
                "%s failed: %r", task.name, exc, exc_info=not isinstance(exc, CONNECTION_ERRORS)
            )
        took = time.monotonic() - started
        metrics.MAINTENANCE_DURATION.labels(task.name).observe(took)
        try:
            await self._store.record_run(task.name, self.leadership.holder, took, error, detail)
        except Exception as exc:
            log.warning("could not record the run of %s: %r", task.name, exc)
        return detail
