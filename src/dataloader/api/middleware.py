"""HTTP middleware: a request id on every request (taken from `X-Request-ID` or made up),
bound to the logging context and echoed in the response, and one access log line."""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dataloader.logger import log_context

log = logging.getLogger("dataloader.access")

REQUEST_ID_HEADER = "x-request-id"
#: Probed every few seconds by orchestrators: logged at DEBUG only.
QUIET_PATHS = frozenset({"/health"})
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class RequestContextMiddleware:
    """Pure ASGI middleware (no per-request task switch, unlike BaseHTTPMiddleware)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

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
                log.log(
                    logging.DEBUG if scope["path"] in QUIET_PATHS else logging.INFO,
                    "%s %s %d",
                    scope["method"],
                    scope["path"],
                    status,
                    extra={"duration_ms": round((time.perf_counter() - started) * 1000, 2)},
                )


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == REQUEST_ID_HEADER.encode():
            candidate: str = value.decode("latin-1")
            if _SAFE_ID.match(candidate):
                return candidate
    return uuid.uuid4().hex
