"""Presence: this process's row in `dl_workers` — the queues it serves and the tasks it knows —
registered at start, refreshed every `DL_PRESENCE_PERIOD_SEC`, deleted on a clean stop. Each
refresh also adds the attempts the process ended since the last one to its queues' throughput
(`dl_queue_throughput`).

Other processes read it to refuse triggers of tasks nobody runs (the API) and to warn of queues
nobody serves (/status), and the reaper takes back the running jobs of a process not refreshed
within three periods. So each refresh that gets through renews this process's right to run its
jobs (`workers.fencing.PresenceFence`, enforced by the heartbeat), counted from its send. It
runs on the workers' own pool, so that pipelines holding every connection of theirs cannot make
the process look dead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import Counter
from importlib.metadata import version
from typing import Any

from dataloader.storage.db import CONNECTION_ERRORS
from dataloader.storage.presence import PresenceStore, WorkerInfo
from dataloader.tasks import TaskRegistry
from dataloader.workers.fencing import PresenceFence
from dataloader.workers.pipelines.contracts import registry_specs
from dataloader.workers.waiting import jittered, wait_any

log = logging.getLogger(__name__)


class Presence:
    """Keeps this process's `dl_workers` row fresh while it claims jobs."""

    def __init__(
        self,
        store: PresenceStore,
        worker_id: str,
        queues: dict[str, int],
        registry: TaskRegistry,
        period_sec: float,
        fence: PresenceFence,
        ended: Counter[tuple[str, str]] | None = None,
    ) -> None:
        self.store = store
        self._fence = fence
        #: A refresh is out: its row may still be written.
        self._refreshing = False
        self._ended = ended if ended is not None else Counter()
        self._worker_id = worker_id
        self._queues = queues
        self._registry = registry
        self._period = period_sec
        self._specs: dict[str, dict[str, Any]] = {}
        self._specs_of: tuple[tuple[str, int], ...] | None = None

    def info(self) -> WorkerInfo:
        """The row as of now (pipelines registered after the start show at the next refresh).
        A process that serves no queue runs no job, so it claims to know no task."""
        return WorkerInfo(
            worker_id=self._worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=version("dataloader"),
            queues=dict(self._queues),
            tasks=list(self._registry) if self._queues else [],
            period_sec=self._period,
            task_specs=self._task_specs() if self._queues else {},
        )

    def _task_specs(self) -> dict[str, dict[str, Any]]:
        """The registry's contracts, computed again only when its tasks changed."""
        tasks = tuple((name, id(self._registry.get(name))) for name in self._registry)
        if tasks != self._specs_of:
            self._specs = registry_specs(self._registry)
            self._specs_of = tasks
        return self._specs

    async def register(self) -> None:
        """Record the process (at start: errors propagate, like the pool's own)."""
        await self._refresh()

    async def _refresh(self) -> None:
        """Write the row; once written, the fence runs from the moment it was sent."""
        sent = time.monotonic()
        self._refreshing = True
        try:
            await self.store.upsert(self.info())
        finally:
            self._refreshing = False
        self._fence.refreshed(sent)

    async def run(self, stopping: asyncio.Event) -> None:
        """Refresh every period (jittered, counted from one send to the next) until `stopping`
        is set. A refresh that fails, or takes longer than a period, is given up for the next:
        the process's jobs are stopped after two more periods and a half without one that got
        through (`workers.fencing.presence_window`), and the others find it gone at three,
        which is what it is to them while the database cannot be reached."""
        next_at = time.monotonic() + jittered(self._period, 0.1)
        while not await wait_any(stopping, timeout=max(0.0, next_at - time.monotonic())):
            next_at = time.monotonic() + jittered(self._period, 0.1)
            try:
                await asyncio.wait_for(self._refresh(), timeout=self._period)
                await self.flush_throughput()
            except Exception as exc:  # keep refreshing: the next one may get through
                if isinstance(exc, CONNECTION_ERRORS):
                    self._fence.failed()
                log.warning(
                    "presence refresh failed: %r",
                    exc,
                    exc_info=not isinstance(exc, CONNECTION_ERRORS),
                )

    async def flush_throughput(self) -> None:
        """Write the attempts ended since the last flush; if that fails, they are kept for
        the next one."""
        ended = Counter(self._ended)
        self._ended.clear()
        try:
            await self.store.add_throughput(ended)
        except BaseException:
            self._ended.update(ended)
            raise

    async def deregister(self) -> None:
        """Delete the row (a clean stop); if that fails, the row goes stale on its own. Without
        a row, nobody can find the process gone: its last jobs wind down under their leases
        alone (unless a refresh is still out, which may write the row again)."""
        try:
            await self.store.delete(self._worker_id)
        except Exception as exc:
            log.warning("could not deregister %s: %r", self._worker_id, exc)
            return
        if not self._refreshing:
            self._fence.deregistered()
