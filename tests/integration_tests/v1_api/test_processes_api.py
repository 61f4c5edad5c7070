"""Durable processes over HTTP v1: start, call, repair, remove, get, events, list, a task's
response after a 504; refusals (404, 409, 422) and scopes."""

from __future__ import annotations

import asyncio
import time
import uuid
from urllib.parse import quote

import pytest

from dataloader import InvalidJob
from tests.orders import registry as orders

from ..conftest import Service, StartService
from .test_security import ADMIN, READ, TOKENS, TRIGGER, bearer

BASE = "/api/v1/processes"


@pytest.fixture
async def service(start_service: StartService) -> Service:
    return await start_service(
        tasks=orders.copy(), workers=[{"queue": "orders", "concurrency": 2}], api_tokens=TOKENS
    )


async def test_a_process_is_started_called_read_and_removed_over_http(service: Service) -> None:
    http, admin, trigger = service.client, bearer(ADMIN), bearer(TRIGGER)
    started = await http.post(f"{BASE}/orders/o-1", json={"args": {"total": 10}}, headers=trigger)
    assert started.status_code == 200, started.text
    body = started.json()
    assert body["response"] == {"state": "awaiting_payment"}
    assert body["process"]["status"] == "running"
    assert body["process"]["timer"]["kind"] == "timeout"
    paid = await http.post(f"{BASE}/orders/o-1/call", json={"args": {"pay": 10}}, headers=trigger)
    assert paid.status_code == 200, paid.text
    assert paid.json()["response"] == {"state": "paid"}
    task = await http.get(f"/api/v1/jobs/{paid.json()['task_id']}", headers=bearer(READ))
    assert task.json()["result"] == {"state": "paid"}  # the response is the task's result
    got = await http.get(f"{BASE}/orders/o-1", headers=bearer(READ))
    assert got.json()["aux_state"]["state"] == "paid"
    events = await http.get(f"{BASE}/orders/o-1/events", params={"after": 1}, headers=admin)
    assert [e["event_id"] for e in events.json()["events"]] == [2]
    listed = await http.get(BASE, params={"namespace": "orders"}, headers=bearer(READ))
    assert [p["process_id"] for p in listed.json()["processes"]] == ["o-1"]
    removed = await http.delete(f"{BASE}/orders/o-1", headers=admin)
    assert removed.status_code == 200, removed.text
    gone = await http.get(f"{BASE}/orders/o-1", headers=admin)
    assert gone.status_code == 404


#: Ids that spell another route's path unless each is one percent-encoded segment.
AWKWARD_IDS = [
    "report/call",
    "events",
    "call",
    "repair",
    "a/events",
    "2026/11/",
    "50% off?#x",
    "é/",
]


@pytest.mark.parametrize("process_id", AWKWARD_IDS)
async def test_every_route_serves_any_id_as_one_encoded_segment(
    service: Service, process_id: str
) -> None:
    http, admin, trigger, read = service.client, bearer(ADMIN), bearer(TRIGGER), bearer(READ)
    path = f"{BASE}/orders/{quote(process_id, safe='')}"
    started = await http.post(path, json={"args": {"total": 1}}, headers=trigger)
    assert started.status_code == 200, started.text
    assert started.json()["process"]["process_id"] == process_id
    called = await http.post(f"{path}/call", json={"args": {"boom": "x"}}, headers=trigger)
    assert (called.status_code, called.json()["reason"]) == (409, "task_failed")
    repaired = await http.post(f"{path}/repair", json={}, headers=admin)
    assert repaired.json()["response"] == {"repaired": True}, repaired.text
    got = await http.get(path, headers=read)
    assert (got.status_code, got.json()["process_id"]) == (200, process_id)
    events = await http.get(f"{path}/events", headers=read)
    assert [e["payload"] for e in events.json()["events"]][-1] == {"repaired": True}
    removed = await http.delete(path, headers=admin)
    assert removed.status_code == 200, removed.text
    assert (await http.get(path, headers=read)).status_code == 404


