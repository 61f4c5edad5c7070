"""The dashboard in a real browser (Debian's chromium, driven by Playwright) against a
service running on 127.0.0.1: what an operator sees and does."""

from __future__ import annotations

import json
from typing import Any

from .browser import a_service, screenshot
from .procs import Launcher

READ = "read-token-0123456789abcdef"
ADMIN = "admin-token-0123456789abcdef"
TOKENS = json.dumps(
    [
        {"name": "viewer", "scope": "read", "token": READ},
        {"name": "ops", "scope": "admin", "token": ADMIN},
    ]
)
#: A queue nobody serves: its jobs stay queued until canceled.
IDLE = "ui.idle"


async def test_the_overview_shows_the_queues_and_the_live_process(
    launcher: Launcher, db_dsn: str, browser: Any
) -> None:
    service = await a_service(launcher, db_dsn)
    await service.trigger(queue=IDLE, task="ui.nobody")
    page = await browser.new_page()
    await page.goto(f"{service.base_url}/ui")
    await page.get_by_role("heading", name="Overview").wait_for()
    row = page.get_by_role("row").filter(has_text=IDLE)
    assert await row.count() == 1
    assert await page.get_by_role("heading", name="Live processes").is_visible()
    assert "has ready jobs and no live worker serves it" in await page.content()
    await screenshot(page, "overview")


async def test_a_job_whose_args_hold_a_script_shows_it_as_text(
    launcher: Launcher, db_dsn: str, browser: Any
) -> None:
    service = await a_service(launcher, db_dsn)
    evil = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"
    job_id = await service.trigger(queue=IDLE, task="ui.nobody", args={"html": evil})
    page = await browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))
    await page.goto(f"{service.base_url}/ui/jobs/{job_id}")
    args = page.locator("#job-args")
    assert evil in await args.inner_text()
    assert await page.title() != "pwned"
    assert dialogs == []
    await screenshot(page, "job-with-script-args")


async def test_cancel_a_queued_job_and_retry_a_failed_one(
    launcher: Launcher, db_dsn: str, browser: Any
) -> None:
    service = await a_service(launcher, db_dsn)
    queued = await service.trigger(queue=IDLE, task="ui.nobody")
    failed = await service.trigger(task="demo.fail", args={"fail_times": 1}, max_attempts=1)
    await service.wait_status(failed, "failed")
    page = await browser.new_page()

    await page.goto(f"{service.base_url}/ui/jobs/{queued}")
    await page.get_by_role("button", name="Cancel").click()
    await page.get_by_role("button", name="Yes, cancel it").click()
    await page.locator("#job-status", has_text="canceled").wait_for()
    assert (await service.status(queued))["status"] == "canceled"
    await screenshot(page, "job-canceled")

    await page.goto(f"{service.base_url}/ui/jobs/{failed}")
    await page.get_by_role("button", name="Retry").click()
    await page.locator(".timeline .kind", has_text="retried").wait_for()
    journal = (await service.client.get(f"/api/v1/jobs/{failed}/events")).json()["events"]
    assert [e["payload"]["by"] for e in journal if e["kind"] == "retried"] == ["dashboard"]
    await screenshot(page, "job-retried")


async def test_filter_jobs_by_args(launcher: Launcher, db_dsn: str, browser: Any) -> None:
    service = await a_service(launcher, db_dsn)
    wanted = await service.trigger(queue=IDLE, task="ui.load", args={"day": "2026-01-01", "n": 1})
    await service.trigger(queue=IDLE, task="ui.load", args={"day": "2026-01-02", "n": 2})
    page = await browser.new_page()
    await page.goto(f"{service.base_url}/ui/jobs")
    await page.get_by_label("args contain").fill('{"day": "2026-01-01"}')
    await page.get_by_role("button", name="Filter").click()
    await page.wait_for_url("**/ui/jobs?*args=*")
    rows = page.locator("tbody tr")
    assert await rows.count() == 1
    assert wanted in await rows.first.inner_text()
    await screenshot(page, "jobs-filtered-by-args")

    await page.get_by_label("args contain").fill("day=2026-01-01")
    await page.get_by_role("button", name="Filter").click()
    await page.get_by_role("alert").filter(has_text="args: not valid JSON").wait_for()


