"""Bearer tokens and scopes, the request body limit, and secrets kept out of logs and answers."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from dataloader.api import DOCS_ASSETS_URL, create_app
from dataloader.api.auth import AuthorizedRoute, _Requirement, requires
from dataloader.config import Scope
from dataloader.dashboard.common import viewer_of

from ..conftest import Service, StartService
from ..procs import free_port, launched, run_cli
from .constants import STATUS_URL, TRIGGER_URL, VALID_TRIGGER, cancel_url, status_url
from .test_service import count_rows

READ = "read-token-0123456789abcdef"
TRIGGER = "trigger-token-0123456789abcdef"
ADMIN = "admin-token-0123456789abcdef"
TOKENS = [
    {"name": "dashboard", "scope": "read", "token": READ},
    {"name": "etl", "scope": "trigger", "token": TRIGGER},
    {"name": "ops", "scope": "admin", "token": ADMIN},
]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def secured(start_service: StartService) -> Service:
    return await start_service(run_workers=False, api_tokens=TOKENS)


async def stored_rows(conn: asyncpg.Connection) -> tuple[int, int]:
    return await count_rows(conn, "dl_jobs"), await count_rows(conn, "dl_job_events")


@pytest.mark.parametrize(
    "headers",
    [
        {},
        bearer("not-a-token-0123456789abcdef"),
        bearer(READ[:-1]),  # all but the last character right
        {"Authorization": f"Basic {READ}"},
        {"Authorization": "Bearer"},
    ],
    ids=["none", "unknown", "prefix-of-a-token", "basic-scheme", "empty-bearer"],
)
async def test_a_request_without_a_valid_token_is_401_and_writes_nothing(
    secured: Service, conn: asyncpg.Connection, headers: dict[str, str]
) -> None:
    for method, url, body in [
        ("POST", TRIGGER_URL, VALID_TRIGGER),
        ("GET", STATUS_URL, None),
        ("GET", status_url("00000000-0000-0000-0000-000000000000"), None),
        ("POST", cancel_url("00000000-0000-0000-0000-000000000000"), None),
    ]:
        response = await secured.client.request(method, url, json=body, headers=headers)
        assert response.status_code == 401, (url, response.text)
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["detail"] in {"missing bearer token", "unknown bearer token"}
    assert await stored_rows(conn) == (0, 0)


async def test_a_read_token_reads_but_cannot_trigger_or_cancel(
    secured: Service, conn: asyncpg.Connection
) -> None:
    response = await secured.client.post(TRIGGER_URL, json=VALID_TRIGGER, headers=bearer(READ))
    assert response.status_code == 403, response.text
    assert response.json()["detail"] == "this token's scope is read; trigger is needed"
    assert await stored_rows(conn) == (0, 0)

    created = await secured.client.post(TRIGGER_URL, json=VALID_TRIGGER, headers=bearer(TRIGGER))
    job_id = created.json()["job_id"]
    assert (await secured.client.get(status_url(job_id), headers=bearer(READ))).status_code == 200
    assert (await secured.client.get(STATUS_URL, headers=bearer(READ))).status_code == 200
    refused = await secured.client.post(cancel_url(job_id), headers=bearer(READ))
    assert refused.status_code == 403
    row = await conn.fetchrow(
        "SELECT status::text, cancel_requested FROM dl_jobs WHERE job_id = $1::uuid", job_id
    )
    assert tuple(row) == ("queued", False)


@pytest.mark.parametrize("token", [TRIGGER, ADMIN], ids=["trigger", "admin"])
async def test_trigger_and_admin_tokens_trigger_read_and_cancel(
    secured: Service, conn: asyncpg.Connection, token: str
) -> None:
    created = await secured.client.post(TRIGGER_URL, json=VALID_TRIGGER, headers=bearer(token))
    assert created.status_code == 200, created.text
    job_id = created.json()["job_id"]
    assert (await secured.client.get(status_url(job_id), headers=bearer(token))).status_code == 200
    canceled = await secured.client.post(cancel_url(job_id), headers=bearer(token))
    assert canceled.json()["status"] == "canceled"


async def test_health_and_the_schema_need_no_token(secured: Service) -> None:
    assert (await secured.client.get("/health")).status_code == 200
    schema = (await secured.client.get("/openapi.json")).json()
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_every_route_but_the_open_ones_requires_a_scope(make_settings: Any) -> None:
    """A route added without `requires(...)`, or on a router without `AuthorizedRoute`, would
    be open to anyone: this lists them."""
    app = create_app(make_settings(), run_workers=False)
    open_paths = {"/health", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
    open_paths.add(DOCS_ASSETS_URL)  # the docs pages' own files
    # the dashboard's sign-in page, and its own files (htmx, the style sheet, the icon)
    open_paths |= {"/ui/signin", "/ui/static", "/favicon.ico"}
    routes = list(every_route(app.routes))
    unprotected = [
        path
        for path, route in routes
        if path not in open_paths
        and not (
            isinstance(route, AuthorizedRoute)
            and any(isinstance(d.dependency, _Requirement) for d in route.dependencies)
        )
        # a dashboard page asks who looks first: a session, else the sign-in page
        and not (path.startswith("/ui") and _needs_a_viewer(route))
    ]
    assert unprotected == []
    assert {"/status", TRIGGER_URL} <= {path for path, _ in routes}  # the walk found them


def _needs_a_viewer(route: Any) -> bool:
    """Whether a dashboard route depends on who looks (`viewer_of`: a session, or sign in)."""
    return any(d.call is viewer_of for d in route.dependant.dependencies)


def every_route(routes: list[Any]) -> Iterator[tuple[str, Any]]:
    """(path, route) of every route, inside included routers too."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from every_route(included.routes)
        else:
            yield route.path, route