async def test_an_id_that_is_a_routes_word_is_not_a_sub_resource(service: Service) -> None:
    http, trigger, read = service.client, bearer(TRIGGER), bearer(READ)
    for process_id in ("call", "events"):
        await http.post(f"{BASE}/orders/{process_id}", json={"args": {"total": 1}}, headers=trigger)
    got = await http.get(f"{BASE}/orders/events", headers=read)
    assert got.json()["process_id"] == "events"
    events = await http.get(f"{BASE}/orders/events/events", headers=read)
    assert [e["payload"] for e in events.json()["events"]] == [{"created": {"total": 1}}]
    called = await http.post(f"{BASE}/orders/call/call", json={"args": {}}, headers=trigger)
    assert called.json()["response"] == {"echo": {}, "seen": 1}
    # an unencoded slash is a segment of its own: no route has that many
    assert (await http.get(f"{BASE}/orders/report/call/x", headers=read)).status_code == 404


@pytest.mark.parametrize("process_id", [".", ".."])
async def test_an_id_a_url_cannot_carry_is_refused_at_start(
    service: Service, process_id: str
) -> None:
    with pytest.raises(InvalidJob, match="cannot be a segment of a URL's path"):
        await service.dl.processes.start("orders", process_id, {"total": 1})


async def test_refusals_are_404_and_409_with_their_reason(service: Service) -> None:
    http, admin, trigger = service.client, bearer(ADMIN), bearer(TRIGGER)
    missing = await http.post(f"{BASE}/orders/nope/call", json={}, headers=trigger)
    assert missing.status_code == 404
    await http.post(f"{BASE}/orders/o-1", json={"args": {"total": 10}}, headers=trigger)
    other = await http.post(f"{BASE}/orders/o-1", json={"args": {"total": 11}}, headers=trigger)
    assert (other.status_code, other.json()["reason"]) == (409, "started_with_other_args")
    failed = await http.post(
        f"{BASE}/orders/o-1/call", json={"args": {"boom": "x"}}, headers=trigger
    )
    assert (failed.status_code, failed.json()["reason"]) == (409, "task_failed")
    assert uuid.UUID(failed.json()["task_id"])
    in_error = await http.post(f"{BASE}/orders/o-1/call", json={"args": {}}, headers=trigger)
    assert (in_error.status_code, in_error.json()["reason"]) == (409, "in_error")
    repaired = await http.post(f"{BASE}/orders/o-1/repair", json={}, headers=admin)
    assert repaired.json()["response"] == {"repaired": True}
    again = await http.post(f"{BASE}/orders/o-1/repair", json={}, headers=admin)
    assert (again.status_code, again.json()["reason"]) == (409, "not_in_error")


async def test_a_repeated_keyed_call_gets_its_answer_after_the_process_failed(
    service: Service,
) -> None:
    http, trigger = service.client, bearer(TRIGGER)
    await http.post(f"{BASE}/orders/o-1", json={"args": {"total": 10}}, headers=trigger)
    call = {"args": {"x": 1}, "idempotency_key": "pay-1"}
    paid = await http.post(f"{BASE}/orders/o-1/call", json=call, headers=trigger)
    assert paid.status_code == 200, paid.text
    failed = await http.post(
        f"{BASE}/orders/o-1/call", json={"args": {"boom": "x"}}, headers=trigger
    )
    assert (failed.status_code, failed.json()["reason"]) == (409, "task_failed")
    again = await http.post(f"{BASE}/orders/o-1/call", json=call, headers=trigger)
    assert (again.status_code, again.json()) == (200, paid.json())


async def test_repairs_sent_together_repair_once_and_the_others_are_409(
    service: Service,
) -> None:
    http, admin, trigger = service.client, bearer(ADMIN), bearer(TRIGGER)
    await http.post(f"{BASE}/orders/o-1", json={"args": {"total": 10}}, headers=trigger)
    await http.post(f"{BASE}/orders/o-1/call", json={"args": {"boom": "x"}}, headers=trigger)
    answers = await asyncio.gather(
        *(http.post(f"{BASE}/orders/o-1/repair", json={}, headers=admin) for _ in range(3))
    )
    assert sorted(a.status_code for a in answers) == [200, 409, 409], [a.text for a in answers]
    assert {a.json()["reason"] for a in answers if a.status_code == 409} == {"not_in_error"}
    events = await http.get(f"{BASE}/orders/o-1/events", headers=admin)
    payloads = [e["payload"] for e in events.json()["events"]]
    assert payloads.count({"repaired": True}) == 1


