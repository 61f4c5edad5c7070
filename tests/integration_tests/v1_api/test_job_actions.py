"""`GET /api/v1/jobs/{id}/events` (a job's journal, read on from the last entry seen) and
`POST /api/v1/jobs/{id}/retry` (a failed, lost or canceled job back to the queue)."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from ..conftest import StartService
from .test_security import READ, TOKENS, TRIGGER, bearer


async def test_the_journal_is_read_on_from_the_last_event_seen(
    start_service: StartService,
) -> None:
    service = await start_service(run_workers=False)
    job_id = await service.trigger(task="t", lock_key="k")
    await service.client.post(f"/api/v1/jobs/{job_id}/cancel")
    whole = (await service.client.get(f"/api/v1/jobs/{job_id}/events")).json()["events"]
    assert [e["kind"] for e in whole] == ["queued", "canceled"]
    assert whole[0]["event_id"] < whole[1]["event_id"]
    after_first = await service.client.get(
        f"/api/v1/jobs/{job_id}/events", params={"after": whole[0]["event_id"]}
    )
    assert after_first.json()["events"] == whole[1:]
    first_only = await service.client.get(f"/api/v1/jobs/{job_id}/events", params={"limit": 1})
    assert first_only.json()["events"] == whole[:1]
    after_last = await service.client.get(
        f"/api/v1/jobs/{job_id}/events", params={"after": whole[-1]["event_id"]}
    )
    assert after_last.json() == {"events": []}


@pytest.mark.parametrize(
    "params", [{"after": -1}, {"after": "x"}, {"limit": 0}, {"limit": 1001}, {"after": 2**63}]
)
async def test_bad_journal_parameters_are_a_422(
    start_service: StartService, params: dict[str, object]
) -> None:
    service = await start_service(run_workers=False)
    job_id = await service.trigger(task="t", lock_key="k")
    response = await service.client.get(f"/api/v1/jobs/{job_id}/events", params=params)
    assert response.status_code == 422, response.text


async def test_the_journal_of_no_job_is_a_404(start_service: StartService) -> None:
    service = await start_service(run_workers=False)
    response = await service.client.get(f"/api/v1/jobs/{uuid.uuid4()}/events")
    assert response.status_code == 404


async def test_a_canceled_job_is_retried_and_a_queued_one_is_a_409(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False)
    job_id = await service.trigger(task="t", lock_key="k")
    refused = await service.client.post(f"/api/v1/jobs/{job_id}/retry")
    assert refused.status_code == 409
    assert "queued" in refused.json()["detail"]
    await service.client.post(f"/api/v1/jobs/{job_id}/cancel")
    retried = await service.client.post(f"/api/v1/jobs/{job_id}/retry")
    assert retried.status_code == 200, retried.text
    assert retried.json()["status"] == "queued"
    kinds = await conn.fetch(
        "SELECT kind FROM dl_job_events WHERE job_id = $1 ORDER BY event_id", uuid.UUID(job_id)
    )
    assert [r["kind"] for r in kinds] == ["queued", "canceled", "retried"]
    missing = await service.client.post(f"/api/v1/jobs/{uuid.uuid4()}/retry")
    assert missing.status_code == 404


async def test_a_retry_needs_the_trigger_scope(start_service: StartService) -> None:
    service = await start_service(run_workers=False, api_tokens=TOKENS)
    body = {"queue": "default", "task": "t", "lock_key": "k"}
    triggered = await service.client.post(
        "/api/v1/jobs/trigger", json=body, headers=bearer(TRIGGER)
    )
    url = f"/api/v1/jobs/{triggered.json()['job_id']}/retry"
    assert (await service.client.post(url, headers=bearer(READ))).status_code == 403
    assert (await service.client.post(url, headers=bearer(TRIGGER))).status_code == 409
