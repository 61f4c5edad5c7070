"""What no other site, no stale session and no bad parameter can do to the service: changes
from other origins are refused on every route (in Chromium, from a page of another origin,
and header by header over HTTP), every replica and every restart accepts the dashboard's
sessions, bad query and path values are a clear refusal (never a 500), and signing in leads
back to the page asked for, query included."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from .browser import a_service, screenshot
from .conftest import Service, StartService, wait_until
from .procs import Launcher, ServiceProcess, free_port
from .test_dashboard import csrf_of, signed_in

#: A queue nobody serves: its jobs stay queued until canceled.
IDLE = "ui.idle"
READ = "read-token-0123456789abcdef"
TOKENS = [{"name": "viewer", "scope": "read", "token": READ}]
#: A front-end of another site, deliberately allowed.
FRONT_END = "https://ops.example.com"


async def queue_paused(service: Service | ServiceProcess, queue: str) -> bool:
    answer = await service.client.get(f"/api/v1/queues/{quote(queue, safe='')}")
    assert answer.status_code == 200, answer.text
    paused: bool = answer.json()["paused"]
    return paused


# --- changes from other sites, header by header ----------------------------------------------

#: Headers a browser sends with a request that a page of another origin made.
FOREIGN = {
    "another site": {"Origin": "http://evil.test", "Sec-Fetch-Site": "cross-site"},
    "another port of this host": {
        "Origin": "http://dataloader.test:8081",
        "Sec-Fetch-Site": "same-site",
    },
    "an origin only (no Sec-Fetch-Site)": {"Origin": "http://evil.test"},
    "a sandboxed page (Origin: null)": {"Origin": "null"},
    "Sec-Fetch-Site only": {"Sec-Fetch-Site": "cross-site"},
}


@pytest.mark.parametrize("headers", FOREIGN.values(), ids=FOREIGN.keys())
async def test_a_change_from_another_origin_is_refused_and_changes_nothing(
    start_service: StartService, headers: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    service = await start_service(run_workers=False)
    job_id = await service.trigger(queue=IDLE, task="ui.a")
    browser = await signed_in(service)
    page = (await browser.get(f"/ui/jobs/{job_id}")).text
    for method, path, kwargs in [
        ("POST", f"/api/v1/queues/{IDLE}/pause", {}),
        ("POST", f"/api/v1/jobs/{job_id}/cancel", {}),
        ("POST", "/api/v1/jobs/cancel", {"json": {"queue": IDLE}}),
        ("PUT", f"/api/v1/queues/{IDLE}/limits", {"json": {"max_running": 1}}),
        ("DELETE", "/api/v1/processes/ns/p", {}),
        (
            "POST",
            f"/ui/jobs/{job_id}/cancel",
            {"data": {"csrf_token": csrf_of(page), "confirmed": "yes"}},
        ),
    ]:
        client = browser if path.startswith("/ui") else service.client
        answer = await client.request(method, path, headers=headers, **kwargs)
        assert answer.status_code == 403, (method, path, answer.text)
        detail = answer.json()["detail"]
        assert "\n" not in detail
        assert "DL_HTTP_ALLOWED_ORIGINS" in detail, detail
    assert not await queue_paused(service, IDLE)
    assert (await service.status(job_id))["status"] == "queued"
    # reading is no change: another site's page cannot read the answer anyway (no CORS)
    assert (await service.client.get(f"/api/v1/jobs/{job_id}", headers=headers)).status_code == 200
    assert "refused POST /api/v1/queues/ui.idle/pause" in caplog.text
    assert not [r for r in caplog.records if r.exc_info]


ALLOWED = {
    "no browser (curl, httpx, the CLI)": {},
    "this origin": {"Origin": "http://dataloader.test", "Sec-Fetch-Site": "same-origin"},
    "this origin, an older browser": {"Origin": "http://dataloader.test"},
    # a proxy in front rewrote Host: the browser's word is taken
    "same-origin behind a proxy": {
        "Origin": "https://dl.example.com",
        "Sec-Fetch-Site": "same-origin",
    },
    "an allowed front-end": {"Origin": FRONT_END, "Sec-Fetch-Site": "cross-site"},
}


@pytest.mark.parametrize("headers", ALLOWED.values(), ids=ALLOWED.keys())
async def test_a_change_from_no_browser_this_origin_or_an_allowed_one_is_made(
    start_service: StartService, headers: dict[str, str]
) -> None:
    service = await start_service(run_workers=False, http_allowed_origins=FRONT_END)
    job_id = await service.trigger(queue=IDLE, task="ui.a")
    paused = await service.client.post(f"/api/v1/queues/{IDLE}/pause", headers=headers)
    assert paused.status_code == 200, paused.text
    canceled = await service.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=headers)
    assert canceled.status_code == 200, canceled.text
    assert await queue_paused(service, IDLE)
    assert (await service.status(job_id))["status"] == "canceled"


async def test_an_allowed_front_end_may_read_the_answers(start_service: StartService) -> None:
    service = await start_service(run_workers=False, http_allowed_origins=f"{FRONT_END}/")
    asked = await service.client.options(
        "/api/v1/jobs/trigger",
        headers={
            "Origin": FRONT_END,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,authorization",
        },
    )
    assert asked.status_code == 200, asked.text
    assert asked.headers["access-control-allow-origin"] == FRONT_END
    other = await service.client.get("/health", headers={"Origin": "http://evil.test"})
    assert "access-control-allow-origin" not in other.headers


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
async def test_an_api_change_takes_json_or_no_body(
    start_service: StartService, content_type: str
) -> None:
    service = await start_service(run_workers=False)
    job_id = await service.trigger(queue=IDLE, task="ui.a")
    body = json.dumps({"queue": IDLE, "task": "ui.b", "lock_key": "k"})
    for path, content in [
        (f"/api/v1/queues/{IDLE}/pause", ""),
        (f"/api/v1/jobs/{job_id}/cancel", ""),
        ("/api/v1/jobs/trigger", body),
    ]:
        answer = await service.client.post(
            path, content=content, headers={"Content-Type": content_type}
        )
        assert answer.status_code == 415, (path, answer.text)
        assert content_type in answer.json()["detail"]
    assert not await queue_paused(service, IDLE)
    assert (await service.status(job_id))["status"] == "queued"
    listed = (await service.client.get("/api/v1/jobs", params={"queue": IDLE})).json()
    assert len(listed["jobs"]) == 1
    # JSON, with or without a charset, or no body at all
    answer = await service.client.post(
        "/api/v1/jobs/trigger",
        content=body,
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert answer.status_code == 200, answer.text
    assert (await service.client.post(f"/api/v1/queues/{IDLE}/pause")).status_code == 200


# --- the same, from a page of another origin in Chromium --------------------------------------


async def serve_page(html: str) -> tuple[asyncio.Server, int]:
    """A site of its own on 127.0.0.1 (another port: another origin) answering `html` to
    every request; (the server, its port)."""
    body = html.encode()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    port = free_port()
    server = await asyncio.start_server(answer, "127.0.0.1", port)
    return server, port


ATTACK = """<!doctype html><html><head><title>cats</title></head><body>
<form id="pause" method="post" action="{base}/api/v1/queues/{queue}/pause"></form>
<script>
fetch("{base}/api/v1/jobs/{job_id}/cancel", {{method: "POST", mode: "no-cors"}})
  .catch(() => null)
  .finally(() => document.getElementById("pause").submit());
