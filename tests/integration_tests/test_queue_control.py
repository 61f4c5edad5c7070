"""Pausing and resuming queues, who did what (the queue's audit log and the job's journal),
and what `GET /api/v1/queues` says of a queue beyond its counts: paused, live workers and
slots, throughput."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg

from dataloader.client import Client
from dataloader.tasks import TaskRegistry
from dataloader.workers.base import QueueWorker
from dataloader.workers.job_context import JobContext

from .conftest import StartService
from .helpers import claimed_since_now, event_payloads, wait_until
from .test_lock_keys import gated
from .v1_api.test_security import ADMIN, READ, TOKENS, TRIGGER, bearer


def _worker(service: Any, queue: str) -> QueueWorker:
    worker = service.manager.queues[queue]
    assert isinstance(worker, QueueWorker)
    return worker


async def _status(conn: asyncpg.Connection, job_id: Any) -> str:
    status: str = await conn.fetchval("SELECT status::text FROM dl_jobs WHERE job_id = $1", job_id)
    return status


async def test_a_paused_queue_is_not_claimed_until_resumed(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(workers=[{"queue": "etl", "concurrency": 2}])
    paused = await service.client.post("/api/v1/queues/etl/pause")
    assert paused.status_code == 200
    assert paused.json()["paused"] is True
    assert paused.json()["changed_by"] == "api"
    job = await service.dl.enqueue("demo.noop", queue="etl", lock_key="a")
    await claimed_since_now(_worker(service, "etl"))  # woken by the insert, found nothing
    assert await _status(conn, job.job_id) == "queued"
    stats = (await service.client.get("/api/v1/queues/etl")).json()
    assert (stats["paused"], stats["paused_by"], stats["ready"]) == (True, "api", 1)
    assert stats["paused_at"] is not None

    resumed = await service.client.post("/api/v1/queues/etl/resume")
    assert resumed.json()["paused"] is False
    assert (await service.dl.wait(job.job_id, timeout=30)).status == "succeeded"
    assert (await service.client.get("/api/v1/queues/etl")).json()["paused"] is False


async def test_running_jobs_of_a_paused_queue_finish(
    start_service: StartService, registry: TaskRegistry
) -> None:
    gate = gated(registry, "t.gated")
    service = await start_service(workers=[{"queue": "etl", "concurrency": 2}])
    running = await service.dl.enqueue("t.gated", queue="etl", lock_key="a")

    async def started() -> bool:
        return (await service.dl.stats("etl"))["etl"].running == 1

    await wait_until(started, what="the job running")
    await service.dl.pause("etl")
    gate.set()
    assert (await service.dl.wait(running.job_id, timeout=30)).status == "succeeded"


async def test_a_paused_queue_gets_no_hand_off(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """The end of a job normally claims the next job of its lock_key for the same worker in
    the same statement: not from a paused queue."""
    gate = gated(registry, "t.gated")
    service = await start_service(workers=[{"queue": "etl", "concurrency": 2}])
    first = await service.dl.enqueue("t.gated", queue="etl", lock_key="serial")
    second = await service.dl.enqueue("t.gated", queue="etl", lock_key="serial")

    async def first_running() -> bool:
        return await _status(conn, first.job_id) == "running"

    await wait_until(first_running, what="the first job running")
    await service.dl.pause("etl")
    gate.set()
    assert (await service.dl.wait(first.job_id, timeout=30)).status == "succeeded"
    await claimed_since_now(_worker(service, "etl"))
    assert await _status(conn, second.job_id) == "queued"
    await service.dl.resume("etl")
    assert (await service.dl.wait(second.job_id, timeout=30)).status == "succeeded"


async def test_a_pause_outlives_the_process_that_saw_it(start_service: StartService) -> None:
    api = await start_service(run_workers=False)
    await api.dl.pause("etl")
    job = await api.dl.enqueue("demo.noop", queue="etl", lock_key="a")
    workers = await start_service(workers=[{"queue": "etl", "concurrency": 1}])
    await claimed_since_now(_worker(workers, "etl"))
    assert (await workers.dl.get(job.job_id)).status == "queued"  # type: ignore[union-attr]
    await api.dl.resume("etl")  # another process resumes: the workers are woken
    assert (await workers.dl.wait(job.job_id, timeout=30)).status == "succeeded"


async def test_pause_and_resume_are_audited_once_per_change(start_service: StartService) -> None:
    service = await start_service(run_workers=False)
    dl: Client = service.dl
    assert (await dl.resume("never")).paused is False  # nothing to resume: nothing written
    assert await dl.queue_events("never") == []
    ops = dl.acting_as("alice")
    first = await ops.pause("etl")
    again = await dl.pause("etl")  # already paused: unchanged, not journaled
    assert (first.paused, first.changed_by) == (True, "alice")
    assert (again.changed_by, again.changed_at) == ("alice", first.changed_at)
    await dl.resume("etl")
    events = await dl.queue_events("etl")
    assert [(e.kind, e.actor) for e in events] == [("paused", "alice"), ("resumed", "client")]
    assert await dl.queue_events("etl", after=events[0].event_id) == events[1:]
    body = (await service.client.get("/api/v1/queue-events", params={"queue": "etl"})).json()
    assert [(e["kind"], e["actor"], e["queue"]) for e in body["events"]] == [
        ("paused", "alice", "etl"),
        ("resumed", "client", "etl"),
    ]
    one = await service.client.get("/api/v1/queue-events", params={"queue": "etl", "limit": 1})
    assert len(one.json()["events"]) == 1


async def test_the_caller_of_each_change_is_recorded(
    start_service: StartService, conn: asyncpg.Connection, registry: TaskRegistry
) -> None:
    """Trigger, cancel and retry name the token in the job's journal; pause and resume in the
    queue's audit log."""
    service = await start_service(
        run_workers=False, api_tokens=json.dumps(TOKENS), allow_unknown_tasks=True
    )
    http = service.client
    trigger = {"queue": "etl", "task": "demo.noop", "lock_key": "a"}
    triggered = await http.post("/api/v1/jobs/trigger", json=trigger, headers=bearer(TRIGGER))
    job_id = triggered.json()["job_id"]
    await http.post(f"/api/v1/jobs/{job_id}/cancel", headers=bearer(ADMIN))
    await http.post(f"/api/v1/jobs/{job_id}/retry", headers=bearer(TRIGGER))
    assert [p["by"] for p in await event_payloads(conn, job_id, "queued")] == ["token:etl"]
    assert [p["by"] for p in await event_payloads(conn, job_id, "canceled")] == ["token:ops"]
    assert [p["by"] for p in await event_payloads(conn, job_id, "retried")] == ["token:etl"]

    refused = await http.post("/api/v1/queues/etl/pause", headers=bearer(TRIGGER))
    assert refused.status_code == 403
    assert await conn.fetchval("SELECT count(*) FROM dl_queues") == 0
    await http.post("/api/v1/queues/etl/pause", headers=bearer(ADMIN))
    await http.post("/api/v1/queues/etl/resume", headers=bearer(ADMIN))
    log = await http.get("/api/v1/queue-events?queue=etl", headers=bearer(READ))
    assert [(e["kind"], e["actor"]) for e in log.json()["events"]] == [
        ("paused", "token:ops"),
        ("resumed", "token:ops"),
    ]


