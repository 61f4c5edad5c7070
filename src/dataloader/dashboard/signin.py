"""Signing in with an API token, and out."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from dataloader.api.parameters import CheckedRoute
from dataloader.dashboard.common import (
    PREFIX,
    PageViewer,
    back_to,
    pages_of,
    safe_next,
    set_session,
    templates,
)
from dataloader.dashboard.sessions import COOKIE, CSRF_FIELD

router = APIRouter(prefix=PREFIX, route_class=CheckedRoute)


def _safe_next(path: str) -> str:
    """Where to go after signing in: the page of the dashboard asked for, with its query (no
    open redirect: anything else is the overview)."""
    return safe_next(path) or PREFIX


@router.get("/signin", response_class=HTMLResponse, include_in_schema=False)
async def signin_page(request: Request, next: str = PREFIX) -> HTMLResponse:
    return templates.TemplateResponse(
        request, "signin.html", {"prefix": PREFIX, "next": _safe_next(next), "failed": False}
    )


@router.post("/signin", include_in_schema=False, response_model=None)
async def signin(
    request: Request, token: Annotated[str, Form()], next: Annotated[str, Form()] = PREFIX
) -> Response:
    value = pages_of(request).sessions.sign_in(token)
    if value is None:
        return templates.TemplateResponse(
            request,
            "signin.html",
            {"prefix": PREFIX, "next": _safe_next(next), "failed": True},
            status_code=401,
        )
    return set_session(back_to(_safe_next(next)), value, request)


@router.post("/signout", include_in_schema=False)
async def signout(
    request: Request,
    viewer: PageViewer,
    csrf_token: Annotated[str | None, Form(alias=CSRF_FIELD)] = None,
) -> RedirectResponse:
    pages_of(request).sessions.check_action(viewer, csrf_token)
    response = back_to(f"{PREFIX}/signin")
    response.delete_cookie(COOKIE, path=PREFIX)
    return response
