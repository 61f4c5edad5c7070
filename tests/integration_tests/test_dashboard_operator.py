"""What an operator meets on the dashboard: why a job waits when its queue's slots are busy,
buttons that follow the live state, destructive actions confirmed first, and the small things
(a favicon, bidi controls shown escaped, filters kept, newer pages). In-process over HTTP, and
in a real browser (Debian's chromium, driven by Playwright) against a service on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

from dataloader.dashboard.jobs import job_view_of
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext

from .browser import a_service
from .conftest import StartService
from .procs import Launcher
from .test_dashboard import csrf_of, signed_in
from .test_dashboard_browser import IDLE

BUSY = "ui.busy"


async def test_without_tokens_the_dashboards_actions_are_journalled_as_the_dashboard(
    start_service: StartService,
) -> None:
    service = await start_service(run_workers=False)
    job_id = await service.trigger(queue=IDLE, task="ui.a")
    viewer = await signed_in(service)
    csrf = csrf_of((await viewer.get(f"/ui/jobs/{job_id}")).text)
    canceled = await viewer.post(
        f"/ui/jobs/{job_id}/cancel", data={"csrf_token": csrf, "confirmed": "yes"}
    )
    assert canceled.status_code == 303
    paused = await viewer.post(f"/ui/queues/{IDLE}/pause", data={"csrf_token": csrf})
    assert paused.status_code == 303
    journal = await service.dl.events(job_id)
    assert [e.payload["by"] for e in journal if e.kind == "canceled"] == ["dashboard"]
    assert [e.actor for e in await service.dl.queue_events(IDLE)] == ["dashboard"]
    # the API's own changes are still the API's
    await service.client.post(f"/api/v1/queues/{IDLE}/resume")
    assert [e.actor for e in await service.dl.queue_events(IDLE)] == ["dashboard", "api"]


async def test_a_job_behind_busy_slots_names_them_and_who_holds_them(
    start_service: StartService, registry: TaskRegistry
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @registry.task("ui.hold", queue=BUSY)
    async def hold(ctx: JobContext[dict[str, Any]]) -> None:
        started.set()
        await release.wait()

    service = await start_service(workers=[{"queue": BUSY, "concurrency": 1}], claim_ahead=False)
    running = await service.trigger(queue=BUSY, task="ui.hold")
    await asyncio.wait_for(started.wait(), 20)
    waiting = await service.trigger(queue=BUSY, task="ui.hold")
    try:
        view = await job_view_of(service.dl, uuid.UUID(waiting))
        assert view is not None
        [busy] = view.waiting
        assert busy.text == (
            "every slot serving its queue is busy: 1 of its jobs run in the 1 slot(s)"
            " of 1 live process(es)"
        )
        [worker] = await service.dl.workers()
        assert [(h.job_id, h.process) for h in busy.holders] == [
            (running, f"{worker.host} pid {worker.pid}")
        ]
        page = (await (await signed_in(service)).get(f"/ui/jobs/{waiting}")).text
        assert "every slot serving its queue is busy" in page
        assert f'href="/ui/jobs/{running}"' in page
        assert "nothing holds it back" not in page
    finally:
        release.set()
    await service.wait_status(waiting, "succeeded")


async def test_a_queue_paused_elsewhere_offers_resume_without_a_reload(
    launcher: Launcher, db_dsn: str, browser: Any
) -> None:
    service = await a_service(launcher, db_dsn)
    await service.trigger(queue=IDLE, task="ui.nobody")
    page = await browser.new_page()
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    await page.goto(f"{service.base_url}/ui/queues/{IDLE}")
    await page.get_by_role("button", name="Pause").wait_for()

    paused = await service.client.post(f"/api/v1/queues/{IDLE}/pause")
    assert paused.status_code == 200, paused.text
    await page.get_by_role("button", name="Resume").wait_for(timeout=20_000)
    assert await page.get_by_role("button", name="Pause").count() == 0
    assert len(navigations) == 1  # no reload
    await page.get_by_role("button", name="Resume").click()  # and it resumes
    await page.locator("#queue-state", has_text="Running").wait_for()
    queues = (await service.client.get("/api/v1/queues")).json()["queues"]
    assert [q["paused"] for q in queues if q["queue"] == IDLE] == [False]

    await service.client.post(f"/api/v1/queues/{IDLE}/pause")
    await page.get_by_role("button", name="Resume").wait_for(timeout=20_000)


async def test_a_running_jobs_progress_json_follows_its_bar(
    launcher: Launcher, db_dsn: str, browser: Any
) -> None:
    service = await a_service(launcher, db_dsn)
    job_id = await service.trigger(task="demo.sleep", args={"seconds": 8, "chunks": 16})
    await service.wait_status(job_id, "running")
    page = await browser.new_page()
    await page.goto(f"{service.base_url}/ui/jobs/{job_id}")
    first = int(await page.locator("#job-progress").get_attribute("value") or 0)
    await page.wait_for_function(
        f"document.getElementById('job-progress').value > {first + 1}", timeout=20_000
    )
    bar, shown = await page.evaluate(
        "[document.getElementById('job-progress').value,"
        " JSON.parse(document.getElementById('job-progress-json').textContent)]"
    )
    assert shown == {"done": bar, "total": 16}


PROCESS_MODULE = """
from dataloader import ProcessResult, process


