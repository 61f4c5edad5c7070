"""Supervision of a process's loops (queue workers, heartbeat, listener, presence, leadership,
each maintenance chore): no loop dies silently. A loop that raises is logged with its
traceback, recorded as failed in `dl_maintenance_runs` (which /status reads and warns of), and
started again after a backoff that doubles up to a cap. A restarted loop that has run for its
backoff without raising is recorded as running again, which ends the warning; a maintenance
chore records its own runs instead (`Maintenance.run_once`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from dataloader.storage.maintenance import MaintenanceStore
from dataloader.workers.waiting import wait_any

log = logging.getLogger(__name__)

#: The first restart's delay; each failure in a row doubles it...
FIRST_BACKOFF_SEC: Final = 1.0
#: ...up to this.
MAX_BACKOFF_SEC: Final = 60.0

Loop = Callable[[asyncio.Event], Awaitable[None]]


def backoff(failures: int, first: float = FIRST_BACKOFF_SEC, cap: float = MAX_BACKOFF_SEC) -> float:
    """The delay before restarting a loop that failed `failures` times in a row."""
    return min(cap, first * 2.0 ** min(failures - 1, 32))


@dataclass(frozen=True, slots=True)
class Supervisor:
    """Runs loops of the process `holder`, recording their failures through `store`."""

    store: MaintenanceStore
    holder: str
    first_backoff_sec: float = FIRST_BACKOFF_SEC
    max_backoff_sec: float = MAX_BACKOFF_SEC

    async def run(
        self, name: str, loop: Loop, stopping: asyncio.Event, *, records_runs: bool = False
    ) -> None:
        """Run `loop(stopping)` until it returns (once `stopping` is set), restarting it
        whenever it raises. `records_runs`: the loop records its own successful runs."""
        failures = 0
        while not stopping.is_set():
            running = asyncio.create_task(_call(loop, stopping), name=f"dataloader-{name}")
            try:
                if failures and not records_runs:
                    await asyncio.wait([running], timeout=self._backoff(failures))
                    if not running.done():  # it has run a while without raising
                        log.info("%s runs again", name)
                        await self._record(name, None)
                await running
                return
            except asyncio.CancelledError:
                running.cancel()
                raise
            except Exception as exc:
                failures += 1
                delay = self._backoff(failures)
                log.error("%s failed; restarting it in %.1fs", name, delay, exc_info=exc)
                await self._record(name, f"{type(exc).__name__}: {exc}")
                await wait_any(stopping, timeout=delay)

    def _backoff(self, failures: int) -> float:
        return backoff(failures, self.first_backoff_sec, self.max_backoff_sec)

    async def _record(self, name: str, error: str | None) -> None:
        """Record the loop's failure (or its recovery) for /status; logged if that fails too."""
        try:
            await self.store.record_run(name, self.holder, 0.0, error, {"supervised": True})
        except Exception as exc:
            log.warning("could not record the state of %s: %r", name, exc)


async def _call(loop: Loop, stopping: asyncio.Event) -> None:
    await loop(stopping)