</script></body></html>"""


@pytest.mark.parametrize("site", ["127.0.0.1", "localhost"], ids=["another-port", "another-site"])
async def test_a_page_of_another_origin_neither_pauses_a_queue_nor_cancels_a_job(
    launcher: Launcher, db_dsn: str, browser: Any, site: str
) -> None:
    service = await a_service(launcher, db_dsn)
    job_id = await service.trigger(queue=IDLE, task="ui.nobody")
    html = ATTACK.format(base=service.base_url, queue=IDLE, job_id=job_id)
    server, port = await serve_page(html)
    async with server:
        page = await browser.new_page()
        await page.goto(f"http://{site}:{port}/")
        # the form's answer replaces the page once the fetch has been answered
        await page.wait_for_url(f"{service.base_url}/api/v1/queues/{IDLE}/pause")
        assert "DL_HTTP_ALLOWED_ORIGINS" in await page.content()
        await screenshot(page, f"cross-site-refused-{site}")
    assert not await queue_paused(service, IDLE)
    assert (await service.status(job_id))["status"] == "queued"
    assert "refused POST /api/v1/jobs/" in service.logs()
    assert "Traceback" not in service.logs()


# --- sessions every replica and every restart accepts ------------------------------------------


async def on_the_port_of(
    service: ServiceProcess, launcher: Launcher, dsn: str, **env: str
) -> ServiceProcess:
    """Another service process listening on `service`'s port, once it serves (reach it
    through `service`'s address)."""
    other = launcher.start(
        dsn, DL_ALLOW_UNKNOWN_TASKS="true", DL_HTTP_PORT=str(service.port), **env
    )

    async def serving() -> bool:
        assert other.proc.poll() is None, other.logs()
        return "Application startup complete" in other.logs()

    await wait_until(serving, what=f"{other.name} to serve")
    return other


