"""The web dashboard, at /ui: queues, jobs and the whole system in a browser, served by the
service itself (no other process, no build step, no asset from elsewhere).

A router built from a `Client`: every page reads through the client's typed reads and acts
through its changes, as the API and the CLI do; this package holds no SQL and does not reach
into the worker manager (`tests/unit/test_layers.py`). One module per page; templates (Jinja2,
autoescaped) and static files (htmx, vendored with its licence) are package data.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from dataloader.api.auth import Authenticator
from dataloader.api.parameters import CheckedRoute
from dataloader.client import Client
from dataloader.dashboard import bulk, jobs, live, overview, processes, queues, signin, system
from dataloader.dashboard.common import (
    HERE,
    PREFIX,
    NewSession,
    Pages,
    SignInRequired,
    error_page,
    page_of,
    pages_of,
    set_session,
)
from dataloader.dashboard.sessions import Sessions, StaleSession

__all__ = ["PREFIX", "install_dashboard"]


def install_dashboard(
    app: FastAPI,
    client: Callable[[], Client],
    authenticator: Authenticator,
    secret: Callable[[], bytes],
) -> None:
    """Serve the dashboard on `app` at /ui, reading through `client()` (the service's
    client, once it is open), signing in with `authenticator`'s tokens, signing sessions
    with a key derived from `secret()` (the deployment's, the same for every replica)."""
    app.state.dashboard = Pages(client, Sessions(authenticator, secret))
    app.state.dashboard_live = live.JobWatch(client)
    app.state.dashboard_system = live.SystemWatch(client)
    for page in (
        overview.router,
        jobs.router,
        bulk.router,
        live.router,
        queues.router,
        processes.router,
        system.router,
        signin.router,
    ):
        app.include_router(page)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=HERE / "static"), name="dashboard-static")
    app.router.add_api_route(
        "/favicon.ico", _favicon, include_in_schema=False, route_class_override=CheckedRoute
    )
    app.add_exception_handler(SignInRequired, _to_sign_in)  # type: ignore[arg-type]
    app.add_exception_handler(NewSession, _new_session)
    app.add_exception_handler(StaleSession, _stale_session)  # type: ignore[arg-type]
    _pages_show_errors(app)


async def _favicon() -> FileResponse:
    """The icon, where a browser asks for one before it reads a page (or on a page that names
    none, as the API's documentation): the pages name it in their heads too."""
    return FileResponse(
        HERE / "static" / "favicon.svg",
        media_type="image/svg+xml",
        headers={"Cache-Control": "public, max-age=86400"},
    )


def _pages_show_errors(app: FastAPI) -> None:
    """An error on a page (a missing job, a refused action, a bad parameter) is a page saying
    so; elsewhere (the API) the handlers already installed answer, as before."""
    for error in (HTTPException, RequestValidationError):
        app.add_exception_handler(error, _error_on_pages(app.exception_handlers[error]))


def _error_on_pages(elsewhere: Callable[..., Any]) -> Callable[..., Awaitable[Response]]:
    async def handle(request: Request, exc: Exception) -> Response:
        path = request.url.path
        if path != PREFIX and not path.startswith(f"{PREFIX}/"):
            answer: Response = await elsewhere(request, exc)
            return answer
        if isinstance(exc, HTTPException):
            return error_page(request, exc.status_code, str(exc.detail))
        assert isinstance(exc, RequestValidationError)
        said = "; ".join(f"{e['loc'][-1]}: {e['msg']}" for e in exc.errors())
        return error_page(request, 400, said)

    return handle


async def _to_sign_in(request: Request, exc: SignInRequired) -> Response:
    return RedirectResponse(f"{PREFIX}/signin?{urlencode({'next': exc.path})}", status_code=303)


async def _new_session(request: Request, exc: Exception) -> Response:
    """Without authentication: a session for CSRF, then the page again (a GET). An action
    without a session is refused (its CSRF token cannot be right): a page says so, with the
    new session, so that reloading the page the action came from is all it takes."""
    value = pages_of(request).sessions.anonymous()
    if request.method != "GET":
        return set_session(_refused(request, STALE_SESSION), value, request)
    return set_session(RedirectResponse(str(request.url), status_code=303), value, request)


async def _stale_session(request: Request, exc: StaleSession) -> Response:
    return _refused(request, exc.message)


#: What a viewer is told of an action its session cannot vouch for.
STALE_SESSION = (
    "Your session is new (it had ended, or this browser had none): nothing was changed."
    " Reload the page and try again."
)


def _refused(request: Request, message: str) -> Response:
    """An action refused for its session: the error page (403), linking back to the page
    the action was made from, to reload it."""
    return error_page(request, 403, message, again=page_of(request))