async def test_a_requirement_outside_an_authorized_route_still_refuses(
    start_service: StartService,
) -> None:
    """The dependency checks too: a route of FastAPI's own class fails closed, not open."""
    service = await start_service(run_workers=False, api_tokens=TOKENS)

    @service.app.get("/plain", dependencies=[requires(Scope.admin)])
    async def plain() -> dict[str, str]:
        return {"ok": "yes"}

    assert (await service.client.get("/plain")).status_code == 401
    assert (await service.client.get("/plain", headers=bearer(READ))).status_code == 403
    assert (await service.client.get("/plain", headers=bearer(ADMIN))).json() == {"ok": "yes"}


async def test_without_tokens_the_api_is_open_on_loopback(
    start_service: StartService,
) -> None:
    service = await start_service(run_workers=False)
    response = await service.client.post(TRIGGER_URL, json=VALID_TRIGGER)
    assert response.status_code == 200, response.text


async def test_refusals_are_logged_without_the_presented_token(
    secured: Service, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    guess = "a-wrong-guess-0123456789abcdef"
    await secured.client.get(STATUS_URL, headers=bearer(guess))
    await secured.client.post(TRIGGER_URL, json=VALID_TRIGGER, headers=bearer(READ))
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "unknown bearer token" in logged
    assert "token 'dashboard' has scope read, trigger needed" in logged
    for secret in (guess, READ, TRIGGER, ADMIN):
        assert secret not in logged


# --- request body limit ---------------------------------------------------------------------------


async def test_a_10_mb_body_is_413_and_writes_nothing(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False)
    huge = VALID_TRIGGER | {"args": {"blob": "x" * 10_000_000}}
    response = await service.client.post(TRIGGER_URL, json=huge)
    assert response.status_code == 413
    assert response.json() == {"detail": "request body larger than 1048576 bytes"}
    assert await stored_rows(conn) == (0, 0)


async def test_a_chunked_body_is_cut_off_at_the_limit(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False, http_max_body_bytes=4096)
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the limit counts chunks
        nonlocal sent
        yield b'{"queue": "q", "task": "t", "lock_key": "k", "args": {"pad": "'
        for _ in range(1000):
            sent += 1
            yield b"x" * 1024
        yield b'"}}'

    response = await service.client.post(
        TRIGGER_URL, content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert sent < 10  # refused after the first few kilobytes, not after reading 1 MB
    assert await stored_rows(conn) == (0, 0)


async def test_a_body_longer_than_its_content_length_is_still_cut_off(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """Whatever the headers claim, the bytes are counted as they are read."""
    service = await start_service(run_workers=False, http_max_body_bytes=4096)
    body = json.dumps(VALID_TRIGGER | {"args": {"pad": "x" * 100_000}}).encode()
    response = await service.client.post(
        TRIGGER_URL,
        content=body,
        headers={"content-type": "application/json", "content-length": "100"},
    )
    assert response.status_code == 413, response.text
    assert await stored_rows(conn) == (0, 0)


@pytest.mark.parametrize("declared", ["-1", "1_0", " 5", "5, 5", "abc"])
async def test_an_invalid_content_length_is_400(
    start_service: StartService, conn: asyncpg.Connection, declared: str
) -> None:
    service = await start_service(run_workers=False)
    response = await service.client.post(
        TRIGGER_URL,
        content=json.dumps(VALID_TRIGGER).encode(),
        headers={"content-type": "application/json", "content-length": declared},
    )
    assert response.status_code == 400
    assert response.json() == {"detail": "invalid Content-Length header"}
    assert await stored_rows(conn) == (0, 0)


async def test_an_unauthenticated_body_is_never_read(start_service: StartService) -> None:
    """The token is checked before the body is read: a refused request costs no memory."""
    service = await start_service(run_workers=False, api_tokens=TOKENS)
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(100):
            sent += 1
            yield b"x" * 1024

    response = await service.client.post(TRIGGER_URL, content=chunks())
    assert response.status_code == 401
    assert sent <= 1  # at most what the client pushed before the answer


async def test_a_body_within_the_limit_is_served_chunked_or_not(
    start_service: StartService,
) -> None:
    service = await start_service(run_workers=False, http_max_body_bytes=4096)
    body = VALID_TRIGGER | {"args": {"pad": "x" * 3000}}
    plain = await service.client.post(TRIGGER_URL, json=body)
    assert plain.status_code == 200, plain.text

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"queue": "q", "task": "t", '
        yield b'"lock_key": "k2", "args": {"pad": "' + b"x" * 3000 + b'"}}'

    chunked = await service.client.post(
        TRIGGER_URL, content=chunks(), headers={"content-type": "application/json"}
    )
    assert chunked.status_code == 200, chunked.text


# --- start-up rules and secrets in a real process -----------------------------------------------


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ({"DL_HTTP_HOST": "0.0.0.0"}, True),
        ({"DL_HTTP_HOST": "0.0.0.0", "DL_ALLOW_UNAUTHENTICATED": "true"}, False),
        ({"DL_HTTP_HOST": "::1"}, False),
    ],
    ids=["public-without-tokens", "public-explicitly-open", "ipv6-loopback"],
)
def test_a_public_address_without_tokens_is_refused_unless_allowed(
    tmp_path: Path, env: dict[str, str], refused: bool
) -> None:
    result = run_cli(
        [sys.executable, "-c", "from dataloader.config import load_settings; load_settings()"],
        {"DL_HTTP_PORT": str(free_port()), **env},
        cwd=tmp_path,
    )
    assert (result.returncode != 0) is refused, result.stdout
    if refused:
        assert "DL_HTTP_HOST=0.0.0.0 is reachable from other machines" in result.stdout
        cli = run_cli([sys.executable, "-m", "dataloader"], env, cwd=tmp_path)
        assert cli.returncode == 2, cli.stdout
        assert "Traceback" not in cli.stdout


async def test_no_secret_reaches_the_logs_or_the_answers(db_dsn: str, tmp_path: Path) -> None:
    password = "pw-that-must-stay-hidden"
    parts = urlsplit(db_dsn)
    host = parts.netloc.rsplit("@", 1)[-1]  # empty for a Unix socket named in the query
    # the test servers trust local users, so the password is carried along but not checked
    dsn = urlunsplit(parts._replace(netloc=f"{parts.username or 'postgres'}:{password}@{host}"))
    tokens = f'[{{"name": "etl", "scope": "admin", "token": "{ADMIN}"}}]'
    async with launched(tmp_path) as launcher:
        service = launcher.start(dsn, DL_API_TOKENS=tokens, DL_LOG_LEVEL="DEBUG")
        await service.wait_healthy()
        answers: list[Any] = []
        for headers in (bearer(ADMIN), bearer("wrong-0123456789abcdef"), {}):
            answers.append(await service.client.get(STATUS_URL, headers=headers))
            answers.append(
                await service.client.post(TRIGGER_URL, json=VALID_TRIGGER, headers=headers)
            )
        assert answers[0].status_code == 200
        service.terminate()
        assert await service.wait() == 0
        logs = service.logs()
    assert "GET /status 200" in logs
    assert "GET /status 401" in logs
    for secret in (password, ADMIN):
        assert secret not in logs
        for answer in answers:
            assert secret not in answer.text
