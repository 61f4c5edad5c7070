"""A queue: its jobs by state, its limits, pause and resume, and its audit log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from dataloader.api.parameters import CheckedRoute
from dataloader.client import Client
from dataloader.config import Scope
from dataloader.core.models import QueueStats
from dataloader.core.queues import QueueEvent
from dataloader.dashboard.common import (
    PREFIX,
    PageClient,
    PageViewer,
    authorize_action,
    back_to,
    render,
)
from dataloader.dashboard.sessions import CSRF_FIELD
from dataloader.exceptions import InvalidJob

router = APIRouter(prefix=PREFIX, route_class=CheckedRoute)
# A queue's name may hold a slash (`etl/daily`): its paths take the API's converter of names,
# `dl_any_text` (registered by `dataloader.api.v1.queues`, which the app imports first), which
# leaves the actions' suffixes (`/pause`, `/resume`, `/limits`) to the actions.

#: Entries of the audit log a queue's page shows (the newest).
AUDIT_SHOWN = 50


@dataclass(frozen=True, slots=True)
class QueueView:
    """A queue as its page shows it."""

    name: str
    stats: QueueStats | None
    #: Its audit log, newest first.
    audit: list[QueueEvent]


async def queue_view_of(client: Client, queue: str) -> QueueView:
    """The queue `queue` (its statistics are None when it holds nothing and nobody serves
    it: a queue exists as soon as it is named)."""
    stats = (await client.stats(queue)).get(queue)
    audit = await client.queue_events(queue)
    return QueueView(queue, stats, audit[::-1][:AUDIT_SHOWN])


@router.get("/queues/{queue:dl_any_text}", response_class=HTMLResponse, include_in_schema=False)
async def queue_page(
    request: Request, client: PageClient, viewer: PageViewer, queue: str
) -> HTMLResponse:
    try:
        view = await queue_view_of(client, queue)
    except (InvalidJob, ValueError) as exc:
        raise HTTPException(404, str(exc)) from None
    return render(request, viewer, "queue.html", queue=view)


@router.post("/queues/{queue:dl_any_text}/limits", response_model=None, include_in_schema=False)
async def set_limits(
    request: Request,
    client: PageClient,
    viewer: PageViewer,
    queue: str,
    max_running: Annotated[str, Form()] = "",
    max_running_per_partition: Annotated[str, Form()] = "",
    max_per_second: Annotated[str, Form()] = "",
    csrf_token: Annotated[str | None, Form(alias=CSRF_FIELD)] = None,
) -> HTMLResponse | RedirectResponse:
    """Set the queue's limits (scope admin, as in the API; an empty field: no such limit),
    then show it again; a bad value is said on the page, and nothing changes."""
    authorize_action(request, viewer, csrf_token, Scope.admin)
    given = {
        "max_running": max_running,
        "max_running_per_partition": max_running_per_partition,
        "max_per_second": max_per_second,
    }
    try:
        limits = limits_of(given)
        await client.acting_as(viewer.actor).set_limits(queue, **limits)
    except ValueError as exc:
        view = await queue_view_of(client, queue)
        page = render(request, viewer, "queue.html", queue=view, limits_error=str(exc), given=given)
        page.status_code = 400
        return page
    return back_to(f"{PREFIX}/queues/{queue}")


def limits_of(form: dict[str, str]) -> dict[str, Any]:
    """The limits a form gives (`Client.set_limits`'s arguments): an empty field is no limit;
    ValueError naming a field that is not a number."""
    limits: dict[str, Any] = {}
    for name, text in form.items():
        text = text.strip()
        if not text:
            limits[name] = None
            continue
        try:
            limits[name] = float(text) if name == "max_per_second" else int(text)
        except ValueError:
            kind = "a number" if name == "max_per_second" else "a whole number"
            raise ValueError(f"{name} must be {kind}, or empty for no limit") from None
    return limits


@router.post("/queues/{queue:dl_any_text}/{action}", include_in_schema=False)
async def act(
    request: Request,
    client: PageClient,
    viewer: PageViewer,
    queue: str,
    action: Literal["pause", "resume"],
    csrf_token: Annotated[str | None, Form(alias=CSRF_FIELD)] = None,
) -> RedirectResponse:
    """Pause or resume the queue (scope admin, as in the API), then show it again."""
    authorize_action(request, viewer, csrf_token, Scope.admin)
    acting = client.acting_as(viewer.actor)
    try:
        await (acting.pause if action == "pause" else acting.resume)(queue)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    return back_to(f"{PREFIX}/queues/{queue}")
