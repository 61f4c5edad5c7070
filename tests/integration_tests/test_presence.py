"""Live workers (`dl_workers`): each process records the queues it serves and the tasks it
knows; a trigger is refused only where it certainly cannot run (`core.routing`: another queue
than its task's; a queue live processes serve while none knows the task, unless
DL_ALLOW_UNKNOWN_TASKS), and a task nobody knows is accepted and shown (/status, the task
list); /status warns of queues with ready jobs that no live process serves."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import asyncpg

from dataloader.config import Settings
from dataloader.runner import Runner
from dataloader.storage import db, queries
from dataloader.storage.connections import GuardedPool
from dataloader.storage.presence import PresenceStore, WorkerInfo
from dataloader.tasks import TaskRegistry

from .conftest import StartService, wait_until
from .helpers import add_worker
from .v1_api.constants import STATUS_URL, TRIGGER_URL


async def rows(conn: asyncpg.Connection) -> dict[str, asyncpg.Record]:
    return {r["worker_id"]: r for r in await conn.fetch("SELECT * FROM dl_workers")}


# --- the presence loop ------------------------------------------------------------------------


async def test_a_process_registers_refreshes_and_deregisters_on_a_clean_stop(
    make_settings: Callable[..., Settings], registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    settings = make_settings(
        workers=[{"queue": "a", "concurrency": 2}, {"queue": "b", "concurrency": 1}],
        presence_period_sec=0.5,
    )
    async with Runner(settings, registry) as runner:
        assert runner.manager is not None
        worker_id = runner.manager.worker_id
        row = (await rows(conn))[worker_id]  # registered before start returned
        assert json.loads(row["queues"]) == {"a": 2, "b": 1}
        assert sorted(row["tasks"]) == list(registry)
        first_seen = row["seen_at"]

        async def refreshed() -> bool:
            return bool((await rows(conn))[worker_id]["seen_at"] > first_seen)

        await wait_until(refreshed, what="a refresh of the row")
    assert worker_id not in await rows(conn)


async def test_a_process_serving_no_queue_claims_no_task(
    make_settings: Callable[..., Settings], registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    async with Runner(make_settings(workers=[]), registry) as runner:
        assert runner.manager is not None
        row = (await rows(conn))[runner.manager.worker_id]
        assert row["tasks"] == []
        assert json.loads(row["queues"]) == {}


async def test_a_stale_process_is_not_live_and_is_pruned_later(
    db_dsn: str, conn: asyncpg.Connection
) -> None:
    # live while seen within three of its periods
    await add_worker(conn, "fresh", {"q": 1}, ["t.fresh"], seen_ago_sec=1, period_sec=10)
    await add_worker(conn, "late", {"q": 1}, ["t.late"], seen_ago_sec=40, period_sec=10)
    await add_worker(conn, "dead", {"q": 1}, ["t.dead"], seen_ago_sec=7200, period_sec=1)
    pool = await db.create_pool(db_dsn, 2, "test-presence")
    try:
        store = PresenceStore(GuardedPool(pool))
        assert [w.worker_id for w in await store.live_workers()] == ["fresh"]
        assert (await store.known_tasks()).tasks() == {"t.fresh"}
        # a refresh of any process prunes rows not seen for an hour, not merely late ones
        await store.upsert(WorkerInfo("me", "h", 2, "0", {"q": 1}, ["t.me"], 5))
        assert sorted(await rows(conn)) == ["fresh", "late", "me"]
        assert (await store.known_tasks()).tasks() == {"t.fresh", "t.me"}
    finally:
        await pool.close()


# --- the trigger check ------------------------------------------------------------------------

TASKS_URL = "/api/v1/tasks"
AWAITED = "task 'etl.load' has queued jobs (queue 'etl') and no live process knows it"


async def test_a_task_nobody_knows_on_a_queue_nobody_serves_is_accepted_and_shown(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """An API replica while every worker is away (a deploy, workers started later): the job
    waits, and /status and the task list say which task nobody knows yet."""
    api = await start_service(run_workers=False, allow_unknown_tasks=False)
    job_id = await api.trigger(queue="etl", task="etl.load")
    assert await conn.fetchval("SELECT status FROM dl_jobs WHERE job_id = $1::uuid", job_id) == (
        "queued"
    )
    warnings = (await api.client.get(STATUS_URL)).json()["warnings"]
    assert any(w.startswith(AWAITED) for w in warnings), warnings
    tasks = (await api.client.get(TASKS_URL)).json()
    assert tasks == {"tasks": [], "awaited": [{"name": "etl.load", "queues": ["etl"]}]}

    await add_worker(conn, "late", {"etl": 1}, ["etl.load"])  # its worker arrives
    warnings = (await api.client.get(STATUS_URL)).json()["warnings"]
    assert not any(w.startswith(AWAITED) for w in warnings), warnings
    tasks = (await api.client.get(TASKS_URL)).json()
    assert [t["name"] for t in tasks["tasks"]] == ["etl.load"]
    assert tasks["awaited"] == []


async def test_a_task_is_refused_where_live_processes_serve_its_queue_and_none_knows_it(
    start_service: StartService, conn: asyncpg.Connection, registry: TaskRegistry
) -> None:
    api = await start_service()  # serves `default`, knows the demo tasks
    response = await api.client.post(
        TRIGGER_URL, json={"queue": "default", "task": "demo.nop", "lock_key": "k"}
    )
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "task"]
    assert error["type"] == "unknown_task"
    assert "'demo.nop'" in error["msg"]
    assert "queue 'default'" in error["msg"]
    assert f"known: {', '.join(registry)}" in error["msg"]
    assert "DL_ALLOW_UNKNOWN_TASKS" in error["msg"]
    assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 0
    assert await conn.fetchval("SELECT count(*) FROM dl_job_events") == 0
    await api.trigger(task="demo.noop")  # a known one is accepted
    await api.trigger(queue="elsewhere", task="demo.nop")  # a queue nobody serves waits


async def test_the_opt_out_accepts_a_task_no_live_process_knows(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    api = await start_service(allow_unknown_tasks=True)
    job_id = await api.trigger(task="etl.not.deployed.yet")
    assert await conn.fetchval("SELECT task FROM dl_jobs WHERE job_id = $1::uuid", job_id) == (
        "etl.not.deployed.yet"
    )


async def test_a_task_known_to_another_live_process_only_is_accepted_while_it_lives(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """A rolling upgrade: a worker of the old version serves `etl` without the new task; a
    trigger of it is accepted while some live process knows it (its jobs wait for one that
    serves `etl` and knows it), and refused when none does."""
    api = await start_service(run_workers=False, allow_unknown_tasks=False)
    await add_worker(conn, "old", {"etl": 1}, [])
    body = {"queue": "etl", "task": "etl.load", "lock_key": "k"}
    refused = await api.client.post(TRIGGER_URL, json=body)
    assert refused.status_code == 422
    assert "live processes serve queue 'etl'" in refused.json()["detail"][0]["msg"]

    await add_worker(conn, "new", {"other": 1}, ["etl.load"])

    async def status_of_trigger() -> int:
        response = await api.client.post(TRIGGER_URL, json=body)
        return response.status_code if response.status_code == 200 else 0

    await wait_until(status_of_trigger, timeout=5, what="the other process's task accepted")
    await conn.execute("DELETE FROM dl_workers WHERE worker_id = 'new'")  # it stopped

    async def refused_again() -> bool:
        response = await api.client.post(TRIGGER_URL, json=body | {"lock_key": "k2"})
        return response.status_code == 422

    await wait_until(refused_again, timeout=5, what="the task refused again")


async def test_a_trigger_on_another_queue_than_its_tasks_is_refused_naming_both(
    start_service: StartService, conn: asyncpg.Connection, registry: TaskRegistry
) -> None:
    """Known here (the registry) or from a live process's contract, a task runs on its own
    queue: elsewhere its jobs would bypass that queue's pause and limits."""

    @registry.task("etl.daily", queue="etl")
    async def daily(ctx: object) -> None: ...

    api = await start_service(run_workers=False, allow_unknown_tasks=True)
    await add_worker(conn, "other", {"etl": 1}, ["etl.load"], task_queues={"etl.load": "etl"})
    for task in ("etl.daily", "etl.load"):
        body = {"queue": "default", "task": task, "lock_key": "k"}
        response = await api.client.post(TRIGGER_URL, json=body)
        assert response.status_code == 422, response.text
        (error,) = response.json()["detail"]
        assert error["loc"] == ["body", "queue"]
        assert f"task {task!r} runs on queue 'etl', not 'default'" in error["msg"]
        assert await conn.fetchval("SELECT count(*) FROM dl_jobs WHERE queue = 'default'") == 0
        await api.trigger(queue="etl", task=task)  # its own queue (the spec's field, required)


