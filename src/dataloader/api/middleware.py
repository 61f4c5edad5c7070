"""HTTP middleware: a request id on every request (taken from `X-Request-ID` or made up),
bound to the logging context and echoed in the response, and an access log line, counted in
the periodic summary of requests; a bound on the size of request bodies; and where an answer's
lists and counts were read when they may be stale (`X-Dataloader-Read-From`)."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Literal

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dataloader.core.staleness import observing_reads
from dataloader.logger import log_context
from dataloader.logger.summary import Summary

log = logging.getLogger("dataloader.access")

REQUEST_ID_HEADER = "x-request-id"
#: Probed every few seconds by orchestrators: logged at DEBUG only.
QUIET_PATHS = frozenset({"/health"})
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class RequestContextMiddleware:
    """Pure ASGI middleware (no per-request task switch, unlike BaseHTTPMiddleware).

    Each request is counted in `summary` by route and status. Its own line is at INFO when
    it was refused or failed (status 400 and above) or `log_every_request` is set, at DEBUG
    otherwise: a line per request took 13 % of the service's CPU at 2,000 triggers a second."""

    def __init__(self, app: ASGIApp, summary: Summary, log_every_request: bool = False) -> None:
        self.app = app
        self.summary = summary
        self.log_every_request = log_every_request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _request_id(scope)
        status = 500
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((REQUEST_ID_HEADER.encode(), request_id.encode()))
                message["headers"] = headers
            await send(message)

        with log_context(request_id=request_id):
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                self._record(scope, status, started)

    def _record(self, scope: Scope, status: int, started: float) -> None:
        path = scope["path"]
        if path in QUIET_PATHS:
            level = logging.DEBUG
        else:
            route = scope.get("route")
            self.summary.count(
                f"{scope['method']} {getattr(route, 'path', 'unrouted')}", str(status)
            )
            level = logging.INFO if status >= 400 or self.log_every_request else logging.DEBUG
        if log.isEnabledFor(level):
            duration_ms = round((time.perf_counter() - started) * 1000, 2)
            log.log(
                level, "%s %s %d", scope["method"], path, status, extra={"duration_ms": duration_ms}
            )


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == REQUEST_ID_HEADER.encode():
            candidate: str = value.decode("latin-1")
            if _SAFE_ID.match(candidate):
                return candidate
    return uuid.uuid4().hex


class BodyLimitMiddleware:
    """Refuse request bodies larger than `max_bytes` with 413. A declared `Content-Length`
    above the limit is refused before anything is read; otherwise the body is counted as the
    route reads it (whatever the headers claimed, chunked or not), and reading stops at the
    chunk that passes the limit. Nothing is buffered here: a request refused before its body
    is read (e.g. without a valid token) never has it read at all."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared == "invalid":
            await _answer(send, 400, "invalid Content-Length header")
            return
        if declared is not None and declared > self.max_bytes:
            await _answer(send, 413, self._too_large)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # FastAPI lets an HTTPException raised while reading the body through
                    raise HTTPException(413, self._too_large)
            return message

        await self.app(scope, counted, send)

    @property
    def _too_large(self) -> str:
        return f"request body larger than {self.max_bytes} bytes"


def _declared_length(scope: Scope) -> int | Literal["invalid"] | None:
    """The Content-Length header: None when absent, "invalid" unless exactly one run of
    digits (servers usually refuse the others before us; in-process clients do not)."""
    values = [value for name, value in scope.get("headers", []) if name == b"content-length"]
    if not values:
        return None
    if len(values) > 1 or not values[0].isdigit():
        return "invalid"
    return int(values[0])


async def _answer(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


#: Says where an answer's lists and counts were read, when they may be stale: `replica;
#: lag=0.412s`, or `primary; fallback=lagging|unavailable|error` (DL_DB_READ_DSN set, the
#: replica not used this time). Absent from answers that read nothing that may be stale.
READ_FROM_HEADER = "x-dataloader-read-from"


class ReadFreshnessMiddleware:
    """Observe where each request's reads that may be stale were served
    (`core.staleness.observing_reads`: the routes and pages see it too) and say it in
    READ_FROM_HEADER. Pure ASGI: the route runs in this context, so what it reads is seen
    here when its answer starts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with observing_reads() as seen:

            async def send_marked(message: Message) -> None:
                if message["type"] == "http.response.start":
                    freshness = seen.freshness
                    if freshness is not None:
                        headers = list(message.get("headers", []))
                        headers.append((READ_FROM_HEADER.encode(), freshness.header().encode()))
                        message["headers"] = headers
                await send(message)

            await self.app(scope, receive, send_marked)