async def test_bad_queue_names_are_refused_and_write_nothing(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False)
    for name in ("q" * 1000, "bad%00name"):
        response = await service.client.post(f"/api/v1/queues/{name}/pause")
        assert response.status_code == 422, name
    assert (await service.client.get("/api/v1/queue-events")).status_code == 422  # no queue
    assert await conn.fetchval("SELECT count(*) FROM dl_queues") == 0
    assert await conn.fetchval("SELECT count(*) FROM dl_queue_events") == 0
    slash = await service.client.post("/api/v1/queues/etl/daily/pause")
    assert slash.json()["queue"] == "etl/daily"


async def test_queues_show_their_live_workers_slots_and_throughput(
    start_service: StartService, registry: TaskRegistry
) -> None:
    @registry.register("t.flaky")
    async def flaky(ctx: JobContext[dict[str, Any]]) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    # live while seen within three periods: a period of 1 s outlasts a slow machine's stalls
    service = await start_service(
        workers=[{"queue": "etl", "concurrency": 3}], presence_period_sec=1
    )
    await start_service(workers=[{"queue": "etl", "concurrency": 2}], presence_period_sec=1)
    jobs = [await service.dl.enqueue("demo.noop", queue="etl", lock_key=f"k{i}") for i in range(5)]
    flaky_job = await service.dl.enqueue("t.flaky", queue="etl", lock_key="f", max_attempts=2)
    for job in [*jobs, flaky_job]:
        assert (await service.dl.wait(job.job_id, timeout=30)).status == "succeeded"

    async def counted() -> dict[str, Any] | None:
        body = (await service.client.get("/api/v1/queues/etl")).json()
        last_minute = body["throughput"][0]
        return body if last_minute["succeeded"] == 6 and last_minute["retried"] == 1 else None

    body = await wait_until(counted, what="the ended attempts written")
    assert (body["workers"], body["slots"]) == (2, 5)
    assert [t["window_sec"] for t in body["throughput"]] == [60, 300, 3600]
    for window in body["throughput"]:
        assert (window["succeeded"], window["failed"], window["retried"]) == (6, 0, 1)
        assert window["per_minute"] == 6 * 60 / window["window_sec"]
    listed = (await service.client.get("/api/v1/queues")).json()["queues"]
    assert [q["queue"] for q in listed] == ["etl"]  # served, holding nothing


