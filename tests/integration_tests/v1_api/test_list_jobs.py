"""`GET /api/v1/jobs`: jobs newest first, every filter, keyset pages that jobs enqueued
meanwhile never shift, and a clear 422 for every bad parameter."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from ..conftest import Service, StartService
from .test_security import READ, TOKENS, bearer

JOBS_URL = "/api/v1/jobs"


async def ids(service: Service, **params: Any) -> list[str]:
    """The job ids of one page (the whole list: no next page)."""
    response = await service.client.get(JOBS_URL, params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["next_cursor"] is None
    return [job["job_id"] for job in body["jobs"]]


async def test_each_filter_applies(start_service: StartService, conn: asyncpg.Connection) -> None:
    service = await start_service(run_workers=False)
    a = await service.trigger(
        queue="qa", task="t.a", lock_key="ka", partition_key="p1", args={"day": "d1", "n": [1]}
    )
    b = await service.trigger(queue="qb", task="t.b", lock_key="kb", args={"day": "d2"})
    c = await service.trigger(
        queue="qb", task="t.a", lock_key="ka", partition_key="p1", args={"day": "d1", "n": [2]}
    )
    await service.client.post(f"{JOBS_URL}/{b}/cancel")
    rows = await conn.fetch("SELECT job_id::text, created_at, finished_at FROM dl_jobs")
    created = {r["job_id"]: r["created_at"] for r in rows}
    finished_b = next(r["finished_at"] for r in rows if r["job_id"] == b)

    def at(instant: datetime) -> str:
        return instant.isoformat()

    assert await ids(service) == [c, b, a]
    assert await ids(service, queue="qb") == [c, b]
    assert await ids(service, status="canceled") == [b]
    assert await ids(service, status="queued", queue="qb") == [c]
    assert await ids(service, task="t.a") == [c, a]
    assert await ids(service, lock_key="ka") == [c, a]
    assert await ids(service, partition_key="p1", queue="qa") == [a]
    assert await ids(service, partition_key="p1") == [c, a]
    assert await ids(service, partition_key="") == [b]  # the jobs without one
    assert await ids(service, created_from=at(created[b])) == [c, b]
    assert await ids(service, created_until=at(created[b])) == [a]
    assert await ids(service, finished_from=at(finished_b)) == [b]
    assert await ids(service, finished_until=at(finished_b + timedelta(seconds=1))) == [b]
    assert await ids(service, args='{"day": "d1"}') == [c, a]
    assert await ids(service, args='{"day": "d1", "n": [1]}') == [a]
    assert await ids(service, args='{"day": "d1"}', queue="qb") == [c]
    assert await ids(service, queue="nowhere") == []
    listed = (await service.client.get(JOBS_URL, params={"lock_key": "kb"})).json()["jobs"][0]
    status = (await service.client.get(f"{JOBS_URL}/{b}/status")).json()
    assert listed == status  # a listed job reads as its status does


async def test_a_finished_range_lists_long_jobs_created_before_it(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """The range bounds when jobs finished, whenever they were created."""
    service = await start_service(run_workers=False)
    rows = await conn.fetch(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, created_at, finished_at)"
        " VALUES (gen_random_uuid(), 'q', 't', 'long', 'succeeded', now() - interval '10 days',"
        "         now() - interval '1 day'),"
        "        (gen_random_uuid(), 'q', 't', 'before', 'succeeded', now() - interval '3 days',"
        "         now() - interval '3 days'),"
        "        (gen_random_uuid(), 'q', 't', 'after', 'succeeded', now() - interval '1 hour',"
        "         now() - interval '1 hour')"
        " RETURNING job_id::text, lock_key, now() AS now"
    )
    long_job = next(r["job_id"] for r in rows if r["lock_key"] == "long")
    now = rows[0]["now"]
    window = {
        "finished_from": (now - timedelta(days=2)).isoformat(),
        "finished_until": (now - timedelta(hours=12)).isoformat(),
    }
    assert await ids(service, **window) == [long_job]
    assert await ids(service, finished_until=window["finished_until"], lock_key="long") == [
        long_job
    ]


async def test_pages_are_stable_under_inserts(start_service: StartService) -> None:
    service = await start_service(run_workers=False)
    first = [await service.trigger(task="t", lock_key=f"old{i}") for i in range(5)]
    page = (await service.client.get(JOBS_URL, params={"limit": 2})).json()
    seen = [job["job_id"] for job in page["jobs"]]
    for i in range(3):  # newer jobs arrive while the pages are read
        await service.trigger(task="t", lock_key=f"new{i}")
    while page["next_cursor"] is not None:
        params = {"limit": 2, "cursor": page["next_cursor"]}
        page = (await service.client.get(JOBS_URL, params=params)).json()
        seen += [job["job_id"] for job in page["jobs"]]
    assert seen == first[::-1]


async def test_a_made_up_cursor_is_a_position_not_an_error(start_service: StartService) -> None:
    """Any 32 characters of the cursor's alphabet name a place in the list."""
    service = await start_service(run_workers=False)
    await service.trigger(task="t", lock_key="k")
    for cursor in ("A" * 32, "_" * 32, "-" * 32):
        response = await service.client.get(JOBS_URL, params={"cursor": cursor})
        assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("params", "where"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"status": "done"}, "status"),
        ({"created_from": "2026-01-01T00:00:00"}, "created_from"),
        ({"finished_until": "1700000000"}, "finished_until"),
        ({"created_until": "9999-12-31T23:59:59.999999Z"}, "created_until"),
        ({"finished_from": "0001-06-01T00:00:00Z"}, "finished_from"),
        ({"cursor": "2026-01-01T00:00:00+00:00~not-a-uuid"}, "cursor"),
        ({"queue": ""}, "queue"),
        ({"lock_key": "k\x00"}, "lock_key"),
        ({"color": "red"}, "color"),
        ({"args": "{}"}, "args"),
        ({"args": "[1]"}, "args"),
        ({"args": "day=1"}, "args"),
        ({"args": '{"x": "' + "y" * 8000 + '"}'}, "args"),
    ],
)
async def test_a_bad_parameter_is_a_422_naming_it(
    start_service: StartService, params: dict[str, Any], where: str
) -> None:
    service = await start_service(run_workers=False)
    response = await service.client.get(JOBS_URL, params=params)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["query", where]


async def test_listing_needs_the_read_scope(start_service: StartService) -> None:
    service = await start_service(run_workers=False, api_tokens=TOKENS)
    assert (await service.client.get(JOBS_URL)).status_code == 401
    assert (await service.client.get(JOBS_URL, headers=bearer(READ))).status_code == 200
