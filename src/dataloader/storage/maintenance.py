"""The statements of maintenance: leases (which process runs it), the record of its runs,
and pruning (finished jobs, old heartbeat entries, old throughput buckets)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from dataloader.base import JobStatus
from dataloader.core.cron import CronState
from dataloader.storage import processes, queries
from dataloader.storage.connections import Queries

#: The name in `dl_leases` of the lease of the process that leads maintenance.
MAINTENANCE_LEASE: Final = "maintenance"


@dataclass(frozen=True, slots=True)
class Lease:
    """Who runs what a lease covers, since when and until when."""

    name: str
    holder: str
    acquired_at: datetime
    expires_at: datetime
    #: Not expired by the database's clock.
    valid: bool = True


@dataclass(frozen=True, slots=True)
class MaintenanceRun:
    """The last run of a maintenance task."""

    task: str
    holder: str
    started_at: datetime
    finished_at: datetime
    ok: bool
    error: str | None
    detail: dict[str, Any]
    runs: int
    ago_sec: float


class MaintenanceStore:
    """Maintenance's statements over a pool, with its connection hygiene."""

    def __init__(self, db: Queries) -> None:
        self._db = db

    async def acquire(self, name: str, holder: str, ttl_sec: float) -> Lease | None:
        """Take or renew lease `name` for `holder`; None if another process holds it."""
        row = await self._db.fetchrow(
            *queries.ACQUIRE_LEASE.bind(name=name, holder=holder, ttl_sec=ttl_sec)
        )
        if row is None:
            return None
        return Lease(name, row["holder"], row["acquired_at"], row["expires_at"])

    async def release(self, name: str, holder: str) -> None:
        """Give up lease `name` if `holder` has it."""
        await self._db.execute(*queries.RELEASE_LEASE.bind(name=name, holder=holder))

    async def leases(self) -> list[Lease]:
        """Every lease, expired ones included."""
        rows = await self._db.fetch(queries.LEASES)
        return [
            Lease(r["name"], r["holder"], r["acquired_at"], r["expires_at"], r["valid"])
            for r in rows
        ]

    async def record_run(
        self,
        task: str,
        holder: str,
        duration_sec: float,
        error: str | None,
        detail: dict[str, Any],
    ) -> None:
        """Record a run of `task` by `holder` that took `duration_sec` and ended now (failed
        if `error`)."""
        await self._db.execute(
            *queries.RECORD_MAINTENANCE_RUN.bind(
                task=task,
                holder=holder,
                duration_sec=duration_sec,
                ok=error is None,
                error=error,
                detail=json.dumps(detail, default=str),
            )
        )

    async def runs(self) -> list[MaintenanceRun]:
        """The last run of each maintenance task, by task."""
        rows = await self._db.fetch(queries.MAINTENANCE_RUNS)
        return [MaintenanceRun(**{**dict(r), "detail": json.loads(r["detail"])}) for r in rows]

    async def now(self) -> datetime:
        """The database's clock."""
        now: datetime = await self._db.fetchval(queries.DB_NOW)
        return now

    async def cron_state(self) -> dict[str, CronState]:
        """{name: its state} of every schedule ever recorded."""
        rows = await self._db.fetch(queries.CRON_STATE)
        return {
            r["name"]: CronState(
                r["name"], r["schedule"], r["task"], r["queue"], r["last_slot"], r["timezone"]
            )
            for r in rows
        }

    async def set_cron(self, state: CronState) -> None:
        """Record a schedule and its last slot enqueued."""
        await self._db.execute(
            *queries.SET_CRON.bind(
                name=state.name,
                schedule=state.schedule,
                task=state.task,
                queue=state.queue,
                last_slot=state.last_slot,
                timezone=state.timezone,
            )
        )

    async def prune_jobs(self, status: JobStatus, after_sec: float, limit: int) -> int:
        """Delete up to `limit` jobs that ended `status` over `after_sec` ago; how many."""
        if status not in FINISHED:
            raise ValueError(f"only finished jobs are pruned, not {status.value} ones")
        deleted: int = await self._db.fetchval(
            *queries.PRUNE_JOBS.bind(status=status.value, after_sec=after_sec, limit=limit)
        )
        return deleted

    async def prune_heartbeats(self, after_sec: float, limit: int) -> int:
        """Delete up to `limit` heartbeat entries older than `after_sec`; how many."""
        deleted: int = await self._db.fetchval(
            *queries.PRUNE_HEARTBEATS.bind(after_sec=after_sec, limit=limit)
        )
        return deleted

    async def prune_throughput(self, after_sec: float, limit: int) -> int:
        """Delete up to `limit` throughput buckets older than `after_sec`; how many."""
        deleted: int = await self._db.fetchval(
            *queries.PRUNE_THROUGHPUT.bind(after_sec=after_sec, limit=limit)
        )
        return deleted

    async def prune_removed_process_events(self, after_sec: float, limit: int) -> int:
        """Delete up to `limit` events of processes removed over `after_sec` ago; how many."""
        deleted: int = await self._db.fetchval(
            *processes.PRUNE_REMOVED_EVENTS.bind(after_sec=after_sec, limit=limit)
        )
        return deleted

    async def prune_removed_processes(self, after_sec: float, limit: int) -> int:
        """Delete up to `limit` processes removed over `after_sec` ago (once their events are
        gone); how many."""
        deleted: int = await self._db.fetchval(
            *processes.PRUNE_REMOVED_PROCESSES.bind(after_sec=after_sec, limit=limit)
        )
        return deleted

    async def count_prunable_processes(self, after_sec: float) -> int:
        """How many removed processes the pruner would delete now."""
        prunable: int = await self._db.fetchval(
            *processes.COUNT_PRUNABLE_PROCESSES.bind(after_sec=after_sec)
        )
        return prunable

    async def count_prunable_jobs(self, status: JobStatus, after_sec: float) -> int:
        """How many jobs that ended `status` over `after_sec` ago `prune_jobs` would delete."""
        if status not in FINISHED:
            raise ValueError(f"only finished jobs are pruned, not {status.value} ones")
        prunable: int = await self._db.fetchval(
            *queries.COUNT_PRUNABLE_JOBS.bind(status=status.value, after_sec=after_sec)
        )
        return prunable

    async def count_prunable_heartbeats(self, after_sec: float) -> int:
        """How many heartbeat entries older than `after_sec` `prune_heartbeats` would delete."""
        prunable: int = await self._db.fetchval(
            *queries.COUNT_PRUNABLE_HEARTBEATS.bind(after_sec=after_sec)
        )
        return prunable


#: The statuses a job ends in: the only ones pruned.
FINISHED = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.LOST})
