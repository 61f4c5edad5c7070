"""Requests that come from other sites change nothing.

A browser lets any page send "simple" requests to any address (a form it submits, a
`fetch(…, {mode: "no-cors"})`), with no body or a form or text one, and without the page
being allowed to read the answer. Without tokens (the quick start, a service behind an
authenticating proxy) such a request would still pause a queue or cancel a job. So a request
that may change something (any method but GET, HEAD, OPTIONS and TRACE) is refused when the
browser says it comes from elsewhere:

* `Sec-Fetch-Site` (sent by every current browser, and no page can set it) other than
  `same-origin` or `none`: `cross-site`, and `same-site` too (another port or subdomain of
  this host is another origin, e.g. another service on 127.0.0.1);
* else an `Origin` header whose host (and port) is not the request's own `Host`.

An `Origin` listed in `DL_HTTP_ALLOWED_ORIGINS` (a front-end of another site, deliberately
allowed) passes. A request with neither header comes from no browser (curl, httpx, the CLI,
the library) and passes. On the API, a change also takes JSON or no body: a body of another
type (a form, text) is refused with 415 after the token check (`check_json_body`), so a browser
cannot send one without a CORS preflight.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping
from typing import Final
from urllib.parse import urlsplit

from fastapi import HTTPException, Request
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)

#: Methods that change nothing (the only ones a refused site may still send).
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
#: `Sec-Fetch-Site` values of a request made by this origin's own pages, or by the viewer
#: (an address typed, a bookmark).
OWN_SITE: Final = frozenset({"same-origin", "none"})


def refusal(method: str, headers: Mapping[str, str], allowed: Collection[str]) -> str | None:
    """Why a request of `method` with `headers` (lower-case names) must be refused as coming
    from another site, or None when it may go on. `allowed`: origins as `config._origin`
    writes them (lower case, no trailing slash)."""
    if method.upper() in SAFE_METHODS:
        return None
    origin = headers.get("origin")
    if origin is not None and origin.strip().lower().rstrip("/") in allowed:
        return None
    site = headers.get("sec-fetch-site")
    if site is not None:
        if site.strip().lower() in OWN_SITE:
            # the browser itself says so: trusted even when a proxy rewrote `Host`
            return None
        return (
            f"a {site.strip().lower()} request (from {origin or 'another origin'}) may not"
            " change anything here; allow its origin with DL_HTTP_ALLOWED_ORIGINS if it is meant"
        )
    if origin is None:
        return None  # not a browser's request
    if _host_of(origin) == headers.get("host", "").strip().lower():
        return None
    return (
        f"a request from {origin} may not change anything here; allow that origin with"
        " DL_HTTP_ALLOWED_ORIGINS if it is meant"
    )


def _host_of(origin: str) -> str | None:
    """The `host[:port]` of an origin (None for `null` or something that is not one): what
    its `Host` header would be. The scheme is left out: behind a proxy that ends TLS the
    service sees http where the browser sent https."""
    try:
        parts = urlsplit(origin.strip().lower())
    except ValueError:
        return None
    return parts.netloc or None


class CrossSiteGuard:
    """Refuse, with 403 and a one-line JSON reason, every request that `refusal` names,
    before any route (the API, the dashboard, a mount) sees it."""

    def __init__(self, app: ASGIApp, allowed_origins: Collection[str]) -> None:
        self.app = app
        self.allowed = frozenset(allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        headers = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
        }
        reason = refusal(scope["method"], headers, self.allowed)
        if reason is None:
            await self.app(scope, receive, send)
            return
        log.warning("refused %s %s: %s", scope["method"], scope["path"], reason)
        body = json.dumps({"detail": reason}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def is_json(content_type: str) -> bool:
    """Whether a `Content-Type` names JSON (`application/json`, `application/…+json`)."""
    media = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def check_json_body(request: Request) -> None:
    """415 for a change (not a GET …) whose body is declared as something else than JSON: a
    form or text is what a page of another site can send without asking (a "simple"
    request); an API change takes JSON, or no body at all."""
    if request.method in SAFE_METHODS:
        return
    content_type = request.headers.get("content-type")
    if content_type is None or is_json(content_type):
        return
    raise HTTPException(
        415,
        f"a change takes a JSON body (Content-Type: application/json) or none, not"
        f" {content_type.split(';', 1)[0].strip()[:100]!r}",
    )