async def cancel_in_the_browser(page: Any, base_url: str, job_id: str) -> None:
    """Open the job's page, click Cancel and confirm: the page shows it canceled."""
    await page.goto(f"{base_url}/ui/jobs/{job_id}")
    await page.get_by_role("button", name="Cancel").click()
    await page.get_by_role("button", name="Yes, cancel it").click()
    await page.locator("#job-status", has_text="canceled").wait_for(timeout=15_000)


def cancels_served(service: ServiceProcess) -> int:
    """The confirmed cancels this process answered (its access log: DL_ACCESS_LOG)."""
    return sum(
        1 for line in service.logs().splitlines() if "POST /ui/jobs/" in line and " 303" in line
    )


async def test_actions_work_on_every_process_sharing_the_port(
    launcher: Launcher, db_dsn: str, browser: Any
) -> None:
    """Two processes on one port (DL_HTTP_REUSE_PORT): a page one served, its action
    answered by the other, succeeds. Each job is cancelled in a context of its own (its own
    connections, which the kernel spreads over the processes) holding the first session."""
    first = await a_service(launcher, db_dsn, DL_HTTP_REUSE_PORT="true", DL_ACCESS_LOG="true")
    second = await on_the_port_of(
        first, launcher, db_dsn, DL_HTTP_REUSE_PORT="true", DL_ACCESS_LOG="true"
    )
    opening = await browser.new_context()
    await (await opening.new_page()).goto(f"{first.base_url}/ui")
    session = await opening.storage_state()
    canceled = []
    for _ in range(40):  # until each process has answered cancels (most likely at once)
        if min(cancels_served(first), cancels_served(second)) >= 2:
            break
        job_id = await first.trigger(queue=IDLE, task="ui.nobody")
        context = await browser.new_context(storage_state=session)
        try:
            await cancel_in_the_browser(await context.new_page(), first.base_url, job_id)
        finally:
            await context.close()
        canceled.append(job_id)
    assert min(cancels_served(first), cancels_served(second)) >= 2, "the port was not shared"
    for job_id in canceled:
        assert (await first.status(job_id))["status"] == "canceled"
    assert "your session is new" not in first.logs() + second.logs()


