"""What operators read of the queue as a whole and set on its queues: per-queue statistics,
pause and resume with their audit log, the table's health, recent lock_key collisions."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Final

from dataloader.core.cron import CronState
from dataloader.core.models import QueueStats
from dataloader.core.queues import (
    THROUGHPUT_WINDOWS_SEC,
    QueueEvent,
    QueueLimits,
    QueueSettings,
    Throughput,
    ThroughputPoint,
    series_of,
    throughput_of,
)
from dataloader.storage import processes, queries
from dataloader.storage.connections import Connections, OnConnections
from dataloader.storage.db import AnyConnection
from dataloader.storage.maintenance import Lease, MaintenanceRun, MaintenanceStore
from dataloader.storage.presence import LiveWorker, PresenceStore, live_worker

#: Processes in error /status counts at most (it says "at least" beyond).
PROCESSES_IN_ERROR_LOOKED_AT: Final = 10_000


class AdminStore:
    """Whole-queue statistics and queue settings over a source of connections."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    @property
    def connections(self) -> Connections:
        """Where its statements run."""
        return self._connections

    async def throughput_series(
        self, span_sec: int, step_sec: int, queue: str | None = None
    ) -> list[ThroughputPoint]:
        """Attempts ended per outcome in each `step_sec` of the last `span_sec` seconds."""
        async with self._connections.connection() as conn:
            rows = await conn.fetch(
                *queries.THROUGHPUT_SERIES.bind(span_sec=span_sec, step_sec=step_sec, queue=queue)
            )
        return series_of((row["at"], row["kind"], row["n"]) for row in rows)

    async def processes_in_error(self) -> dict[str, int]:
        """{namespace: its live durable processes in error}, PROCESSES_IN_ERROR_LOOKED_AT
        looked at in all."""
        async with self._connections.connection() as conn:
            rows = await conn.fetch(
                *processes.PROCESSES_IN_ERROR.bind(limit=PROCESSES_IN_ERROR_LOOKED_AT)
            )
        return {r["namespace"]: r["n"] for r in rows}

    async def queue_stats(
        self, queue: str | None = None, live: Iterable[LiveWorker] | None = None
    ) -> dict[str, QueueStats]:
        """{queue: its statistics}, by name, for every queue that holds jobs queued, running,
        failed or lost, is paused, is served by a live process, or ended attempts in the last
        hour; with `queue`, that queue only (all zeros if none of this applies). The workers
        and slots serving each queue are counted from `live`, the live processes, when the
        caller read them already."""
        async with self._connections.connection() as conn:
            rows = await conn.fetch(*queries.QUEUE_STATS.bind(queue=queue))
            settings = await _settings(conn)
            if live is None:
                live = [live_worker(r) for r in await conn.fetch(queries.LIVE_WORKERS)]
            throughput = await _throughput(conn, queue)
        served = _served(live)
        stats = {row["queue"]: _queue_stats(row) for row in rows}
        steered = {q for q, s in settings.items() if s.paused or s.limits.any}
        named = steered | served.keys() | throughput.keys()
        for name in named if queue is None else {queue}:
            stats.setdefault(name, QueueStats(name, 0, 0, 0, 0, 0, 0, None))
        for name, found in stats.items():
            setting = settings.get(name)
            paused = setting is not None and setting.paused
            workers, slots = served.get(name, (0, 0))
            stats[name] = replace(
                found,
                paused=paused,
                paused_by=setting.changed_by if paused and setting else None,
                paused_at=setting.changed_at if paused and setting else None,
                limits=setting.limits if setting is not None else QueueLimits(),
                workers=workers,
                slots=slots,
                throughput=tuple(throughput.get(name) or throughput_of({})),
            )
        return dict(sorted(stats.items()))

    async def pause(self, queue: str, actor: str) -> QueueSettings:
        """Pause `queue` (a paused one stays as it is); its settings after."""
        async with self._connections.connection() as conn:
            row = await conn.fetchrow(*queries.PAUSE_QUEUE.bind(queue=queue, actor=actor))
            return _settings_of(row or await _inserted_meanwhile(conn, queue))

    async def resume(self, queue: str, actor: str) -> QueueSettings:
        """Resume `queue` and wake its workers (one not paused stays as it is)."""
        async with self._connections.connection() as conn:
            row = await conn.fetchrow(*queries.RESUME_QUEUE.bind(queue=queue, actor=actor))
        return QueueSettings(queue, paused=False) if row is None else _settings_of(row)

    async def set_limits(self, queue: str, limits: QueueLimits, actor: str) -> QueueSettings:
        """Set `queue`'s limits (each None: none), and wake its workers; its settings after."""
        async with self._connections.connection() as conn:
            row = await conn.fetchrow(
                *queries.SET_QUEUE_LIMITS.bind(
                    queue=queue,
                    actor=actor,
                    max_running=limits.max_running,
                    max_running_per_partition=limits.max_running_per_partition,
                    max_per_second=limits.max_per_second,
                )
            )
            return _settings_of(row or await _inserted_meanwhile(conn, queue))

    async def queue_events(self, queue: str, after: int, limit: int | None) -> list[QueueEvent]:
        """The queue's audit log after event `after`, oldest first, `limit` at most."""
        async with self._connections.connection() as conn:
            rows = await conn.fetch(
                *queries.QUEUE_EVENTS.bind(queue=queue, after=after, limit=limit)
            )
        return [
            QueueEvent(
                r["event_id"], queue, r["ts"], r["kind"], r["actor"], json.loads(r["payload"])
            )
            for r in rows
        ]

    async def maintenance(self) -> dict[str, Any]:
        """The queue table's dead rows, the oldest transaction that may keep vacuum from
        removing them (None when no transaction is open), and recent lock_key collisions."""
        async with self._connections.connection() as conn:
            table = await conn.fetchrow(queries.QUEUE_TABLE_HEALTH)
            oldest = await conn.fetchrow(queries.OLDEST_TRANSACTION)
            collisions = await conn.fetchval(queries.RECENT_LOCK_COLLISIONS)
        return {
            "queue_table": dict(table) if table is not None else None,
            "oldest_transaction": dict(oldest) if oldest is not None else None,
            "lock_key_collisions_last_hour": collisions,
        }


