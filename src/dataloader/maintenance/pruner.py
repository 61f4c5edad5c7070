"""The pruner: deletes jobs that ended long ago (per status, `DL_PRUNE_*_AFTER_SEC`) with their
journals, heartbeat entries of the journal past their age, durable processes removed long ago
with their history, and old throughput buckets.

Each statement deletes one small batch (`DL_PRUNE_BATCH_SIZE`) in a transaction of its own,
oldest first from an index of finished jobs, skipping rows someone holds: it never holds a
lock for long, never reads unfinished jobs, and leaves the table for vacuum to reuse."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Final

from dataloader.base import JobStatus
from dataloader.config import Settings
from dataloader.exceptions import DataloaderError
from dataloader.storage.maintenance import MaintenanceStore

#: Throughput buckets are read over the last hour; a day of them is kept.
THROUGHPUT_KEPT_SEC: Final = 86_400.0


class PruneIncomplete(DataloaderError):
    """Some parts of a prune failed (the others ran): what was deleted, and each failure."""

    def __init__(self, deleted: dict[str, int], failed: dict[str, Exception]) -> None:
        causes = "; ".join(f"{what}: {exc!r}" for what, exc in failed.items())
        super().__init__(f"pruning failed for {causes} (deleted: {deleted})")
        self.deleted = deleted
        self.failed = failed


@dataclass(frozen=True, slots=True)
class Retention:
    """How long finished jobs of each status, and heartbeat entries, are kept (0: forever)."""

    succeeded_sec: float
    canceled_sec: float
    failed_sec: float
    lost_sec: float
    heartbeats_sec: float
    #: Removed durable processes, with their history.
    removed_processes_sec: float = 0.0

    @classmethod
    def of(cls, settings: Settings) -> Retention:
        """The retention the settings ask for (`DL_PRUNE_*_AFTER_SEC`)."""
        return cls(
            succeeded_sec=settings.prune_succeeded_after_sec,
            canceled_sec=settings.prune_canceled_after_sec,
            failed_sec=settings.prune_failed_after_sec,
            lost_sec=settings.prune_lost_after_sec,
            heartbeats_sec=settings.prune_heartbeats_after_sec,
            removed_processes_sec=settings.prune_removed_processes_after_sec,
        )

    def by_status(self) -> dict[JobStatus, float]:
        """{status: seconds kept} of the statuses that are pruned at all."""
        ages = {
            JobStatus.SUCCEEDED: self.succeeded_sec,
            JobStatus.CANCELED: self.canceled_sec,
            JobStatus.FAILED: self.failed_sec,
            JobStatus.LOST: self.lost_sec,
        }
        return {status: age for status, age in ages.items() if age > 0}


class Pruner:
    """Deletes, in batches, what `retention` says is past keeping."""

    def __init__(self, store: MaintenanceStore, retention: Retention, batch_size: int) -> None:
        self._store = store
        self._retention = retention
        self._batch = batch_size

    async def prune(self, stopping: asyncio.Event | None = None) -> dict[str, int]:
        """Delete everything past its age, batch after batch, until none is left or
        `stopping` is set; {what: rows deleted} (job statuses, `heartbeats`, `throughput`).
        Each part is pruned whatever became of the others: PruneIncomplete after all have
        run if any failed."""
        parts = {
            status.value: partial(self._store.prune_jobs, status, age, self._batch)
            for status, age in self._retention.by_status().items()
        }
        if self._retention.heartbeats_sec > 0:
            parts["heartbeats"] = partial(
                self._store.prune_heartbeats, self._retention.heartbeats_sec, self._batch
            )
        if self._retention.removed_processes_sec > 0:
            age = self._retention.removed_processes_sec
            # a removed process's events first: its row goes once they are gone
            parts["process_events"] = partial(
                self._store.prune_removed_process_events, age, self._batch
            )
            parts["processes"] = partial(self._store.prune_removed_processes, age, self._batch)
        parts["throughput"] = partial(
            self._store.prune_throughput, THROUGHPUT_KEPT_SEC, self._batch
        )
        deleted: dict[str, int] = {}
        failed: dict[str, Exception] = {}
        for what, batch in parts.items():
            try:
                deleted[what] = await self._drain(batch, stopping)
            except Exception as exc:  # reported below, once the other parts have run
                failed[what] = exc
        if failed:
            raise PruneIncomplete(deleted, failed)
        return deleted

    async def _drain(
        self, batch: Callable[[], Awaitable[int]], stopping: asyncio.Event | None
    ) -> int:
        """Run `batch` until it deletes less than a full batch (or `stopping`); the total."""
        total = 0
        while stopping is None or not stopping.is_set():
            n = await batch()
            total += n
            if n < self._batch:
                break
        return total