# --- /status ---------------------------------------------------------------------------------


async def test_status_warns_of_a_queue_with_ready_jobs_and_no_live_worker(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    api = await start_service(run_workers=False)
    await api.trigger(queue="orphan", task="etl.load")
    await api.trigger(queue="later", task="etl.load", available_at="2999-01-01T00:00:00Z")
    await conn.execute(  # finished jobs of a queue nobody serves do not matter
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status)"
        " VALUES (gen_random_uuid(), 'done', 't', 'k', 'succeeded')"
    )
    warning = "queue 'orphan' has ready jobs and no live worker serves it"

    unknown = (
        "task 'etl.load' has queued jobs (queue 'later', 'orphan') and no live process knows"
        " it: they wait for a process that does"
    )
    body = (await api.client.get(STATUS_URL)).json()
    assert body["warnings"] == [warning, unknown]
    assert body["live_workers"] == []

    await add_worker(conn, "other", {"orphan": 3}, ["etl.load"], seen_ago_sec=1)
    await conn.execute(  # which leads maintenance (else /status warns that nobody does)
        "INSERT INTO dl_leases (name, holder, expires_at)"
        " VALUES ('maintenance', 'other', now() + interval '1 hour')"
    )
    body = (await api.client.get(STATUS_URL)).json()
    assert body["warnings"] == []
    (live,) = body["live_workers"]
    assert live["worker_id"] == "other"
    assert live["queues"] == {"orphan": 3}
    assert live["host"] == "elsewhere"
    assert 0.5 < live["seen_ago_sec"] < 10

    await conn.execute("UPDATE dl_workers SET seen_at = now() - interval '1 minute'")
    assert (await api.client.get(STATUS_URL)).json()["warnings"] == [warning, unknown]


