"""The dashboard over HTTP (in-process): what each page shows for a given database state, and
what a viewer may do; the browser's view is in test_dashboard_browser.py."""

from __future__ import annotations

import html
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg
import httpx
import pytest

import dataloader
from dataloader import ProcessStatus, ProcessTaskFailed
from dataloader.config import CronSpec
from dataloader.core.retry import Linear
from dataloader.dashboard.jobs import job_list_of, job_view_of
from dataloader.dashboard.overview import overview_of
from dataloader.dashboard.queues import queue_view_of
from dataloader.dashboard.system import schedules_of
from dataloader.maintenance.cron import CronScheduler
from dataloader.storage.connections import GuardedPool
from dataloader.storage.maintenance import MaintenanceStore
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext
from tests.orders import registry as orders

from .conftest import Service, StartService
from .test_howtos import BLOCK, HOWTO

READ = "read-token-0123456789abcdef"
TRIGGER = "trigger-token-0123456789abcdef"
ADMIN = "admin-token-0123456789abcdef"
TOKENS = [
    {"name": "viewer", "scope": "read", "token": READ},
    {"name": "etl", "scope": "trigger", "token": TRIGGER},
]
ADMIN_TOKEN = {"name": "ops", "scope": "admin", "token": ADMIN}
IDLE = "ui.idle"


async def signed_in(service: Service, token: str | None = None) -> httpx.AsyncClient:
    """A browser-like client of the service's dashboard, signed in with `token` (none: the
    service has no tokens; the first page gives it a session)."""
    client = httpx.AsyncClient(
        transport=service.client._transport, base_url="http://dataloader.test"
    )
    if token is None:
        assert (await client.get("/ui", follow_redirects=True)).status_code == 200
    else:
        answer = await client.post("/ui/signin", data={"token": token, "next": "/ui"})
        assert answer.status_code == 303, answer.text
    return client


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found is not None, page
    return found.group(1)


async def test_the_pages_data_for_a_given_state(start_service: StartService) -> None:
    service = await start_service(run_workers=False)
    first = await service.trigger(queue=IDLE, task="ui.a", args={"day": "2026-01-01"})
    await service.trigger(queue=IDLE, task="ui.b")
    await service.trigger(queue="ui.other", task="ui.a")
    client = service.dl

    overview = await overview_of(client)
    assert overview.queues == ["ui.idle", "ui.other"]
    assert overview.status.queues[IDLE].ready == 2

    listed = await job_list_of(client, {"queue": IDLE, "task": "ui.a", "status": ""}, None)
    assert [str(j.job_id) for j in listed.page.jobs] == [first]
    assert listed.filters == {"queue": IDLE, "task": "ui.a"}
    wrong = await job_list_of(client, {"status": "bogus"}, None)
    assert wrong.page.jobs == []
    assert wrong.error is not None
    assert "bogus" in wrong.error
    by_args = await job_list_of(client, {"args": '{"day": "2026-01-01"}'}, None)
    assert [str(j.job_id) for j in by_args.page.jobs] == [first]
    not_json = await job_list_of(client, {"args": "day=2026-01-01"}, None)
    assert not_json.error is not None
    assert "args: not valid JSON" in not_json.error
    later = await job_list_of(client, {"created_from": "2999-01-01T00:00"}, None)
    assert later.page.jobs == []
    assert later.error is None
    since = await job_list_of(client, {"created_from": "2000-01-01T00:00", "task": "ui.b"}, None)
    assert len(since.page.jobs) == 1
    not_time = await job_list_of(client, {"created_until": "yesterday"}, None)
    assert not_time.error == "created_until: not a date and time like 2026-01-31T09:30"

    view = await job_view_of(client, uuid.UUID(first))
    assert view is not None
    assert view.args == {"day": "2026-01-01"}
    assert [e.kind for e in view.events] == ["queued"]
    assert view.cancellable
    assert not view.retryable
    assert await job_view_of(client, uuid.uuid4()) is None


