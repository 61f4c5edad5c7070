"""`GET /api/v1/jobs/{id}/events` (a job's journal, read on from the last entry seen) and
`POST /api/v1/jobs/{id}/retry` (a failed, lost or canceled job back to the queue)."""

from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg
import pytest

from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext

from ..conftest import StartService
from ..helpers import wait_until
from .test_security import ADMIN, READ, TOKENS, TRIGGER, bearer


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


# --- cancel and retry by filter ------------------------------------------------------------


async def test_jobs_matching_a_filter_are_canceled_and_retried_in_bulk(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False)
    etl = [await service.trigger(queue="etl", task="t", lock_key=f"k{i}") for i in range(5)]
    other = await service.trigger(queue="other", task="t", lock_key="o")
    body = {"queue": "etl", "status": "queued", "limit": 3}
    first = (await service.client.post("/api/v1/jobs/cancel", json=body)).json()
    assert (first["matched"], len(first["changed"]), first["more"]) == (3, 3, True)
    second = (await service.client.post("/api/v1/jobs/cancel", json=body)).json()
    assert (second["matched"], len(second["changed"]), second["more"]) == (2, 2, False)
    assert sorted(first["changed"] + second["changed"]) == sorted(etl)
    statuses = await conn.fetch("SELECT queue, status::text AS s FROM dl_jobs")
    assert sorted((r["queue"], r["s"]) for r in statuses) == [
        *[("etl", "canceled")] * 5,
        ("other", "queued"),
    ]
    assert other not in first["changed"] + second["changed"]

    retried = await service.client.post("/api/v1/jobs/retry", json={"queue": "etl"})
    assert len(retried.json()["changed"]) == 5
    again = (await service.client.post("/api/v1/jobs/retry", json={"queue": "etl"})).json()
    assert (again["matched"], again["changed"]) == (5, [])  # queued now: skipped
    by = await conn.fetch(
        "SELECT payload->>'by' AS by FROM dl_job_events WHERE kind IN ('canceled', 'retried')"
    )
    assert {r["by"] for r in by} == {"api"}


async def test_jobs_whose_args_contain_an_object_are_canceled_in_bulk(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False)
    day1 = [await service.trigger(task="t", args={"day": "d1", "i": i}) for i in range(3)]
    await service.trigger(task="t", args={"day": "d2"})
    body = {"args": {"day": "d1"}}
    done = (await service.client.post("/api/v1/jobs/cancel", json=body)).json()
    assert (done["matched"], sorted(done["changed"]), done["more"]) == (3, sorted(day1), False)
    left = await conn.fetch("SELECT args->>'day' AS day FROM dl_jobs WHERE status = 'queued'")
    assert [r["day"] for r in left] == ["d2"]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"limit": 10},
        {"queue": "etl", "limit": 0},
        {"queue": "etl", "limit": 10_001},
        {"status": "sleeping"},
        {"queue": "etl", "colour": "red"},
        {"finished_until": "0001-01-01T00:00:00Z"},
        {"queue": "etl", "created_from": "9999-06-01T00:00:00Z"},
        {"args": {}},
        {"args": '{"day": "d1"}'},  # an object, not its text, in a body
        {"args": [1]},
    ],
)
async def test_a_bulk_change_needs_a_filter_and_sane_bounds(
    start_service: StartService, conn: asyncpg.Connection, body: dict[str, object]
) -> None:
    service = await start_service(run_workers=False)
    await service.trigger(queue="etl", task="t", lock_key="k")
    for action in ("cancel", "retry"):
        response = await service.client.post(f"/api/v1/jobs/{action}", json=body)
        assert response.status_code == 422, (action, response.text)
    assert await conn.fetchval("SELECT count(*) FROM dl_jobs WHERE status = 'queued'") == 1


