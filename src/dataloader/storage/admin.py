"""What operators read of the queue as a whole: per-queue statistics, counts per queue and
status, the table's health, recent lock_key collisions."""

from __future__ import annotations

from typing import Any

from dataloader.core.models import QueueStats
from dataloader.storage import queries
from dataloader.storage.connections import Connections


class AdminStore:
    """Whole-queue statistics over a source of connections."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    async def queue_stats(self, queue: str | None = None) -> dict[str, QueueStats]:
        """{queue: its statistics}, for every queue holding jobs that are queued, running,
        failed or lost; with `queue`, that queue only (all zeros if it holds none)."""
        async with self._connections.connection() as conn:
            rows = await conn.fetch(*queries.QUEUE_STATS.bind(queue=queue))
        stats = {row["queue"]: _queue_stats(row) for row in rows}
        if queue is not None and queue not in stats:
            stats[queue] = QueueStats(queue, 0, 0, 0, 0, 0, 0, None)
        return stats

    async def queue_counts(self) -> dict[str, dict[str, int]]:
        """{queue: {status: count}} over the whole table."""
        counts: dict[str, dict[str, int]] = {}
        async with self._connections.connection() as conn:
            rows = await conn.fetch(queries.QUEUE_COUNTS)
        for row in rows:
            counts.setdefault(row["queue"], {})[row["status"]] = row["n"]
        return counts

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
