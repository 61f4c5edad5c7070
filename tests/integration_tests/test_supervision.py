"""No loop of a process dies silently: one that raises is logged, recorded as failed (and
warned of in /status), restarted with a backoff, and recorded as running again."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from dataloader.maintenance.leader import Leadership
from dataloader.maintenance.runner import Maintenance, Periodic
from dataloader.storage.connections import GuardedPool
from dataloader.storage.maintenance import MaintenanceStore
from dataloader.tasks import TaskRegistry
from dataloader.workers.base import QueueWorker
from dataloader.workers.heartbeat import Heartbeat
from dataloader.workers.supervisor import Supervisor, backoff

from .conftest import StartService
from .helpers import block_first_run, pipeline_running, wait_until


@pytest.fixture
async def store(db_dsn: str) -> AsyncIterator[MaintenanceStore]:
    pool = await asyncpg.create_pool(db_dsn, min_size=1, max_size=4)
    yield MaintenanceStore(GuardedPool(pool, 10))
    await pool.close()


async def _run_of(conn: asyncpg.Connection, task: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT holder, ok, error, runs FROM dl_maintenance_runs WHERE task = $1", task
    )


def test_the_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff(n, 1.0, 10.0) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert backoff(10_000, 1.0, 60.0) == 60.0


async def test_a_loop_that_raises_is_logged_recorded_restarted_and_warned_of_until_it_runs(
    start_service: StartService,
    store: MaintenanceStore,
    conn: asyncpg.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = await start_service(run_workers=False)
    await conn.execute(
        "INSERT INTO dl_workers (worker_id, host, pid, version, queues, period_sec)"
        " VALUES ('p1', 'h', 1, '0', '{\"q\": 1}', 60)"
    )
    calls = 0
    restarted = asyncio.Event()
    stopping = asyncio.Event()

    async def listener(stop: asyncio.Event) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the socket went away")
        restarted.set()
        await stop.wait()

    # a restart two seconds after the failure, recorded as running two seconds after that:
    # time enough to read /status in between
    supervisor = Supervisor(store, "p1", first_backoff_sec=2.0)
    caplog.set_level(logging.ERROR, "dataloader.workers.supervisor")
    supervised = asyncio.create_task(supervisor.run("listener", listener, stopping))

    async def failure_recorded() -> asyncpg.Record | None:
        return await _run_of(conn, "listener")

    run = await wait_until(failure_recorded, what="the failure recorded")
    warning = (
        "the listener loop of p1 failed and is restarted with a backoff:"
        " RuntimeError: the socket went away"
    )
    assert warning in (await service.client.get("/status")).json()["warnings"]
    assert (run["holder"], run["ok"], run["error"]) == (
        "p1",
        False,
        "RuntimeError: the socket went away",
    )
    [line] = [r for r in caplog.records if r.name == "dataloader.workers.supervisor"]
    assert line.getMessage() == "listener failed; restarting it in 2.0s"
    assert line.exc_info is not None

    await restarted.wait()

    async def recovered() -> bool:
        run = await _run_of(conn, "listener")
        return run is not None and run["ok"]

    await wait_until(recovered, what="the loop recorded as running again")
    assert not [
        w for w in (await service.client.get("/status")).json()["warnings"] if "listener" in w
    ]
    stopping.set()
    await supervised  # a loop that returns (its process stops) is not restarted
    assert calls == 2


async def test_a_failed_loop_of_a_process_that_is_gone_is_not_warned_of(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False)
    await conn.execute(
        "INSERT INTO dl_maintenance_runs (task, holder, started_at, ok, error, detail)"
        " VALUES ('heartbeat', 'gone', now(), false, 'RuntimeError: x', '{\"supervised\": true}')"
    )
    warnings = (await service.client.get("/status")).json()["warnings"]
    assert not [w for w in warnings if "heartbeat" in w]


async def test_a_maintenance_loop_that_raises_is_restarted_and_the_others_go_on(
    store: MaintenanceStore, conn: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """A cron loop whose next slot cannot be found (outside its run) is recorded as failed and
    starts again; the reaper's loop goes on meanwhile."""
    stopping = asyncio.Event()
    restarted = asyncio.Event()
    reaped = asyncio.Event()
    asked = 0

    async def tick(_stopping: asyncio.Event) -> dict[str, Any]:
        return {"enqueued": 0}

    async def sweep(_stopping: asyncio.Event) -> dict[str, Any]:
        reaped.set()
        return {}

    def next_in_sec() -> float:
        nonlocal asked
        asked += 1
        if asked == 1:
            raise ValueError("failed to find next date")
        restarted.set()
        return 3600.0

    maintenance = Maintenance(
        Leadership(store, "p1", 30),
        store,
        [Periodic("cron", tick, 60, next_in_sec), Periodic("reaper", sweep, 3600)],
        Supervisor(store, "p1", first_backoff_sec=0.01),
    )
    caplog.set_level(logging.ERROR, "dataloader.workers.supervisor")
    running = asyncio.create_task(maintenance.run(stopping))
    await restarted.wait()
    await reaped.wait()
    # its first run (ok), the failure of its loop, and the run after the restart (ok)
    run = await _run_of(conn, "cron")
    assert run is not None
    assert (run["ok"], run["runs"]) == (True, 3)
    assert any(
        r.getMessage() == "cron failed; restarting it in 0.0s" and r.exc_info
        for r in caplog.records
    )
    stopping.set()
    await running