async def test_a_read_token_sees_everything_and_changes_nothing_an_admin_acts(
    launcher: Launcher, db_dsn: str, browser: Any
) -> None:
    service = await a_service(launcher, db_dsn, DL_API_TOKENS=TOKENS)
    service.client.headers["Authorization"] = f"Bearer {ADMIN}"
    job_id = await service.trigger(queue=IDLE, task="ui.nobody")
    context = await browser.new_context()
    page = await context.new_page()

    await page.goto(f"{service.base_url}/ui/jobs/{job_id}")
    await page.get_by_label("API token").wait_for()  # sent to sign in first
    await page.get_by_label("API token").fill("not-a-token-0123456789")
    await page.get_by_role("button", name="Sign in").click()
    await page.get_by_role("alert").wait_for()
    await page.get_by_label("API token").fill(READ)
    await page.get_by_role("button", name="Sign in").click()
    await page.locator("#job-status").wait_for()
    assert await page.get_by_role("button", name="Cancel").count() == 0
    cookies = await context.cookies()
    [session] = [c for c in cookies if c["name"] == "dl_session"]
    assert session["httpOnly"]
    assert session["sameSite"] == "Strict"
    assert READ not in session["value"]
    await screenshot(page, "read-token-job")

    await page.get_by_role("button", name="Sign out").click()
    await page.get_by_label("API token").fill(ADMIN)
    await page.get_by_role("button", name="Sign in").click()
    await page.get_by_role("heading", name="Overview").wait_for()
    await page.goto(f"{service.base_url}/ui/jobs/{job_id}")
    await page.get_by_role("button", name="Cancel").click()
    await page.get_by_role("button", name="Yes, cancel it").click()
    await page.locator("#job-status", has_text="canceled").wait_for()
    journal = (await service.client.get(f"/api/v1/jobs/{job_id}/events")).json()["events"]
    [canceled] = [e for e in journal if e["kind"] == "canceled"]
    assert canceled["payload"]["by"] == "token:ops"


async def test_pause_and_resume_a_queue(launcher: Launcher, db_dsn: str, browser: Any) -> None:
    service = await a_service(launcher, db_dsn)
    await service.trigger(queue=IDLE, task="ui.nobody")
    page = await browser.new_page()
    await page.goto(f"{service.base_url}/ui")
    await page.get_by_role("link", name=IDLE).click()
    await page.get_by_role("button", name="Pause").click()
    await page.locator("#queue-state", has_text="Paused").wait_for()
    queues = (await service.client.get("/api/v1/queues")).json()["queues"]
    assert [q["paused"] for q in queues if q["queue"] == IDLE] == [True]
    await screenshot(page, "queue-paused")
    await page.get_by_role("button", name="Resume").click()
    await page.locator("#queue-state", has_text="Running").wait_for()
    audit = page.get_by_role("row").filter(has_text="paused")
    assert await audit.count() == 1

    # its facts follow the queue without a reload
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    assert await page.locator("#queue-ready").inner_text() == "1"
    await service.trigger(queue=IDLE, task="ui.nobody")
    await page.locator("#queue-ready", has_text="2").wait_for(timeout=20_000)
    assert navigations == []


async def test_a_running_jobs_progress_bar_advances_without_a_reload(
    launcher: Launcher, db_dsn: str, browser: Any
) -> None:
    service = await a_service(launcher, db_dsn)
    paused = await service.client.post("/api/v1/queues/default/pause")
    assert paused.status_code == 200, paused.text
    job_id = await service.trigger(task="demo.sleep", args={"seconds": 6, "chunks": 12})
    page = await browser.new_page()
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    await page.goto(f"{service.base_url}/ui/jobs/{job_id}")
    why = page.get_by_role("heading", name="Why is this job not running?")
    assert await why.is_visible()
    assert "paused" in await page.locator("#job-waiting").inner_text()

    await service.client.post("/api/v1/queues/default/resume")
    await page.locator("#job-status", has_text="running").wait_for(timeout=20_000)
    await why.wait_for(state="hidden")  # it runs: the answer is gone, without a reload
    bar = page.locator("#job-progress")
    first = int(await bar.get_attribute("value") or 0)
    await page.wait_for_function(
        f"document.getElementById('job-progress').value > {first}", timeout=20_000
    )
    assert len(navigations) == 1  # the bar moved in place
    await screenshot(page, "job-progress")
    await page.locator("#job-status", has_text="succeeded").wait_for(timeout=30_000)


async def test_the_overview_follows_the_queues_without_a_reload_and_fits_a_phone(
    launcher: Launcher, db_dsn: str, browser: Any
) -> None:
    service = await a_service(launcher, db_dsn)
    page = await browser.new_page(viewport={"width": 375, "height": 740})
    await page.goto(f"{service.base_url}/ui")
    await page.get_by_role("heading", name="Overview").wait_for()
    assert await page.get_by_role("row").filter(has_text="ui.later").count() == 0
    await service.trigger(queue="ui.later", task="ui.nobody")
    await page.get_by_role("row").filter(has_text="ui.later").wait_for(timeout=20_000)
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= 375  # the wide tables scroll inside their box, not the page
    await screenshot(page, "overview-375px")
