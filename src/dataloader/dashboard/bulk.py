"""Cancel or retry every job a filter of the jobs' list matches: the count shown first, the
change made once confirmed (`Client.cancel_many` / `retry_many`, each job fenced on its own)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from dataloader.api.parameters import CheckedRoute
from dataloader.client import MAX_BULK, Client
from dataloader.config import Scope
from dataloader.dashboard.common import (
    PREFIX,
    PageClient,
    PageViewer,
    authorize_action,
    back_to,
    render,
)
from dataloader.dashboard.jobs import FILTERS, filters_of, list_filters
from dataloader.dashboard.sessions import CSRF_FIELD

router = APIRouter(prefix=PREFIX, route_class=CheckedRoute)

#: Jobs one page of the count reads.
COUNT_PAGE = 1000
ACTIONS = ("cancel", "retry")


@dataclass(frozen=True, slots=True)
class Matching:
    """How many jobs a filter matches, counted up to MAX_BULK (`more`: there are more)."""

    filters: dict[str, str]
    count: int
    more: bool


async def matching_of(client: Client, filters: dict[str, str]) -> Matching:
    """Count the jobs matching `filters` (empty ones ignored), MAX_BULK at most."""
    given = {name: value for name, value in filters.items() if value and name in FILTERS}
    wanted = list_filters(given)
    count, cursor = 0, None
    while count < MAX_BULK:
        page = await client.list(**wanted, limit=COUNT_PAGE, cursor=cursor)
        count += len(page.jobs)
        cursor = page.next_cursor
        if cursor is None:
            return Matching(given, min(count, MAX_BULK), more=False)
    return Matching(given, MAX_BULK, more=True)


@router.get("/jobs-bulk/{action}", response_class=HTMLResponse, include_in_schema=False)
async def confirm(
    request: Request, client: PageClient, viewer: PageViewer, action: str
) -> HTMLResponse:
    """What the change would touch, to confirm."""
    if action not in ACTIONS:
        raise HTTPException(404, f"no bulk {action!r}")
    filters = {k: v for k, v in filters_of(request).items() if v}
    if not filters:
        raise HTTPException(400, "filter the jobs first: a bulk change of every job is refused")
    try:
        matching = await matching_of(client, filters)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    return render(request, viewer, "bulk.html", action=action, matching=matching)


@router.post("/jobs-bulk/{action}", include_in_schema=False)
async def change(
    request: Request,
    client: PageClient,
    viewer: PageViewer,
    action: str,
    csrf_token: Annotated[str | None, Form(alias=CSRF_FIELD)] = None,
) -> RedirectResponse:
    """Cancel or retry the jobs the filter (in the query) matches, MAX_BULK at most."""
    if action not in ACTIONS:
        raise HTTPException(404, f"no bulk {action!r}")
    authorize_action(request, viewer, csrf_token, Scope.admin)
    filters = {k: v for k, v in filters_of(request).items() if v}
    acting = client.acting_as(viewer.actor)
    bulk = acting.cancel_many if action == "cancel" else acting.retry_many
    try:
        result = await bulk(limit=MAX_BULK, **list_filters(filters))
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    done = "canceled" if action == "cancel" else "retried"
    said = f"{done} {len(result.changed)} of {result.matched} matching job(s)"
    if result.more:
        said += f"; more match beyond {MAX_BULK}: do it again"
    return back_to(f"{PREFIX}/jobs?{urlencode(filters | {'said': said})}")