@process("ui.orders")
async def order(task, process):
    return ProcessResult(aux_state={"state": "open"}, response={"state": "open"})
"""


async def test_remove_and_cancel_ask_first_and_act_once_confirmed(
    launcher: Launcher, db_dsn: str, browser: Any, tmp_path: Path
) -> None:
    modules = tmp_path / "mods"
    modules.mkdir()
    (modules / "ui_processes.py").write_text(PROCESS_MODULE, encoding="utf-8")
    service = await a_service(
        launcher,
        db_dsn,
        DL_PIPELINE_MODULES="ui_processes",
        PYTHONPATH=os.pathsep.join(filter(None, [str(modules), os.environ.get("PYTHONPATH")])),
        WORKERS_JSON='[{"queue": "ui.orders", "concurrency": 2}]',
    )
    started = await service.client.post("/api/v1/processes/ui.orders/o-1", json={"args": {}})
    assert started.status_code == 200, started.text
    page = await browser.new_page()
    process = f"{service.base_url}/ui/processes/ui.orders/o-1"
    await page.goto(process)

    await page.get_by_role("button", name="Remove").click()  # the first click asks
    await page.get_by_role("button", name="Yes, remove it").wait_for()
    assert "cannot be undone" in await page.locator("#confirm-question").inner_text()
    assert (await service.client.get("/api/v1/processes/ui.orders/o-1")).status_code == 200
    await page.get_by_role("link", name="No, go back").click()
    await page.wait_for_url(process)
    assert (await service.client.get("/api/v1/processes/ui.orders/o-1")).status_code == 200

    await page.get_by_role("button", name="Remove").click()
    await page.get_by_role("button", name="Yes, remove it").click()  # confirmed: removed
    await page.get_by_role("heading", name="Processes").wait_for()
    assert (await service.client.get("/api/v1/processes/ui.orders/o-1")).status_code == 404

    job_id = await service.trigger(queue=IDLE, task="ui.nobody")
    await page.goto(f"{service.base_url}/ui/jobs/{job_id}")
    await page.get_by_role("button", name="Cancel").click()
    await page.get_by_role("button", name="Yes, cancel it").wait_for()
    assert (await service.status(job_id))["status"] == "queued"
    await page.get_by_role("button", name="Yes, cancel it").click()
    await page.locator("#job-status", has_text="canceled").wait_for()
    assert (await service.status(job_id))["status"] == "canceled"


async def test_every_page_has_its_icon_and_no_console_error(
    launcher: Launcher, db_dsn: str, browser: Any
) -> None:
    service = await a_service(launcher, db_dsn)
    job_id = await service.trigger(queue=IDLE, task="ui.nobody")
    page = await browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on(
        "response",
        lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None,
    )
    icons: list[str] = []
    page.on("request", lambda r: icons.append(r.url) if "favicon" in r.url else None)
    for path in (
        "/ui",
        "/ui/jobs",
        f"/ui/jobs/{job_id}",
        f"/ui/queues/{IDLE}",
        "/ui/processes",
        "/ui/workers",
        "/ui/cron",
    ):
        await page.goto(f"{service.base_url}{path}", wait_until="networkidle")
    assert icons, "no page asked for an icon"
    assert errors == []
    icon = await service.client.get("/favicon.ico")
    assert (icon.status_code, icon.headers["content-type"]) == (200, "image/svg+xml")


async def test_bidi_controls_in_a_jobs_text_are_shown_escaped(
    launcher: Launcher, db_dsn: str, browser: Any
) -> None:
    service = await a_service(launcher, db_dsn)
    job_id = await service.trigger(
        queue=IDLE,
        task="ui.nobody",
        args={"file": "report\u202efdp.exe"},
        lock_key="key\u2066x",
        idempotency_key="once\u202e1",
    )
    page = await browser.new_page()
    await page.goto(f"{service.base_url}/ui/jobs/{job_id}")
    assert '"file": "report\\u202efdp.exe"' in await page.locator("#job-args").inner_text()
    shown = await page.locator("main").inner_text()
    assert "key\\u2066x" in shown
    assert "once\\u202e1" in shown
    assert "\u202e" not in await page.content()
    assert "\u2066" not in await page.content()

    # a filter keeps what it was given: the list of its lock_key finds the job again
    await page.goto(f"{service.base_url}/ui/jobs?lock_key=key%E2%81%A6x")
    assert "key\\u2066x" in await page.locator("tbody").inner_text()
    async with page.expect_navigation():
        await page.get_by_role("button", name="Filter").click()
    assert job_id in await page.locator("tbody").inner_text()


async def test_the_jobs_list_pages_back_to_newer_jobs_and_keeps_an_instant_with_an_offset(
    launcher: Launcher, db_dsn: str, browser: Any
) -> None:
    service = await a_service(launcher, db_dsn)
    newest_first = [await service.trigger(queue=IDLE, task="ui.nobody") for _ in range(120)]
    newest_first.reverse()
    page = await browser.new_page()

    async def shown() -> list[str]:
        return [text.strip() for text in await page.locator("tbody th").all_inner_texts()]

    async def follow(name: str) -> None:
        async with page.expect_navigation():
            await page.get_by_role("link", name=name).click()

    await page.goto(f"{service.base_url}/ui/jobs?queue={IDLE}")
    assert await shown() == newest_first[:50]
    assert await page.get_by_role("link", name="← Newer jobs").count() == 0
    await follow("Older jobs →")
    assert await shown() == newest_first[50:100]
    await follow("Older jobs →")
    assert await shown() == newest_first[100:]
    assert await page.get_by_role("link", name="Older jobs →").count() == 0
    await follow("← Newer jobs")
    assert await shown() == newest_first[50:100]
    await follow("← Newer jobs")
    assert await shown() == newest_first[:50]
    assert await page.get_by_role("link", name="← Newer jobs").count() == 0
    await follow("Older jobs →")
    await follow("Older jobs →")
    await follow("« First page")
    assert await shown() == newest_first[:50]

    # an instant with an offset is shown in UTC, the same instant: filtering again keeps it
    await page.goto(
        f"{service.base_url}/ui/jobs?queue={IDLE}&created_from=2000-01-01T12:00%2B02:00"
    )
    field = page.get_by_label("created from (UTC)")
    assert await field.input_value() == "2000-01-01T10:00"  # chromium drops ":00" seconds
    async with page.expect_navigation():
        await page.get_by_role("button", name="Filter").click()
    assert "created_from=2000-01-01T10%3A00&" in page.url
    assert await field.input_value() == "2000-01-01T10:00"
    assert await shown() == newest_first[:50]