async def test_a_paused_empty_queue_is_listed(start_service: StartService) -> None:
    service = await start_service(run_workers=False)
    await service.dl.pause("quiet")
    stats = await service.dl.stats()
    assert list(stats) == ["quiet"]
    assert (stats["quiet"].paused, stats["quiet"].paused_by) == (True, "client")
    assert stats["quiet"].total == 0


async def test_a_pause_not_committed_yet_blocks_no_claim(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """Pausing from a transaction left open does not pause anything until it commits."""
    service = await start_service(workers=[{"queue": "etl", "concurrency": 1}])
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO dl_queues (queue, paused, changed_by) VALUES ('etl', true, 'sql')"
        )
        job = await service.dl.enqueue("demo.noop", queue="etl", lock_key="a")
        done = await asyncio.wait_for(service.dl.wait(job.job_id), timeout=30)
        assert done.status == "succeeded"


async def test_an_action_path_with_another_method_is_no_queue_name(
    start_service: StartService,
) -> None:
    service = await start_service(run_workers=False)
    assert (await service.client.get("/api/v1/queues/etl/pause")).status_code == 405
    assert (await service.client.get("/api/v1/queues/etl/resume")).status_code == 405
    assert (await service.client.get("/api/v1/queues/etl/limits")).status_code == 405
    assert (await service.client.get("/api/v1/queues/etl/pauses")).status_code == 200


async def test_a_first_pause_or_limit_waiting_on_anothers_insert_answers_the_settings(
    db_dsn: str, conn: asyncpg.Connection
) -> None:
    """Two first changes of a queue at once: the second waits on the first's new row, finds
    it says the same, and answers it (it was an assertion error: a 500 over HTTP)."""
    async with Client.connect(db_dsn) as client:
        for change, value in (
            ("pause", lambda: client.pause("race")),
            ("limits", lambda: client.set_limits("race2", max_running=3)),
        ):
            queue = "race" if change == "pause" else "race2"
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO dl_queues (queue, paused, changed_by, max_running)"
                    " VALUES ($1, $2, 'other', $3)",
                    queue,
                    change == "pause",
                    3 if change == "limits" else None,
                )
                waiting = asyncio.create_task(value())

                async def blocked() -> bool:
                    return bool(
                        await conn.fetchval(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                            " AND datname = current_database()"
                        )
                    )

                await wait_until(blocked, what=f"the {change} to wait on the row")
            settings = await waiting
            assert settings.queue == queue
            assert settings.changed_by == "other"
            assert settings.paused is (change == "pause")
