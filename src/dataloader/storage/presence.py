"""Live workers (`dl_workers`, migration 0007): what each process serves, and who is live.

Liveness is judged by the database's clock: a process is live while its row was refreshed
within three of its own refresh periods.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dataloader.core.routing import KnownTasks
from dataloader.storage import queries
from dataloader.storage.connections import Queries

#: Rows of processes not seen for this long are deleted (they died without deregistering).
PRUNE_AFTER_SEC = 3600.0


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One process's row: what it serves and when it was last seen."""

    worker_id: str
    host: str
    pid: int
    version: str
    queues: dict[str, int]  # queue → concurrency
    tasks: list[str]
    period_sec: float
    #: Task name → its contract (`workers.pipelines.contracts.task_spec`).
    task_specs: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LiveWorker:
    """A live process as /status shows it."""

    worker_id: str
    host: str
    pid: int
    version: str
    queues: dict[str, int]
    tasks: list[str]
    started_at: datetime
    seen_ago_sec: float


def live_worker(row: Any) -> LiveWorker:
    """A row of LIVE_WORKERS as a LiveWorker."""
    return LiveWorker(
        worker_id=row["worker_id"],
        host=row["host"],
        pid=row["pid"],
        version=row["version"],
        queues=json.loads(row["queues"]),
        tasks=list(row["tasks"]),
        started_at=row["started_at"],
        seen_ago_sec=row["seen_ago_sec"],
    )


@dataclass(frozen=True, slots=True)
class PublishedTask:
    """A task's contract, and the live processes that publish it."""

    name: str
    spec: dict[str, Any]
    workers: list[str]


class PresenceStore:
    """The statements of `dl_workers`, on a pool (the workers' own for the presence loop, the
    API's for the trigger check and /status), with its connection hygiene."""

    def __init__(self, db: Queries) -> None:
        self._db = db

    async def upsert(self, worker: WorkerInfo) -> None:
        """Record or refresh `worker`'s row (now, by the database's clock), pruning rows of
        processes long dead."""
        await self._db.execute(
            *queries.UPSERT_WORKER.bind(
                worker_id=worker.worker_id,
                host=worker.host,
                pid=worker.pid,
                version=worker.version,
                queues=json.dumps(worker.queues),
                tasks=worker.tasks,
                task_specs=json.dumps(worker.task_specs, sort_keys=True),
                period_sec=worker.period_sec,
                prune_after_sec=PRUNE_AFTER_SEC,
            )
        )

    async def touch(self, worker_id: str) -> bool:
        """Refresh a process's row and nothing else of it; False when it has none."""
        touched: bool | None = await self._db.fetchval(
            *queries.TOUCH_WORKER.bind(worker_id=worker_id)
        )
        return bool(touched)

    async def add_throughput(self, ended: Mapping[tuple[str, str], int]) -> None:
        """Add counts of ended attempts, {(queue, journal kind): n}, to the current bucket."""
        if not ended:
            return
        keys = sorted(ended)  # the same order in every process: no deadlock between upserts
        await self._db.execute(
            *queries.ADD_THROUGHPUT.bind(
                queues=[queue for queue, _ in keys],
                kinds=[kind for _, kind in keys],
                counts=[ended[key] for key in keys],
            )
        )

    async def delete(self, worker_id: str) -> None:
        """Remove a process's row (its clean stop)."""
        await self._db.execute(*queries.DELETE_WORKER.bind(worker_id=worker_id))

    async def live_workers(self) -> list[LiveWorker]:
        """Live processes, by worker id."""
        return [live_worker(row) for row in await self._db.fetch(queries.LIVE_WORKERS)]

    async def live_task_specs(self) -> list[PublishedTask]:
        """Every contract live processes publish, by task name (one per distinct contract)."""
        rows = await self._db.fetch(queries.LIVE_TASK_SPECS)
        return [
            PublishedTask(row["task"], json.loads(row["spec"]), list(row["workers"]))
            for row in rows
        ]

    async def known_tasks(self) -> KnownTasks:
        """The tasks live processes know, each with the queues its definitions name, and the
        queues live processes serve."""
        definitions: dict[str, set[str | None]] = {}
        served: set[str] = set()
        for row in await self._db.fetch(queries.LIVE_ROUTES):
            if row["task"] is None:
                served.add(row["queue"])
            else:
                definitions.setdefault(row["task"], set()).add(row["queue"])
        return KnownTasks({t: frozenset(q) for t, q in definitions.items()}, frozenset(served))

    async def queued_tasks(self) -> dict[str, list[str]]:
        """{task: the queues holding queued jobs of it}, for every task with queued jobs."""
        found: dict[str, list[str]] = {}
        for row in await self._db.fetch(queries.QUEUED_TASKS):
            found.setdefault(row["task"], []).append(row["queue"])
        return found

    async def ready_queues(self) -> list[str]:
        """Queues with at least one ready job (one index probe per queued queue)."""
        rows = await self._db.fetch(queries.READY_QUEUES)
        return [row["queue"] for row in rows]