async def _settings(conn: AnyConnection) -> dict[str, QueueSettings]:
    return {r["queue"]: _settings_of(r) for r in await conn.fetch(queries.QUEUE_SETTINGS)}


async def _inserted_meanwhile(conn: AnyConnection, queue: str) -> Any:
    """The queue's settings row, read by a statement of its own: when a first change of the
    queue by someone else commits while ours waits to insert its row, ours finds the row,
    leaves it as it is (it already says what ours would), and cannot see it in its own
    snapshot."""
    row = await conn.fetchrow(*queries.QUEUE_SETTING.bind(queue=queue))
    assert row is not None  # committed before our statement ended, and never deleted
    return row


def _settings_of(row: Any) -> QueueSettings:
    limits = QueueLimits(
        row["max_running"], row["max_running_per_partition"], row["max_per_second"]
    )
    return QueueSettings(row["queue"], row["paused"], row["changed_at"], row["changed_by"], limits)


def _served(live: Iterable[LiveWorker]) -> dict[str, tuple[int, int]]:
    """{queue: (live processes serving it, their slots for it)}."""
    served: dict[str, tuple[int, int]] = {}
    for worker in live:
        for queue, slots in worker.queues.items():
            workers, total = served.get(queue, (0, 0))
            served[queue] = (workers + 1, total + slots)
    return served


async def _throughput(conn: AnyConnection, queue: str | None) -> dict[str, list[Throughput]]:
    """{queue: its throughput in each window} of the queues that ended attempts lately."""
    counts: dict[str, dict[tuple[str, int], int]] = {}
    for row in await conn.fetch(*queries.QUEUE_THROUGHPUT.bind(queue=queue)):
        by_window = counts.setdefault(row["queue"], {})
        for window in THROUGHPUT_WINDOWS_SEC:
            by_window[row["kind"], window] = row[f"n_{window}"]
    return {name: throughput_of(c) for name, c in counts.items()}


def _queue_stats(row: Any) -> QueueStats:
    delayed, waiting = row["delayed"], row["waiting"]
    age = row["oldest_age_sec"]
    return QueueStats(
        queue=row["queue"],
        # a delayed job come due but not put back yet is ready: it is put back at once
        ready=max(0, row["queued"] - delayed - waiting),
        waiting=waiting,
        delayed=delayed,
        running=row["running"],
        failed=row["failed"],
        lost=row["lost"],
        oldest_ready_age_sec=age if age is not None and age >= 0 else None,
    )


@dataclass(frozen=True)
class StatusReading:
    """What `GET /status` and `dataloader status` show, each part read once."""

    queues: dict[str, QueueStats]
    #: the queue table's health (AdminStore.maintenance)
    table: dict[str, Any]
    live: list[LiveWorker]
    #: queues with at least one ready job
    ready: list[str]
    #: {task: the queues holding queued jobs of it}
    queued_tasks: dict[str, list[str]]
    leases: list[Lease]
    runs: list[MaintenanceRun]
    cron: dict[str, CronState]
    #: {namespace: durable processes in error} (PROCESSES_IN_ERROR_LOOKED_AT at most in all)
    processes_in_error: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StatusCounts:
    """What /status counts of the jobs and processes: the part of it that may be read from a
    standby (`read_counts`)."""

    queues: dict[str, QueueStats]
    ready: list[str]
    queued_tasks: dict[str, list[str]]
    processes_in_error: dict[str, int]


async def read_counts(connections: Connections, live: list[LiveWorker]) -> StatusCounts:
    """/status's counts on `connections`, the queues' workers counted from `live`."""
    admin = AdminStore(connections)
    presence = PresenceStore(OnConnections(connections))
    return StatusCounts(
        queues=await admin.queue_stats(live=live),
        ready=await presence.ready_queues(),
        queued_tasks=await presence.queued_tasks(),
        processes_in_error=await admin.processes_in_error(),
    )


async def read_status(
    admin: AdminStore,
    presence: PresenceStore,
    maintenance: MaintenanceStore,
    counts: Callable[[list[LiveWorker]], Awaitable[StatusCounts]] | None = None,
) -> StatusReading:
    """The whole system as /status shows it: the live processes first, which the queues'
    statistics count rather than read again; the counts by `counts` (given the live
    processes), or on `admin`'s connections. The table's health, the live processes and
    maintenance are `admin`'s, `presence`'s and `maintenance`'s (the primary's: a standby
    has its own transactions and dead rows, and its lag would age the processes' beats)."""
    live = await presence.live_workers()
    counted = await (counts or functools.partial(read_counts, admin.connections))(live)
    return StatusReading(
        queues=counted.queues,
        table=await admin.maintenance(),
        live=live,
        ready=counted.ready,
        queued_tasks=counted.queued_tasks,
        leases=await maintenance.leases(),
        runs=await maintenance.runs(),
        cron=await maintenance.cron_state(),
        processes_in_error=counted.processes_in_error,
    )