async def test_a_response_not_given_in_time_is_a_504_with_the_task_to_read_later(
    start_service: StartService,
) -> None:
    # no worker serves the queue: the init waits
    service = await start_service(run_workers=False, tasks=orders.copy())
    late = await service.client.post(
        f"{BASE}/orders/o-1", json={"args": {"total": 1}, "timeout_sec": 0.1}
    )
    assert late.status_code == 504, late.text
    task_id = late.json()["task_id"]
    still = await service.client.get(
        f"/api/v1/process-tasks/{task_id}", params={"timeout_sec": 0.1}
    )
    assert still.status_code == 504
    assert still.json()["task_id"] == task_id


async def test_a_request_may_ask_for_a_wait_the_setting_allows_beyond_a_minute(
    start_service: StartService,
) -> None:
    """DL_PROCESS_WAIT_MAX_SEC may be raised to 3,600 s, and the routes honour it."""
    service = await start_service(
        tasks=orders.copy(),
        workers=[{"queue": "orders", "concurrency": 2}],
        process_wait_max_sec=600,
    )
    path = f"{BASE}/orders/o-1"
    started = await service.client.post(path, json={"args": {"total": 1}, "timeout_sec": 600})
    assert started.status_code == 200, started.text
    called = await service.client.post(f"{path}/call", json={"args": {}, "timeout_sec": 120})
    assert called.status_code == 200, called.text
    task_id = called.json()["task_id"]
    read = await service.client.get(f"/api/v1/process-tasks/{task_id}", params={"timeout_sec": 90})
    assert read.status_code == 200, read.text
    removed = await service.client.delete(path, params={"timeout_sec": 3600})
    assert removed.status_code == 200, removed.text


async def test_a_request_that_asks_for_more_than_the_setting_waits_the_setting(
    start_service: StartService,
) -> None:
    service = await start_service(run_workers=False, tasks=orders.copy(), process_wait_max_sec=0.2)
    started = time.monotonic()
    late = await service.client.post(
        f"{BASE}/orders/o-1", json={"args": {"total": 1}, "timeout_sec": 3600}
    )
    assert late.status_code == 504, late.text
    assert time.monotonic() - started < 30  # the setting's 0.2 s (generously), not an hour


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (f"{BASE}/orders/o-1", {"timeout_sec": 3601}),
        (f"{BASE}/orders/o-1", {"timeout_sec": 0}),
        (f"{BASE}/orders/o-1", {"args": {"x": "\u0000"}}),
        (f"{BASE}/orders/o-1", {"metadata": [1]}),
        (f"{BASE}/orders/o-1", {"unknown": 1}),
        (f"{BASE}/orders/{'x' * 401}", {}),
        (f"{BASE}/orders/o-1/call", {"idempotency_key": ""}),
    ],
)
async def test_bad_input_is_a_422_and_writes_nothing(
    service: Service, path: str, body: dict[str, object]
) -> None:
    response = await service.client.post(path, json=body, headers=bearer(TRIGGER))
    assert response.status_code == 422, response.text
    listed = await service.client.get(BASE, headers=bearer(READ))
    assert listed.json()["processes"] == []


async def test_scopes_are_the_jobs_ones(service: Service) -> None:
    http = service.client
    read_start = await http.post(
        f"{BASE}/orders/o-1", json={"args": {"total": 1}}, headers=bearer(READ)
    )
    assert read_start.status_code == 403
    await http.post(f"{BASE}/orders/o-1", json={"args": {"total": 1}}, headers=bearer(TRIGGER))
    trigger_remove = await http.delete(f"{BASE}/orders/o-1", headers=bearer(TRIGGER))
    assert trigger_remove.status_code == 403
    trigger_repair = await http.post(f"{BASE}/orders/o-1/repair", json={}, headers=bearer(TRIGGER))
    assert trigger_repair.status_code == 403
    anonymous = await http.get(f"{BASE}/orders/o-1")
    assert anonymous.status_code == 401


async def test_a_start_on_a_queue_whose_live_processes_lack_the_namespace_is_a_422(
    start_service: StartService,
) -> None:
    service = await start_service(
        workers=[{"queue": "elsewhere", "concurrency": 1}], allow_unknown_tasks=False
    )
    response = await service.client.post(f"{BASE}/ghosts/g-1", json={"queue": "elsewhere"})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["type"] == "unknown_task"