async def test_every_page_answers_and_a_missing_job_is_a_404(start_service: StartService) -> None:
    service = await start_service(run_workers=False)
    job_id = await service.trigger(queue=IDLE, task="ui.a", idempotency_key="day-1")
    browser = await signed_in(service)
    for path in ("/ui", "/ui/jobs", f"/ui/jobs/{job_id}", "/ui/jobs?status=bogus"):
        answer = await browser.get(path)
        assert answer.status_code == 200, path
        assert answer.headers["content-type"].startswith("text/html")
    missing_id = uuid.uuid4()
    for path, status, words in [
        (f"/ui/jobs/{missing_id}", 404, f"no job {missing_id}"),
        ("/ui/jobs/not-a-uuid", 404, "no job not-a-uuid"),
        ("/ui/nowhere", 404, "Not Found"),
        ("/ui/jobs-bulk/cancel", 400, "filter the jobs first"),
    ]:
        answer = await browser.get(path)
        assert answer.status_code == status, path
        assert answer.headers["content-type"].startswith("text/html"), path
        assert words in answer.text, path
        assert 'href="/ui/jobs"' in answer.text  # a page to go on from
    refused = await browser.post(f"/ui/jobs/{missing_id}/cancel", data={"csrf_token": "forged"})
    assert refused.status_code == 403
    assert refused.headers["content-type"].startswith("text/html")
    invalid = await browser.post("/ui/jobs/not-a-uuid/cancel", data={})
    assert (invalid.status_code, invalid.headers["content-type"][:9]) == (400, "text/html")
    # the API answers in JSON as before
    api = await service.client.get(f"/api/v1/jobs/{missing_id}/status")
    assert (api.status_code, api.headers["content-type"]) == (404, "application/json")
    api = await service.client.get("/api/v1/jobs", params={"limit": 0})
    assert (api.status_code, api.headers["content-type"]) == (422, "application/json")
    assert (await service.client.get("/nowhere")).json() == {"detail": "Not Found"}
    found = await browser.get("/ui/jobs/find", params={"q": "day-1"})
    assert found.headers["location"] == f"/ui/jobs/{job_id}"
    found = await browser.get("/ui/jobs/find", params={"q": job_id})
    assert found.headers["location"] == f"/ui/jobs/{job_id}"
    missing = await browser.get("/ui/jobs/find", params={"q": "nothing"})
    assert missing.headers["location"] == "/ui/jobs?missing=1"
    assert (await browser.get("/ui/static/htmx.min.js")).status_code == 200


async def test_a_secret_in_args_is_masked_and_markup_escaped(start_service: StartService) -> None:
    service = await start_service(run_workers=False)
    job_id = await service.trigger(
        queue=IDLE, task="ui.a", args={"password": "hunter2-secret", "html": "<b>bold</b>"}
    )
    page = (await (await signed_in(service)).get(f"/ui/jobs/{job_id}")).text
    assert "hunter2-secret" not in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    assert "<b>bold</b>" not in page


