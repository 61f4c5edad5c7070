"""The client's typed reads of the whole system (`status`, `workers`, `maintenance`,
`known_tasks`): what /status, `dataloader status` and the dashboard show, read one way."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from dataloader import Client
from dataloader.health import MaintenanceState, SystemStatus
from dataloader.storage.maintenance import MAINTENANCE_LEASE

from .conftest import Service, StartService, wait_until

SERVED = "reads.served"


async def a_service(start_service: StartService) -> Service:
    """A service whose workers serve `SERVED` (2 slots) and lead maintenance; two jobs of a
    task nobody knows wait in queue `reads.other`, which nobody serves."""
    service = await start_service(
        workers=[{"queue": SERVED, "concurrency": 2}], allow_unknown_tasks=True
    )
    for _ in range(2):
        await service.trigger(queue="reads.other", task="reads.unknown")

    async def leading() -> bool:
        return service.manager.maintenance.leadership.leading.is_set()

    await wait_until(leading, what="the service to lead maintenance")
    return service


async def test_status_is_typed_and_says_what_get_status_says(
    start_service: StartService,
) -> None:
    service = await a_service(start_service)
    client: Client = service.dl

    system = await client.status()
    assert isinstance(system, SystemStatus)
    other = system.queues["reads.other"]
    assert (other.ready, other.running, other.paused) == (2, 0, False)
    assert system.queues[SERVED].ready == 0
    [me] = [w for w in system.live_workers if w.worker_id == service.manager.worker_id]
    assert me.queues == {SERVED: 2}
    assert system.maintenance.leader is not None
    assert system.maintenance.leader.holder == service.manager.worker_id
    assert any(
        "'reads.other' has ready jobs and no live worker serves it" in w for w in system.warnings
    )
    assert any("task 'reads.unknown' has queued jobs" in w for w in system.warnings)

    body: dict[str, Any] = (await service.client.get("/status")).json()
    document = system.document()
    for key in ("database", "queues", "warnings"):
        assert body[key] == document[key], key
    assert [w["worker_id"] for w in body["live_workers"]] == [
        w["worker_id"] for w in document["live_workers"]
    ]
    assert body["maintenance"]["leader"]["holder"] == document["maintenance"]["leader"]["holder"]


async def test_workers_maintenance_and_known_tasks_read_the_live_processes(
    start_service: StartService,
) -> None:
    service = await a_service(start_service)
    client: Client = service.dl

    workers = await client.workers()
    assert [w.worker_id for w in workers] == [service.manager.worker_id]
    assert workers[0].queues == {SERVED: 2}
    assert "demo.noop" in workers[0].tasks

    maintenance = await client.maintenance()
    assert isinstance(maintenance, MaintenanceState)
    assert maintenance.leader is not None
    assert maintenance.leader.name == MAINTENANCE_LEASE
    assert maintenance.leader.holder == service.manager.worker_id

    known = await client.known_tasks()
    assert "demo.noop" in known.tasks()
    assert "reads.unknown" not in known.tasks()
    assert SERVED in known.served


async def test_throughput_is_a_series_of_ended_attempts_per_step(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False)
    await conn.execute(
        "INSERT INTO dl_queue_throughput (queue, bucket, kind, n) VALUES"
        " ('a', date_trunc('minute', now()) - interval '2 minutes', 'done', 5),"
        " ('b', date_trunc('minute', now()) - interval '2 minutes', 'failed', 1),"
        " ('a', date_trunc('minute', now()) - interval '2 hours', 'done', 7)"
    )
    series = await service.dl.throughput(span_sec=3600, step_sec=60)
    assert [(p.succeeded, p.failed) for p in series] == [(5, 1)]
    day = await service.dl.throughput(span_sec=86_400, step_sec=3600)
    assert sum(p.succeeded for p in day) == 12
    only_b = await service.dl.throughput(span_sec=3600, step_sec=60, queue="b")
    assert [(p.succeeded, p.failed) for p in only_b] == [(0, 1)]
    with pytest.raises(ValueError, match="step_sec"):
        await service.dl.throughput(span_sec=60, step_sec=3600)
    page = (await service.client.get("/ui", follow_redirects=True)).text
    assert "5 succeeded" in page
