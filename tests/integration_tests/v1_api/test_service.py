"""API v1 (spec §5) and the infrastructure routes, against a real PostgreSQL:
trigger → status → cancel, idempotency, input validation, /health and /status."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from datetime import datetime
from typing import Any

import asyncpg
import pytest

from dataloader.api.os_router import package_version
from dataloader.core import limits

from ..conftest import StartService, wait_until
from ..helpers import event_kinds, lifecycle_kinds
from .constants import (
    HEALTH_URL,
    INVALID_RAW_BODIES,
    INVALID_TRIGGER_BODIES,
    LONG_SLEEP_ARGS,
    SPEC_STATUS_FIELDS,
    STATUS_URL,
    TRIGGER_URL,
    UNPARSABLE_RAW_BODIES,
    VALID_TRIGGER,
    cancel_url,
    job_url,
    status_url,
)


async def count_rows(conn: asyncpg.Connection, table: str) -> int:
    value: int = await conn.fetchval(f"SELECT count(*) FROM {table}")
    return value


def error_locs(body: dict[str, Any]) -> list[tuple[str | int, ...]]:
    return [tuple(error["loc"]) for error in body["detail"]]


# --- trigger → status → cancel -----------------------------------------------------------------


async def test_trigger_status_cancel_of_a_queued_job(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    api = await start_service(run_workers=False)

    response = await api.client.post(TRIGGER_URL, json=VALID_TRIGGER)
    assert response.status_code == 200, response.text
    triggered = response.json()
    assert set(triggered) == {"job_id", "status", "created"}
    assert triggered["status"] == "queued"
    assert triggered["created"] is True
    job_id = triggered["job_id"]
    assert str(uuid.UUID(job_id)) == job_id

    status = await api.status(job_id)
    assert set(status) >= SPEC_STATUS_FIELDS
    assert status["job_id"] == job_id
    assert status["status"] == "queued"
    assert status["attempt"] == 0
    assert status["started_at"] is None
    assert status["finished_at"] is None
    assert status["heartbeat_at"] is None
    assert status["error"] is None
    assert status["progress"] == {}

    response = await api.client.post(cancel_url(job_id))
    assert response.status_code == 200, response.text
    canceled = response.json()
    assert set(canceled) >= SPEC_STATUS_FIELDS
    assert canceled["status"] == "canceled"
    assert canceled["finished_at"] is not None
    assert canceled["cancel_requested"] is True
    assert await api.status(job_id) == canceled

    again = await api.client.post(cancel_url(job_id))
    assert again.status_code == 200, again.text
    assert again.json() == canceled
    assert await event_kinds(conn, job_id) == ["queued", "canceled"]


async def test_the_job_route_answers_what_its_status_route_does(
    start_service: StartService,
) -> None:
    """`GET /api/v1/jobs/{job_id}` is the job itself: the body `…/status` answers, queued and
    finished."""
    api = await start_service(run_workers=False)
    job_id = (await api.client.post(TRIGGER_URL, json=VALID_TRIGGER)).json()["job_id"]
    for action in ("trigger", "cancel"):
        if action == "cancel":
            await api.client.post(cancel_url(job_id))
        job = await api.client.get(job_url(job_id))
        assert job.status_code == 200, job.text
        assert job.json() == await api.status(job_id)
        assert job.json()["status"] == {"trigger": "queued", "cancel": "canceled"}[action]


async def test_canceled_queued_job_never_runs(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    api = await start_service(run_workers=False)
    job_id = await api.trigger(task="demo.noop")
    response = await api.client.post(cancel_url(job_id))
    assert response.json()["status"] == "canceled"

    # A worker service on the same database: it runs a job triggered after the canceled one,
    # so it has looked at the queue, and it still leaves the canceled job alone.
    workers = await start_service()
    later = await workers.trigger(task="demo.noop")
    await workers.wait_status(later, "succeeded")

    body = await workers.status(job_id)
    assert body["status"] == "canceled"
    assert body["attempt"] == 0
    assert body["started_at"] is None
    assert await event_kinds(conn, job_id) == ["queued", "canceled"]


async def test_cancel_of_a_running_job_stops_it_between_chunks(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service()
    job_id = await service.trigger(task="demo.sleep", args=LONG_SLEEP_ARGS)

    async def first_chunk_done() -> bool:
        body = await service.status(job_id)
        return body["status"] == "running" and body["progress"].get("done", 0) >= 1

    await wait_until(first_chunk_done, what="the first chunk")

    started = time.monotonic()
    response = await service.client.post(cancel_url(job_id))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["cancel_requested"] is True
    assert body["status"] in ("running", "canceled")

    final = await service.wait_status(job_id, "canceled", timeout=10)
    assert time.monotonic() - started < 10  # the sleep would take 30 s
    assert final["finished_at"] is not None
    assert final["attempt"] == 1
    progress = final["progress"]
    assert progress["total"] == LONG_SLEEP_ARGS["chunks"]
    assert progress["done"] < progress["total"]
    kinds = await event_kinds(conn, job_id)
    assert kinds[-1] == "canceled"
    assert "cancel_requested" in kinds
    assert "done" not in kinds


async def test_cancel_of_a_finished_job_changes_nothing(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service()
    job_id = await service.trigger(task="demo.noop")
    finished = await service.wait_status(job_id, "succeeded")

    response = await service.client.post(cancel_url(job_id))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "succeeded"
    assert body["finished_at"] == finished["finished_at"]
    assert body["cancel_requested"] is False
    assert body == finished
    assert await lifecycle_kinds(conn, job_id) == ["queued", "picked", "done"]


# --- idempotency -----------------------------------------------------------------------------


async def test_same_idempotency_key_returns_the_same_job(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    api = await start_service(run_workers=False)
    body = VALID_TRIGGER | {"idempotency_key": "load-2024-01-01"}
    first = await api.client.post(TRIGGER_URL, json=body)
    second = await api.client.post(TRIGGER_URL, json=body)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json() | {"created": True}
    assert second.json()["created"] is False
    assert await count_rows(conn, "dl_jobs") == 1
    assert await count_rows(conn, "dl_job_events") == 1


@pytest.mark.parametrize(
    ("change", "fields"),
    [
        ({"args": {"day": "2024-01-02"}}, ["args"]),
        ({"task": "demo.sleep", "args": {"seconds": 1}}, ["task", "args"]),
        ({"lock_key": "other"}, ["lock_key"]),
        ({"priority": 5}, ["priority"]),
        ({"max_attempts": 1}, ["max_attempts"]),
        ({"available_at": "2999-01-01T00:00:00+00:00"}, ["available_at"]),
        ({"producer": "someone-else"}, ["producer"]),
    ],
    ids=[
        "args",
        "task-and-args",
        "lock_key",
        "priority",
        "max_attempts",
        "available_at",
        "producer",
    ],
)
async def test_same_idempotency_key_with_other_fields_is_409_naming_key_and_job(
    start_service: StartService,
    conn: asyncpg.Connection,
    change: dict[str, Any],
    fields: list[str],
) -> None:
    api = await start_service(run_workers=False)
    body = VALID_TRIGGER | {"idempotency_key": "day-1", "args": {"day": "2024-01-01"}}
    job_id = await api.trigger(**body, producer="etl")
    response = await api.client.post(TRIGGER_URL, json=body | {"producer": "etl"} | change)
    assert response.status_code == 409, response.text
    answer = response.json()
    assert (answer["idempotency_key"], answer["job_id"], answer["fields"]) == (
        "day-1",
        job_id,
        fields,
    )
    assert "day-1" in answer["detail"]
    assert job_id in answer["detail"]
    assert await count_rows(conn, "dl_jobs") == 1
    assert await count_rows(conn, "dl_job_events") == 1


async def test_omitted_optional_fields_are_no_difference_and_available_at_is_the_asked_one(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """available_at is compared with the time the job was queued for, not with today's
    (which a retry or a backoff moves); an omitted available_at, producer or consumer_group
    differs from nothing."""
    api = await start_service(run_workers=False)
    due = "2999-01-02T03:04:05+03:00"
    body = VALID_TRIGGER | {"idempotency_key": "k", "available_at": due, "producer": "etl"}
    job_id = await api.trigger(**body)
    # a backoff moved the job's available_at since
    await conn.execute("UPDATE dl_jobs SET available_at = now() + interval '1 hour'")
    same_instant = "2999-01-02T00:04:05Z"
    for retry in (
        body,
        VALID_TRIGGER | {"idempotency_key": "k"},
        body | {"available_at": same_instant},
    ):
        response = await api.client.post(TRIGGER_URL, json=retry)
        assert response.status_code == 200, response.text
        assert (response.json()["job_id"], response.json()["created"]) == (job_id, False)
    assert await count_rows(conn, "dl_jobs") == 1


async def test_concurrent_identical_triggers_create_one_job(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    api = await start_service(run_workers=False)
    body = VALID_TRIGGER | {"idempotency_key": "race"}
    responses = await asyncio.gather(*(api.client.post(TRIGGER_URL, json=body) for _ in range(20)))
    assert [r.status_code for r in responses] == [200] * 20
    assert len({r.json()["job_id"] for r in responses}) == 1
    assert [r.json()["created"] for r in responses].count(True) == 1
    assert await count_rows(conn, "dl_jobs") == 1
    queued_events = await conn.fetchval("SELECT count(*) FROM dl_job_events WHERE kind = 'queued'")
    assert queued_events == 1


# --- not found, bad ids ------------------------------------------------------------------------


async def ask(api: Any, method: str, job_id: str) -> Any:
    """The answer of the job route `method` (`job`, `status` or `cancel`) for `job_id`."""
    if method == "job":
        return await api.client.get(job_url(job_id))
    if method == "status":
        return await api.client.get(status_url(job_id))
    return await api.client.post(cancel_url(job_id))


@pytest.mark.parametrize("method", ["job", "status", "cancel"])
async def test_unknown_job_is_404_with_a_json_detail(
    start_service: StartService, method: str
) -> None:
    api = await start_service(run_workers=False)
    response = await ask(api, method, str(uuid.uuid4()))
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/json"
    detail = response.json()["detail"]
    assert isinstance(detail, str)
    assert "not found" in detail


@pytest.mark.parametrize("method", ["job", "status", "cancel"])
async def test_malformed_job_id_is_422_naming_job_id(
    start_service: StartService, method: str
) -> None:
    api = await start_service(run_workers=False)
    response = await ask(api, method, "not-a-uuid")
    assert response.status_code == 422, response.text
    assert ("path", "job_id") in error_locs(response.json())


@pytest.mark.parametrize("action", ["trigger", "cancel", "retry"])
async def test_a_get_of_an_action_is_405_not_a_malformed_job_id(
    start_service: StartService, action: str
) -> None:
    api = await start_service(run_workers=False)
    response = await api.client.get(f"/api/v1/jobs/{action}")
    assert response.status_code == 405, response.text


# --- input validation --------------------------------------------------------------------------


async def assert_refused(
    response: Any, loc: tuple[str | int, ...], conn: asyncpg.Connection
) -> None:
    """A 422 naming `loc` (a prefix of some error's loc), and nothing written."""
    assert response.status_code == 422, response.text
    locs = error_locs(response.json())
    assert any(found[: len(loc)] == loc for found in locs), locs
    assert await count_rows(conn, "dl_jobs") == 0
    assert await count_rows(conn, "dl_job_events") == 0


@pytest.mark.parametrize(
    ("body", "loc"),
    [pytest.param(body, loc, id=case) for case, body, loc in INVALID_TRIGGER_BODIES],
)
async def test_invalid_trigger_body_is_422_and_stores_nothing(
    start_service: StartService,
    conn: asyncpg.Connection,
    body: Any,
    loc: tuple[str | int, ...],
) -> None:
    api = await start_service(run_workers=False)
    response = await api.client.post(TRIGGER_URL, json=body)
    await assert_refused(response, loc, conn)


@pytest.mark.parametrize(
    ("raw", "loc"),
    [pytest.param(raw, loc, id=case) for case, raw, loc in INVALID_RAW_BODIES],
)
async def test_invalid_raw_trigger_body_is_422_and_stores_nothing(
    start_service: StartService,
    conn: asyncpg.Connection,
    raw: bytes,
    loc: tuple[str | int, ...],
) -> None:
    api = await start_service(run_workers=False)
    response = await api.client.post(
        TRIGGER_URL, content=raw, headers={"content-type": "application/json"}
    )
    await assert_refused(response, loc, conn)


@pytest.mark.parametrize("raw", [pytest.param(raw, id=case) for case, raw in UNPARSABLE_RAW_BODIES])
async def test_unparsable_body_is_400_and_stores_nothing(
    start_service: StartService, conn: asyncpg.Connection, raw: bytes
) -> None:
    """Python's JSON parser gives up (not a JSONDecodeError); FastAPI answers 400, not 500."""
    api = await start_service(run_workers=False)
    response = await api.client.post(
        TRIGGER_URL, content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert await count_rows(conn, "dl_jobs") == 0
    assert await count_rows(conn, "dl_job_events") == 0


async def test_args_are_validated_against_the_registered_task_model(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    api = await start_service(run_workers=False)
    body = VALID_TRIGGER | {"task": "demo.sleep", "args": {"seconds": "soon"}}
    response = await api.client.post(TRIGGER_URL, json=body)
    await assert_refused(response, ("body", "args"), conn)
    assert "seconds" in response.text


async def test_unregistered_task_accepts_any_args(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    api = await start_service(run_workers=False)
    body = VALID_TRIGGER | {"task": "elsewhere.load", "args": {"seconds": "soon", "n": [1, 2]}}
    response = await api.client.post(TRIGGER_URL, json=body)
    assert response.status_code == 200, response.text
    stored = await conn.fetchval(
        "SELECT args FROM dl_jobs WHERE job_id = $1", uuid.UUID(response.json()["job_id"])
    )
    assert json.loads(stored) == {"seconds": "soon", "n": [1, 2]}


async def test_future_available_at_is_stored(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    api = await start_service(run_workers=False)
    due = "2999-01-02T03:04:05.123456+03:00"
    job_id = await api.trigger(task="demo.noop", available_at=due)
    body = await api.status(job_id)
    assert body["status"] == "queued"
    stored = await conn.fetchval(
        "SELECT available_at FROM dl_jobs WHERE job_id = $1", uuid.UUID(job_id)
    )
    assert stored == datetime.fromisoformat(due)
    assert datetime.fromisoformat(body["available_at"]) == datetime.fromisoformat(due)


async def test_the_longest_queue_name_fits_the_notification_that_wakes_its_workers(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """Queue names are capped at 200 characters: 800 bytes of UTF-8 at most, far below the
    8000-byte NOTIFY payload limit that the spec's trigger sends them in."""
    queue = "\U0001d52e" * limits.NAME_MAX_CHARS  # 4 bytes each in UTF-8
    heard: asyncio.Queue[str] = asyncio.Queue()
    await conn.add_listener("dl_jobs", lambda *args: heard.put_nowait(args[-1]))
    api = await start_service(run_workers=False)
    job_id = await api.trigger(task="demo.noop", queue=queue)
    assert await asyncio.wait_for(heard.get(), timeout=10) == queue
    assert (await api.status(job_id))["queue"] == queue


# --- infrastructure routes ---------------------------------------------------------------------


async def test_health_is_ok(start_service: StartService) -> None:
    api = await start_service(run_workers=False)
    response = await api.client.get(HEALTH_URL)
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_status_reports_database_counts_and_workers(start_service: StartService) -> None:
    # The served queues differ from the ones triggered into, so the counts stay put.
    service = await start_service(
        workers=[{"queue": "served.a", "concurrency": 2}, {"queue": "served.b", "concurrency": 1}]
    )
    for queue in ("q.one", "q.one", "q.two"):
        await service.trigger(queue=queue, task="demo.noop")
    canceled = await service.trigger(queue="q.two", task="demo.noop")
    await service.client.post(cancel_url(canceled))

    response = await service.client.get(STATUS_URL)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["database"] == "ok"
    assert body["status"] == "ok"
    assert body["version"] == package_version()
    counts = {"queued": 0, "running": 0, "failed": 0, "lost": 0, "paused": False}
    assert body["queues"] == {
        "q.one": counts | {"queued": 2},
        "q.two": counts | {"queued": 1},  # finished jobs are history: not counted here
        "served.a": counts,  # served by a live process
        "served.b": counts,
    }
    slots = sorted((w["queue"], w["concurrency"]) for w in body["workers"])
    assert slots == [("served.a", 2), ("served.b", 1)]


async def test_request_id_header_is_set_and_a_valid_one_is_echoed(
    start_service: StartService,
) -> None:
    api = await start_service(run_workers=False)
    generated = await api.client.get(HEALTH_URL)
    assert generated.headers.get("x-request-id")

    echoed = await api.client.get(HEALTH_URL, headers={"X-Request-ID": "req-42.a:b"})
    assert echoed.headers["x-request-id"] == "req-42.a:b"

    unsafe = await api.client.get(HEALTH_URL, headers={"X-Request-ID": "bad id\twith spaces"})
    assert unsafe.headers["x-request-id"] not in ("", "bad id\twith spaces")


async def test_request_id_is_present_on_errors(start_service: StartService) -> None:
    api = await start_service(run_workers=False)
    response = await api.client.get(status_url(str(uuid.uuid4())), headers={"X-Request-ID": "r1"})
    assert response.status_code == 404
    assert response.headers["x-request-id"] == "r1"


@pytest.mark.parametrize("access_log", [False, True], ids=["summary", "every-request"])
async def test_answered_requests_are_counted_per_route_and_refused_ones_logged(
    start_service: StartService, caplog: pytest.LogCaptureFixture, access_log: bool
) -> None:
    """A request answered below 400 is a DEBUG line (an INFO one with DL_ACCESS_LOG) and is
    counted in the periodic summary by its route; a refused one is always an INFO line."""
    api = await start_service(run_workers=False, access_log=access_log)
    with caplog.at_level(logging.INFO, logger="dataloader.access"):
        for _ in range(2):
            job_id = await api.trigger(task="demo.noop")
        assert (await api.client.get(status_url(job_id))).status_code == 200
        assert (await api.client.get(status_url(str(uuid.uuid4())))).status_code == 404
        lines = [r.getMessage() for r in caplog.records]
        caplog.clear()
        api.app.state.request_summary.flush()
    refused = "GET /api/v1/jobs/"
    if access_log:
        assert len(lines) == 4
    else:
        (line,) = lines
        assert line.startswith(refused)
        assert line.endswith(" 404")
    assert sorted(r.getMessage() for r in caplog.records) == [
        "GET /api/v1/jobs/{job_id}/status: 200 ×1, 404 ×1 in the last 60s",
        "POST /api/v1/jobs/trigger: 200 ×2 in the last 60s",
    ]