async def test_a_queue_loop_that_raises_is_restarted_and_its_jobs_run(
    start_service: StartService,
    conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every loop the worker manager starts is supervised: here, a queue's claim loop."""
    original = QueueWorker.run
    failed = False

    async def fails_once(self: QueueWorker, stopping: asyncio.Event) -> None:
        nonlocal failed
        if not failed:
            failed = True
            raise RuntimeError("claim loop broke")
        await original(self, stopping)

    monkeypatch.setattr(QueueWorker, "run", fails_once)
    caplog.set_level(logging.ERROR, "dataloader.workers.supervisor")
    service = await start_service()
    job_id = await service.trigger(task="demo.noop")
    await service.wait_status(job_id, "succeeded")
    assert any(r.getMessage().startswith("queue:default failed") for r in caplog.records)

    async def recovered() -> bool:
        run = await _run_of(conn, "queue:default")
        return run is not None and run["ok"] and run["runs"] == 2

    await wait_until(recovered, what="the queue loop recorded as running again")


async def test_a_heartbeat_that_raises_stops_the_running_jobs_before_it_restarts(
    start_service: StartService,
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing stops a job at its fence deadline while the heartbeat is down: its jobs are
    stopped (and handed back) when it fails, not left to outlive their lease."""
    stopped = block_first_run(registry, "t.long")
    started = asyncio.Event()
    original = Heartbeat.fence_stale
    broken = False

    def fence_stale(self: Heartbeat) -> None:
        nonlocal broken
        if started.is_set() and not broken:
            broken = True
            raise RuntimeError("heartbeat broke")
        original(self)

    monkeypatch.setattr(Heartbeat, "fence_stale", fence_stale)
    service = await start_service(workers=[{"queue": "default", "concurrency": 1}])
    job_id = await service.trigger(task="t.long")
    await wait_until(pipeline_running(service.manager, job_id), what="the job running")
    started.set()
    service.manager.runtime.job_started.set()  # the heartbeat's next turn now
    await stopped.wait()

    async def handed_back() -> bool:
        reason = await conn.fetchval(
            "SELECT payload->>'reason' FROM dl_job_events WHERE job_id = $1 AND kind = 'requeue'",
            uuid.UUID(job_id),
        )
        return reason == "the heartbeat failed"

    await wait_until(handed_back, what="the job handed back")