async def test_a_page_opened_before_a_restart_acts_after_it(
    launcher: Launcher, db_dsn: str, browser: Any
) -> None:
    before = await a_service(launcher, db_dsn)
    job_id = await before.trigger(queue=IDLE, task="ui.nobody")
    page = await browser.new_page()
    await page.goto(f"{before.base_url}/ui/jobs/{job_id}")
    await page.get_by_role("button", name="Cancel").wait_for()
    before.terminate()
    assert await before.wait() == 0
    await on_the_port_of(before, launcher, db_dsn)
    await page.get_by_role("button", name="Cancel").click()
    await page.get_by_role("button", name="Yes, cancel it").click()
    await page.locator("#job-status", has_text="canceled").wait_for(timeout=15_000)
    assert (await before.status(job_id))["status"] == "canceled"  # through the port


async def test_a_refused_action_says_what_to_do_in_the_page(
    start_service: StartService,
) -> None:
    service = await start_service(run_workers=False)
    job_id = await service.trigger(queue=IDLE, task="ui.a")
    page = f"/ui/jobs/{job_id}"
    stranger = httpx.AsyncClient(
        transport=service.client._transport, base_url="http://dataloader.test"
    )
    browser = await signed_in(service)
    for client, form in [
        (stranger, {"confirmed": "yes"}),  # no session (it ended, another browser's page)
        (browser, {"csrf_token": "of-another-session", "confirmed": "yes"}),
    ]:
        answer = await client.post(
            f"{page}/cancel", data=form, headers={"Referer": f"http://dataloader.test{page}"}
        )
        assert answer.status_code == 403
        assert answer.headers["content-type"].startswith("text/html")
        assert "nothing was changed" in answer.text
        assert f'<a href="{page}" id="error-again">Reload the page</a>' in answer.text
    assert (await service.status(job_id))["status"] == "queued"
    # the refusal gave the stranger a session: reloading the page is all it takes
    reloaded = await stranger.get(page)
    assert reloaded.status_code == 200
    done = await stranger.post(
        f"{page}/cancel", data={"csrf_token": csrf_of(reloaded.text), "confirmed": "yes"}
    )
    assert done.status_code == 303
    assert (await service.status(job_id))["status"] == "canceled"


async def test_every_replica_shares_the_secret_a_setting_may_give_it(
    start_service: StartService,
) -> None:
    one = await start_service(run_workers=False)
    other = await start_service(run_workers=False)
    given = await start_service(run_workers=False, session_secret="s" * 32)
    assert one.app.state.session_secret == other.app.state.session_secret
    assert len(one.app.state.session_secret) == 32
    assert given.app.state.session_secret == b"s" * 32
    job_id = await one.trigger(queue=IDLE, task="ui.a")
    session = await signed_in(one)
    page = (await session.get(f"/ui/jobs/{job_id}")).text
    elsewhere = httpx.AsyncClient(
        transport=other.client._transport,
        base_url="http://dataloader.test",
        cookies=session.cookies,
    )
    done = await elsewhere.post(
        f"/ui/jobs/{job_id}/cancel", data={"csrf_token": csrf_of(page), "confirmed": "yes"}
    )
    assert done.status_code == 303, done.text


# --- bad query and path values ----------------------------------------------------------------

#: One past the largest bigint.
TOO_BIG = str(2**63)
#: (path, the parameter it names): each a 4xx naming the parameter, never a 500.
BAD_VALUES = [
    ("/ui/jobs?queue=%00", "queue"),
    ("/ui/jobs?task=%00", "task"),
    ("/ui/jobs?lock_key=%00", "lock_key"),
    ("/ui/jobs?partition_key=%00", "partition_key"),
    ("/ui/jobs?status=%00", "status"),
    ("/ui/jobs/find?q=%00", "q"),
    ("/ui/queues/%00", "queue"),
    ("/ui/live/queues/%00", "queue"),
    ("/ui/jobs-bulk/cancel?queue=%00", "queue"),
    ("/ui/processes?namespace=%00", "namespace"),
    (f"/ui/processes?cursor={TOO_BIG}", "cursor"),
    ("/ui/processes/%00/p", "namespace"),
    ("/ui/processes/ns/%00", "process_id"),
    (f"/ui/processes/ns/p?after={TOO_BIG}", "after"),
    ("/ui/signin?next=%00", "next"),
    ("/api/v1/jobs?queue=%00", "queue"),
    ("/api/v1/jobs?task=%00", "task"),
    ("/api/v1/jobs?lock_key=%00", "lock_key"),
    (f"/api/v1/jobs?cursor={TOO_BIG}", "cursor"),
    ("/api/v1/processes?namespace=%00", "namespace"),
    (f"/api/v1/processes?cursor={TOO_BIG}", "cursor"),
    (f"/api/v1/processes/ns/p/events?after={TOO_BIG}", "after"),
    ("/api/v1/queues/%00", "queue"),
    ("/api/v1/queue-events?queue=%00", "queue"),
    (f"/api/v1/queue-events?queue=q&after={TOO_BIG}", "after"),
    (f"/api/v1/jobs/00000000-0000-4000-8000-000000000000/events?after={TOO_BIG}", "after"),
]


