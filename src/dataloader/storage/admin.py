"""What operators read of the queue as a whole: counts per queue and status, the table's
health, recent lock_key collisions."""

from __future__ import annotations

from typing import Any

from dataloader.storage import queries
from dataloader.storage.connections import Connections


class AdminStore:
    """Whole-queue statistics over a source of connections."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections

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