async def test_status_finds_ready_queues_and_queued_tasks_by_index_probes(
    conn: asyncpg.Connection,
) -> None:
    """/status (and the task list) must stay cheap with a million finished jobs: no scan of
    dl_jobs."""
    await conn.execute(  # 50 queues, two queued jobs each (q49's not due yet), the rest done
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, available_at)"
        " SELECT gen_random_uuid(), 'q' || (i % 50), 't' || (i % 10), 'k' || i,"
        " CASE WHEN i <= 100 THEN 'queued' ELSE 'succeeded' END::dl_status,"
        " now() + CASE WHEN i % 50 = 49 THEN interval '1 day' ELSE interval '0' END"
        " FROM generate_series(1, 20000) i"
    )
    await conn.execute("ANALYZE dl_jobs")
    for statement in (queries.READY_QUEUES, queries.QUEUED_TASKS):
        assert "Seq Scan" not in await conn.fetchval(f"EXPLAIN (FORMAT JSON) {statement}")
    found = [r["queue"] for r in await conn.fetch(queries.READY_QUEUES)]
    assert found == sorted(f"q{i}" for i in range(49))
    pairs = [(r["task"], r["queue"]) for r in await conn.fetch(queries.QUEUED_TASKS)]
    assert pairs == sorted((f"t{i % 10}", f"q{i}") for i in range(50))  # delayed ones too


# --- the OpenAPI schema -----------------------------------------------------------------------


def task_schema(openapi: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = openapi["components"]["schemas"]["TriggerRequest"]["properties"][
        "task"
    ]
    return schema


async def test_the_schema_does_not_enumerate_task_names(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """A task nobody knows is accepted on a queue nobody serves: no enum could say which
    names a trigger may take."""
    api = await start_service(run_workers=False, allow_unknown_tasks=False)
    await add_worker(conn, "other", {"etl": 1}, ["etl.load"])
    schema = task_schema((await api.client.get("/openapi.json")).json())
    assert "enum" not in schema
    assert schema["type"] == "string"


async def test_args_are_checked_as_the_schema_states_them(start_service: StartService) -> None:
    """The schema gives each locally registered task's args its model as JSON Schema; the
    trigger refuses what that refuses (pydantic's lax mode would take `false` as 0)."""
    api = await start_service()
    for args in ({"seconds": False}, {"seconds": "1"}, {"seconds": 1, "chunks": True}):
        body = {"queue": "default", "task": "demo.sleep", "lock_key": "k", "args": args}
        response = await api.client.post(TRIGGER_URL, json=body)
        assert response.status_code == 422, (args, response.text)
        assert response.json()["detail"][0]["loc"] == ["body", "args"]
    await api.trigger(task="demo.sleep", args={"seconds": 0, "chunks": 2.0})