@pytest.mark.parametrize(("path", "name"), BAD_VALUES, ids=[p for p, _ in BAD_VALUES])
async def test_a_bad_query_or_path_value_is_refused_naming_it(
    start_service: StartService, caplog: pytest.LogCaptureFixture, path: str, name: str
) -> None:
    service = await start_service(run_workers=False)
    browser = await signed_in(service)
    caplog.clear()
    answer = await browser.get(path)
    if path.startswith("/ui"):
        assert answer.status_code == 400, answer.text
        assert answer.headers["content-type"].startswith("text/html")
        assert f"{name}: " in answer.text
    else:
        assert answer.status_code == 422, answer.text
        assert [e["loc"][-1] for e in answer.json()["detail"]] == [name]
    assert not [r for r in caplog.records if r.exc_info], caplog.text


# --- signing in leads back to the page asked for -----------------------------------------------


async def test_signing_in_leads_back_to_the_page_asked_for_with_its_query(
    start_service: StartService,
) -> None:
    service = await start_service(run_workers=False, api_tokens=TOKENS)
    anonymous = httpx.AsyncClient(
        transport=service.client._transport, base_url="http://dataloader.test"
    )
    asked = "/ui/jobs?queue=q&status=queued"
    answer = await anonymous.get(asked)
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/ui/signin?next={quote(asked, safe='')}"
    form = await anonymous.get(answer.headers["location"])
    assert 'name="next" value="/ui/jobs?queue=q&amp;status=queued"' in form.text
    signed = await anonymous.post("/ui/signin", data={"token": READ, "next": asked})
    assert signed.headers["location"] == asked


@pytest.mark.parametrize(
    "elsewhere",
    [
        "//evil.test/ui",
        "https://evil.test/ui",
        "/ui\\..\\\\evil.test",
        "/uievil",
        "/ui/jobs\r\nSet-Cookie: x=1",
        "/ui#https://evil.test",
        "ui/jobs",
    ],
)
async def test_signing_in_never_leads_elsewhere(
    start_service: StartService, elsewhere: str
) -> None:
    service = await start_service(run_workers=False, api_tokens=TOKENS)
    anonymous = httpx.AsyncClient(
        transport=service.client._transport, base_url="http://dataloader.test"
    )
    signed = await anonymous.post("/ui/signin", data={"token": READ, "next": elsewhere})
    assert signed.headers["location"] == "/ui"


async def test_signing_in_in_the_browser_comes_back_to_the_filtered_list(
    launcher: Launcher, db_dsn: str, browser: Any
) -> None:
    service = await a_service(launcher, db_dsn, DL_API_TOKENS=json.dumps(TOKENS))
    page = await browser.new_page()
    await page.goto(f"{service.base_url}/ui/jobs?queue={IDLE}&status=queued")
    await page.get_by_label("API token").fill(READ)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_url(f"{service.base_url}/ui/jobs?queue={IDLE}&status=queued")
    assert await page.get_by_label("queue", exact=True).input_value() == IDLE