async def test_an_action_needs_its_sessions_csrf_token_and_this_site(
    start_service: StartService,
) -> None:
    service = await start_service(run_workers=False)
    job_id = await service.trigger(queue=IDLE, task="ui.a")
    browser = await signed_in(service)
    page = (await browser.get(f"/ui/jobs/{job_id}")).text
    cancel = f"/ui/jobs/{job_id}/cancel"
    assert (await browser.post(cancel)).status_code == 403
    assert (await browser.post(cancel, data={"csrf_token": "forged"})).status_code == 403
    cross = await browser.post(
        cancel, data={"csrf_token": csrf_of(page)}, headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert cross.status_code == 403
    elsewhere = await browser.post(
        cancel, data={"csrf_token": csrf_of(page)}, headers={"Origin": "http://evil.test"}
    )
    assert elsewhere.status_code == 403
    assert (await service.status(job_id))["status"] == "queued"  # nothing was written
    done = await browser.post(cancel, data={"csrf_token": csrf_of(page), "confirmed": "yes"})
    assert done.status_code == 303
    assert (await service.status(job_id))["status"] == "canceled"


@pytest.mark.parametrize("path", ["/ui", "/ui/jobs", "/ui/jobs/find?q=x"])
async def test_with_tokens_a_viewer_signs_in_first(start_service: StartService, path: str) -> None:
    service = await start_service(run_workers=False, api_tokens=TOKENS)
    anonymous = httpx.AsyncClient(
        transport=service.client._transport, base_url="http://dataloader.test"
    )
    answer = await anonymous.get(path)
    assert answer.status_code == 303
    assert answer.headers["location"].startswith("/ui/signin?next=")
    wrong = await anonymous.post("/ui/signin", data={"token": "nope-0123456789abcdef"})
    assert wrong.status_code == 401
    assert "not one of DL_API_TOKENS" in wrong.text
    # no open redirect: `next` stays within the dashboard
    signed = await anonymous.post("/ui/signin", data={"token": READ, "next": "//evil.test/x"})
    assert signed.headers["location"] == "/ui"
    assert "HttpOnly" in signed.headers["set-cookie"]
    assert "SameSite=strict" in signed.headers["set-cookie"]


async def test_a_read_token_sees_and_changes_nothing_a_trigger_token_acts(
    start_service: StartService,
) -> None:
    service = await start_service(run_workers=False, api_tokens=TOKENS)
    service.client.headers["Authorization"] = f"Bearer {TRIGGER}"
    job_id = await service.trigger(queue=IDLE, task="ui.a")
    reader = await signed_in(service, READ)
    page = (await reader.get(f"/ui/jobs/{job_id}")).text
    assert "Cancel" not in page
    refused = await reader.post(f"/ui/jobs/{job_id}/cancel", data={"csrf_token": csrf_of(page)})
    assert refused.status_code == 403
    assert (await service.status(job_id))["status"] == "queued"

    actor = await signed_in(service, TRIGGER)
    page = (await actor.get(f"/ui/jobs/{job_id}")).text
    assert "Cancel" in page
    done = await actor.post(
        f"/ui/jobs/{job_id}/cancel", data={"csrf_token": csrf_of(page), "confirmed": "yes"}
    )
    assert done.status_code == 303
    events = (await service.client.get(f"/api/v1/jobs/{job_id}/events")).json()["events"]
    assert [e["payload"]["by"] for e in events if e["kind"] == "canceled"] == ["token:etl"]

    # a change in bulk takes admin, as in the API
    other = await service.trigger(queue=IDLE, task="ui.a")
    listed = (await actor.get("/ui/jobs", params={"queue": IDLE})).text
    assert "Cancel all matching" not in listed
    confirm = (await actor.get("/ui/jobs-bulk/cancel", params={"queue": IDLE})).text
    assert "Cancel them" not in confirm
    refused = await actor.post(
        f"/ui/jobs-bulk/cancel?queue={IDLE}", data={"csrf_token": csrf_of(confirm)}
    )
    assert refused.status_code == 403
    assert (await service.status(other))["status"] == "queued"


async def test_a_queue_is_paused_and_resumed_by_an_admin_and_audited(
    start_service: StartService,
) -> None:
    service = await start_service(run_workers=False, api_tokens=[*TOKENS, ADMIN_TOKEN])
    service.client.headers["Authorization"] = f"Bearer {TRIGGER}"
    await service.trigger(queue=IDLE, task="ui.a")

    view = await queue_view_of(service.dl, IDLE)
    assert view.stats is not None
    assert (view.stats.ready, view.stats.paused, view.audit) == (1, False, [])

    trigger = await signed_in(service, TRIGGER)
    page = (await trigger.get(f"/ui/queues/{IDLE}")).text
    assert "Pause" not in page  # pausing a queue takes admin, as in the API
    refused = await trigger.post(f"/ui/queues/{IDLE}/pause", data={"csrf_token": csrf_of(page)})
    assert refused.status_code == 403

    admin = await signed_in(service, ADMIN)
    page = (await admin.get(f"/ui/queues/{IDLE}")).text
    paused = await admin.post(f"/ui/queues/{IDLE}/pause", data={"csrf_token": csrf_of(page)})
    assert paused.status_code == 303
    page = (await admin.get(f"/ui/queues/{IDLE}")).text
    assert "Resume" in page
    resumed = await admin.post(f"/ui/queues/{IDLE}/resume", data={"csrf_token": csrf_of(page)})
    assert resumed.status_code == 303

    view = await queue_view_of(service.dl, IDLE)
    assert view.stats is not None
    assert not view.stats.paused
    assert [(e.kind, e.actor) for e in view.audit] == [
        ("resumed", "token:ops"),
        ("paused", "token:ops"),
    ]
    assert "token:ops" in (await admin.get(f"/ui/queues/{IDLE}")).text


async def test_a_queue_whose_name_holds_a_slash_is_shown_paused_and_limited(
    start_service: StartService,
) -> None:
    service = await start_service(run_workers=False)
    await service.trigger(queue="etl/daily", task="ui.a")
    browser = await signed_in(service)
    page = await browser.get("/ui/queues/etl/daily")
    assert page.status_code == 200
    assert "<code>etl/daily</code>" in page.text
    csrf = csrf_of(page.text)
    paused = await browser.post("/ui/queues/etl/daily/pause", data={"csrf_token": csrf})
    assert (paused.status_code, paused.headers["location"]) == (303, "/ui/queues/etl/daily")
    limited = await browser.post(
        "/ui/queues/etl/daily/limits", data={"max_running": "2", "csrf_token": csrf}
    )
    assert limited.status_code == 303
    stats = (await service.dl.stats("etl/daily"))["etl/daily"]
    assert (stats.paused, stats.limits.max_running) == (True, 2)
    assert (await browser.get("/ui/queues/etl/pause")).status_code == 405  # an action's path


async def test_a_queues_limits_are_set_by_an_admin_and_audited(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False, api_tokens=[*TOKENS, ADMIN_TOKEN])
    service.client.headers["Authorization"] = f"Bearer {TRIGGER}"
    await service.trigger(queue=IDLE, task="ui.a")
    form = {"max_running": "3", "max_running_per_partition": "", "max_per_second": "0.5"}

    trigger = await signed_in(service, TRIGGER)
    page = (await trigger.get(f"/ui/queues/{IDLE}")).text
    assert "Set limits" not in page  # limits take admin, as in the API
    refused = await trigger.post(
        f"/ui/queues/{IDLE}/limits", data={**form, "csrf_token": csrf_of(page)}
    )
    assert refused.status_code == 403

    admin = await signed_in(service, ADMIN)
    csrf = csrf_of((await admin.get(f"/ui/queues/{IDLE}")).text)
    done = await admin.post(f"/ui/queues/{IDLE}/limits", data={**form, "csrf_token": csrf})
    assert done.status_code == 303
    limits = (await service.dl.stats(IDLE))[IDLE].limits
    assert (limits.max_running, limits.max_running_per_partition, limits.max_per_second) == (
        3, None, 0.5,
    )  # fmt: skip
    page = (await admin.get(f"/ui/queues/{IDLE}")).text
    assert 'name="max_running" inputmode="numeric" value="3"' in page  # shown to change

    audited = await conn.fetchval("SELECT count(*) FROM dl_queue_events")
    for bad, words in [
        ({"max_running": "three"}, "max_running must be a whole number, or empty"),
        ({"max_running": "0"}, "max_running must be an integer from 1"),
        ({"max_per_second": "nan"}, "max_per_second must be a number from 0.001"),
    ]:
        answer = await admin.post(
            f"/ui/queues/{IDLE}/limits", data={**form, **bad, "csrf_token": csrf}
        )
        assert answer.status_code == 400
        assert words in answer.text
        assert "<!doctype html>" in answer.text.lower()  # the page again, with the error
    assert await conn.fetchval("SELECT count(*) FROM dl_queue_events") == audited
    assert (await service.dl.stats(IDLE))[IDLE].limits == limits

    cleared = {"max_running": "", "max_running_per_partition": "", "max_per_second": ""}
    await admin.post(f"/ui/queues/{IDLE}/limits", data={**cleared, "csrf_token": csrf})
    assert not (await service.dl.stats(IDLE))[IDLE].limits.any
    kinds = [(e.kind, e.actor) for e in (await queue_view_of(service.dl, IDLE)).audit]
    assert kinds[:2] == [("limits", "token:ops"), ("limits", "token:ops")]


async def test_the_workers_and_cron_pages_show_the_live_processes_and_schedules(
    start_service: StartService,
) -> None:
    service = await start_service(workers=[{"queue": IDLE, "concurrency": 3}])
    browser = await signed_in(service)
    page = (await browser.get("/ui/workers")).text
    assert service.manager.worker_id in page
    assert f"{IDLE}</a> (3)" in page
    assert (await browser.get("/ui/cron")).status_code == 200


async def test_the_cron_page_shows_each_schedules_last_and_next_slot_and_its_job(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False)
    store = MaintenanceStore(GuardedPool(service.context.pool))
    daily = CronSpec(
        name="nightly", schedule="30 2 * * *", task="ui.load", queue=IDLE, timezone="Asia/Tokyo"
    )
    scheduler = CronScheduler(store, service.dl, [daily])
    await scheduler.tick()  # it starts from now
    (recorded,) = (await service.dl.maintenance()).cron
    assert recorded.timezone == "Asia/Tokyo"
    # a slot was due: its job is made
    await conn.execute("UPDATE dl_cron SET last_slot = last_slot - interval '1 day'")
    assert (await scheduler.tick())["enqueued"] == 1
    (job,) = (await service.dl.list(task="ui.load")).jobs

    (schedule,) = await schedules_of(service.dl, await service.dl.maintenance())
    assert schedule.last_job == job.job_id
    assert schedule.next_slot is not None
    tokyo = schedule.next_slot.astimezone(ZoneInfo("Asia/Tokyo"))
    assert (tokyo.hour, tokyo.minute) == (2, 30)  # read in its zone, not in UTC
    assert timedelta(0) < schedule.next_slot - datetime.now(UTC) <= timedelta(days=1)

    page = (await (await signed_in(service)).get("/ui/cron")).text
    assert f'href="/ui/jobs/{job.job_id}"' in page
    assert "(Asia/Tokyo)" in page
    assert schedule.next_slot.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") in page


async def test_a_job_behind_a_running_one_of_its_lock_key_says_which(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    # its workers serve another queue: nothing claims these jobs but the test
    service = await start_service(workers=[{"queue": "ui.elsewhere", "concurrency": 2}])
    holder = await service.trigger(queue=IDLE, task="ui.a", lock_key="shared")
    waiting = await service.trigger(queue=IDLE, task="ui.a", lock_key="shared")
    # the first job holds the key, as a running job of the key would
    await conn.execute(
        "UPDATE dl_jobs SET status = 'running', attempt = 1, lease_expires_at = now()"
        " + interval '1 hour' WHERE job_id = $1",
        uuid.UUID(holder),
    )
    view = await job_view_of(service.dl, uuid.UUID(waiting))
    assert view is not None
    texts = [r.text for r in view.waiting]
    assert f"its lock_key 'shared' is held by job {holder}" in texts
    assert f"no live process serves its queue '{IDLE}'" in texts
    page = (await (await signed_in(service)).get(f"/ui/jobs/{waiting}")).text
    assert "Why is this job not running?" in page
    assert f'href="/ui/jobs/{holder}"' in page


def action_of(page: str, action: str) -> str:
    """Where the page's form of a process's `action` posts (its id as the page wrote it)."""
    found = re.search(rf'action="([^"]*/process-actions/{action}/[^"]*)"', page)
    assert found is not None, page
    return html.unescape(found.group(1))


@pytest.mark.parametrize("process_id", ["o/1", "report/call", "events", "call", "50% off?#"])
async def test_a_process_is_listed_shown_called_repaired_and_removed_through_its_links(
    start_service: StartService, process_id: str
) -> None:
    """Whatever its id, the list links to the process's page and the page's forms act on it
    (its id is one encoded segment of each URL)."""
    service = await start_service(
        tasks=orders.copy(), workers=[{"queue": "orders", "concurrency": 2}]
    )
    await service.dl.processes.start("orders", process_id, {"total": 10})
    browser = await signed_in(service)

    listed = (await browser.get("/ui/processes", params={"namespace": "orders"})).text
    link = re.search(rf'<a href="([^"]+)">{re.escape(html.escape(process_id))}</a>', listed)
    assert link is not None, listed
    assert "timeout at" in listed
    page_url = html.unescape(link.group(1))
    page = (await browser.get(page_url)).text
    assert "awaiting_payment" in page
    assert "#1" in page  # its history

    called = await browser.post(
        action_of(page, "call"), data={"args": '{"pay": 10}', "csrf_token": csrf_of(page)}
    )
    assert called.status_code == 303
    page = (await browser.get(called.headers["location"])).text
    assert "call: {&#34;state&#34;: &#34;paid&#34;}" in page
    assert (await service.dl.processes.get("orders", process_id)).aux_state["state"] == "paid"  # type: ignore[union-attr]

    bad = await browser.post(
        action_of(page, "call"), data={"args": "{", "csrf_token": csrf_of(page)}
    )
    assert bad.status_code == 400
    failed = await browser.post(
        action_of(page, "call"), data={"args": '{"boom": "x"}', "csrf_token": csrf_of(page)}
    )
    page = (await browser.get(failed.headers["location"])).text
    repaired = await browser.post(action_of(page, "repair"), data={"csrf_token": csrf_of(page)})
    page = (await browser.get(repaired.headers["location"])).text
    assert "repair: {&#34;repaired&#34;: true}" in page
    removed = await browser.post(
        action_of(page, "remove"), data={"csrf_token": csrf_of(page), "confirmed": "yes"}
    )
    assert removed.status_code == 303
    assert await service.dl.processes.get("orders", process_id) is None
    assert (await browser.get(page_url)).status_code == 404


def howto_processor(monkeypatch: pytest.MonkeyPatch) -> TaskRegistry:
    """The processor of docs/howto/processes.md (its first program block, as the page has
    it), registered in a registry of the test's."""
    page = (HOWTO / "processes.md").read_text(encoding="utf-8")
    first = next(code for language, code in BLOCK.findall(page) if language == "python")
    local = TaskRegistry()
    monkeypatch.setattr(dataloader, "process", local.process)
    monkeypatch.setenv("DL_DB_DSN", "postgresql://unused")  # read by the page, not used here
    exec(compile(first, "docs/howto/processes.md", "exec"), {"__name__": "howto_orders"})
    return local


async def test_repair_on_the_page_repairs_a_process_of_the_how_tos_processor(
    start_service: StartService, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = await start_service(
        tasks=howto_processor(monkeypatch), workers=[{"queue": "orders", "concurrency": 2}]
    )
    await service.dl.processes.start("orders", "order-42", {"total": 100})
    with pytest.raises(ProcessTaskFailed, match="KeyError"):
        await service.dl.processes.call("orders", "order-42", {})  # a payment without amount
    browser = await signed_in(service)
    page = (await browser.get("/ui/processes/orders/order-42")).text
    repaired = await browser.post(action_of(page, "repair"), data={"csrf_token": csrf_of(page)})
    assert repaired.status_code == 303
    page = (await browser.get(repaired.headers["location"])).text
    assert "repair: {&#34;state&#34;: &#34;awaiting_payment&#34;" in page, page
    process = await service.dl.processes.get("orders", "order-42")
    assert process is not None
    assert process.status is ProcessStatus.RUNNING
    paid = await service.dl.processes.call("orders", "order-42", {"amount": 100})
    assert paid["state"] == "paid"


async def test_jobs_matching_a_filter_are_counted_then_canceled_in_bulk(
    start_service: StartService,
) -> None:
    service = await start_service(run_workers=False)
    doomed = [await service.trigger(queue=IDLE, task="ui.doomed") for _ in range(3)]
    kept = await service.trigger(queue=IDLE, task="ui.kept")
    browser = await signed_in(service)
    listed = (await browser.get("/ui/jobs", params={"task": "ui.doomed"})).text
    assert "Cancel all matching" in listed

    confirm = await browser.get("/ui/jobs-bulk/cancel", params={"task": "ui.doomed"})
    assert confirm.status_code == 200
    assert "<strong>3</strong> job(s) match" in confirm.text
    assert (await browser.get("/ui/jobs-bulk/cancel")).status_code == 400  # no filter: no
    done = await browser.post(
        "/ui/jobs-bulk/cancel?task=ui.doomed", data={"csrf_token": csrf_of(confirm.text)}
    )
    assert done.status_code == 303
    assert "canceled+3+of+3" in done.headers["location"]
    for job_id in doomed:
        assert (await service.status(job_id))["status"] == "canceled"
    assert (await service.status(kept))["status"] == "queued"

    retry = await browser.get("/ui/jobs-bulk/retry", params={"task": "ui.doomed"})
    done = await browser.post(
        "/ui/jobs-bulk/retry?task=ui.doomed", data={"csrf_token": csrf_of(retry.text)}
    )
    assert "retried+3+of+3" in done.headers["location"]
    assert {(await service.status(j))["status"] for j in doomed} == {"queued"}

    by_args = {"args": '{"batch": 7}'}
    picked = await service.trigger(queue=IDLE, task="ui.doomed", args={"batch": 7, "i": 1})
    confirm = await browser.get("/ui/jobs-bulk/cancel", params=by_args)
    assert "<strong>1</strong> job(s) match" in confirm.text
    done = await browser.post(
        "/ui/jobs-bulk/cancel", params=by_args, data={"csrf_token": csrf_of(confirm.text)}
    )
    assert "canceled+1+of+1" in done.headers["location"]
    assert (await service.status(picked))["status"] == "canceled"
    assert {(await service.status(j))["status"] for j in doomed} == {"queued"}


async def test_a_job_shows_each_attempt_with_its_traceback_and_its_stages(
    start_service: StartService, registry: TaskRegistry
) -> None:
    secret_dsn = "postgresql://etl:hunter2@db.internal/warehouse"

    @registry.task("ui.flaky", queue="ui.work", then="ui.after", retry=Linear(0))
    async def flaky(ctx: JobContext[dict[str, Any]]) -> dict[str, int]:
        if ctx.attempt == 1:
            deep_in_the_loader(secret_dsn)
        return {"rows": 1}

    @registry.task("ui.after", queue="ui.work")
    async def after(ctx: JobContext[dict[str, Any]]) -> None: ...

    service = await start_service(workers=[{"queue": "ui.work", "concurrency": 1}])
    first = await service.dl.enqueue("ui.flaky", {}, lock_key="day")
    assert (await service.dl.wait(first.job_id, timeout=60)).status.value == "succeeded"
    (stage,) = await service.dl.stages(first.job_id)
    assert stage.task == "ui.after"
    with pytest.raises(ValueError, match="limit must be an integer between 1 and 1000"):
        await service.dl.stages(first.job_id, limit=0)

    view = await job_view_of(service.dl, first.job_id)
    assert view is not None
    assert [(a.number, a.outcome) for a in view.attempts] == [(1, "requeue"), (2, "done")]
    failed = view.attempts[0]
    assert failed.error is not None
    assert failed.error.startswith("ConnectionError: cannot reach")
    assert failed.traceback is not None
    assert "deep_in_the_loader" in failed.traceback  # the frame that raised
    assert "hunter2" not in failed.traceback  # masked when written, as the log masks it
    assert view.attempts[1].traceback is None
    assert [s.job_id for s in view.stages] == [stage.job_id]
    assert view.parent is None
    stage_view = await job_view_of(service.dl, stage.job_id)
    assert stage_view is not None
    assert stage_view.parent == first.job_id

    browser = await signed_in(service)
    page = (await browser.get(f"/ui/jobs/{first.job_id}")).text
    assert "Traceback" in page
    assert "deep_in_the_loader" in page
    assert "hunter2" not in page  # neither in the error nor in the traceback
    assert f'href="/ui/jobs/{stage.job_id}"' in page
    stage_page = (await browser.get(f"/ui/jobs/{stage.job_id}")).text
    assert f'href="/ui/jobs/{first.job_id}"' in stage_page


def deep_in_the_loader(dsn: str) -> None:
    raise ConnectionError(f"cannot reach {dsn}")