async def test_bulk_changes_need_the_admin_scope(start_service: StartService) -> None:
    service = await start_service(run_workers=False, api_tokens=json.dumps(TOKENS))
    body = {"queue": "etl"}
    denied = await service.client.post("/api/v1/jobs/cancel", json=body, headers=bearer(TRIGGER))
    assert denied.status_code == 403
    allowed = await service.client.post("/api/v1/jobs/cancel", json=body, headers=bearer(ADMIN))
    assert allowed.json() == {"matched": 0, "changed": [], "more": False}


async def test_the_library_changes_in_bulk_too(start_service: StartService) -> None:
    service = await start_service(run_workers=False)
    jobs = [await service.dl.enqueue("t", queue="lib", lock_key=f"k{i}") for i in range(3)]
    done = await service.dl.cancel_many(queue="lib", limit=10)
    assert sorted(done.changed) == sorted(j.job_id for j in jobs)
    with pytest.raises(ValueError, match="at least one filter"):
        await service.dl.retry_many()
    with pytest.raises(ValueError, match="unknown filter: colour"):
        await service.dl.retry_many(colour="red")
    with pytest.raises(ValueError, match="limit"):
        await service.dl.cancel_many(queue="lib", limit=0)


# --- the stream of a job ---------------------------------------------------------------------


def server_sent_events(text: str) -> list[dict[str, str]]:
    """The events of an SSE body (comments dropped), each as {field: value}."""
    events = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":")
        )
        if fields:
            events.append(fields)
    return events


async def test_a_job_is_streamed_until_it_ends(
    start_service: StartService, registry: TaskRegistry
) -> None:
    gate = asyncio.Event()

    @registry.task("t.streamed")
    async def streamed(ctx: JobContext[dict[str, object]]) -> None:
        await ctx.set_progress(done=1, total=2)
        await gate.wait()

    service = await start_service(workers=[{"queue": "default", "concurrency": 1}])
    job_id = await service.trigger(task="t.streamed", lock_key="k")
    url = f"/api/v1/jobs/{job_id}/stream"
    streaming = asyncio.create_task(service.client.get(url, timeout=60))

    async def progressing() -> bool:
        state = await service.dl.get(job_id)
        return state is not None and state.progress == {"done": 1, "total": 2}

    await wait_until(progressing, what="the job's progress written")
    gate.set()
    response = await streaming
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = server_sent_events(response.text)
    kinds = [e["event"] for e in events]
    assert kinds[-1] == "end"
    assert "progress" in kinds
    journal = [json.loads(e["data"]) for e in events if e["event"] == "journal"]
    assert [j["kind"] for j in journal][:2] == ["queued", "picked"]
    assert journal[-1]["kind"] == "done"
    assert [int(e["id"]) for e in events if e["event"] == "journal"] == [
        j["event_id"] for j in journal
    ]
    progress = [json.loads(e["data"]) for e in events if e["event"] == "progress"]
    assert {"done": 1, "total": 2} in [p["progress"] for p in progress]
    assert json.loads(events[-1]["data"])["status"] == "succeeded"

    # a reconnecting client names the last entry it saw: the stream goes on from there
    resumed = await service.client.get(url, headers={"Last-Event-ID": str(journal[0]["event_id"])})
    again = [
        json.loads(e["data"]) for e in server_sent_events(resumed.text) if e["event"] == "journal"
    ]
    assert again == journal[1:]


async def test_a_stream_of_no_job_is_a_404_and_bad_positions_a_422(
    start_service: StartService,
) -> None:
    service = await start_service(run_workers=False)
    missing = await service.client.get(f"/api/v1/jobs/{uuid.uuid4()}/stream")
    assert missing.status_code == 404
    job_id = await service.trigger(task="t", lock_key="k")
    bad = await service.client.get(f"/api/v1/jobs/{job_id}/stream", headers={"Last-Event-ID": "x"})
    assert bad.status_code == 422
    await service.client.post(f"/api/v1/jobs/{job_id}/cancel")
    ended = server_sent_events((await service.client.get(f"/api/v1/jobs/{job_id}/stream")).text)
    assert [e["event"] for e in ended] == ["journal", "journal", "progress", "end"]
    assert json.loads(ended[-1]["data"])["status"] == "canceled"
