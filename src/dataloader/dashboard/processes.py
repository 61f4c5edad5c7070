"""Durable processes: listed by namespace and status; a process with its state, pending
timer and paged history; call, repair and remove."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Form, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response

from dataloader.api.segments import SegmentRoute, segment
from dataloader.client import Client
from dataloader.config import Scope
from dataloader.core.limits import BIGINT_MAX
from dataloader.core.processes import Event, Process, ProcessStatus
from dataloader.dashboard.common import (
    CONFIRM_FIELD,
    PREFIX,
    PageClient,
    PageViewer,
    authorize_action,
    back_to,
    confirm_page,
    render,
)
from dataloader.dashboard.sessions import CSRF_FIELD
from dataloader.exceptions import (
    InvalidJob,
    ProcessConflict,
    ProcessNotFound,
    ProcessTaskFailed,
    ProcessTimeout,
)

#: A process's namespace and id are one percent-encoded segment each, as in the API's routes.
router = APIRouter(prefix=PREFIX, route_class=SegmentRoute)

#: Processes a page of the list shows, and events a page of a history.
PAGE_SIZE = 50
#: How long an action waits for its task's response before the page says it goes on.
ACTION_WAIT_SEC = 10.0


@dataclass(frozen=True, slots=True)
class ProcessView:
    process: Process
    #: A page of its history, oldest first, after event `after`.
    events: list[Event]
    after: int

    @property
    def next_after(self) -> int | None:
        """Where the next page of its history starts (None: this is the last)."""
        return self.events[-1].event_id if len(self.events) == PAGE_SIZE else None


async def process_view_of(
    client: Client, namespace: str, process_id: str, after: int
) -> ProcessView | None:
    process = await client.processes.get(namespace, process_id)
    if process is None:
        return None
    try:
        events = await client.processes.events(namespace, process_id, after=after, limit=PAGE_SIZE)
    except ProcessNotFound:
        return None
    return ProcessView(process, events, after)


@router.get("/processes", response_class=HTMLResponse, include_in_schema=False)
async def processes(
    request: Request,
    client: PageClient,
    viewer: PageViewer,
    namespace: str = "",
    status: str = "",
    cursor: Annotated[int | None, Query(ge=1, le=BIGINT_MAX)] = None,
) -> HTMLResponse:
    error = None
    try:
        page = await client.processes.list(
            namespace=namespace or None, status=status or None, limit=PAGE_SIZE, cursor=cursor
        )
        found, next_cursor = page.processes, page.next_cursor
    except ValueError as exc:
        found, next_cursor, error = [], None, str(exc)
    return render(
        request,
        viewer,
        "processes.html",
        found=found,
        next_cursor=next_cursor,
        namespace=namespace,
        status=status,
        statuses=[s.value for s in ProcessStatus],
        error=error,
    )


@router.get(
    "/processes/{namespace:dl_segment}/{process_id:dl_segment}",
    response_class=HTMLResponse,
    include_in_schema=False,
)
async def process_page(
    request: Request,
    client: PageClient,
    viewer: PageViewer,
    namespace: str,
    process_id: str,
    after: Annotated[int, Query(ge=0, le=BIGINT_MAX)] = 0,
    said: str = "",
) -> HTMLResponse:
    view = await process_view_of(client, namespace, process_id, after)
    if view is None:
        raise HTTPException(404, f"no live process {process_id!r} of namespace {namespace!r}")
    return render(request, viewer, "process.html", view=view, said=said)


def _args(text: str) -> Any:
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise HTTPException(400, f"args: not JSON ({exc})") from None


@router.post(
    "/process-actions/{action}/{namespace:dl_segment}/{process_id:dl_segment}",
    include_in_schema=False,
)
async def act(
    request: Request,
    client: PageClient,
    viewer: PageViewer,
    action: str,
    namespace: str,
    process_id: str,
    args: Annotated[str, Form()] = "",
    csrf_token: Annotated[str | None, Form(alias=CSRF_FIELD)] = None,
    confirmed: Annotated[str, Form(alias=CONFIRM_FIELD)] = "",
) -> Response:
    """Call, repair (its scope: admin, as in the API) or remove a process; the page then says
    what came of it. A removal not yet confirmed asks first, and removes nothing."""
    needed = {"call": Scope.trigger, "repair": Scope.admin, "remove": Scope.admin}.get(action)
    if needed is None:
        raise HTTPException(404, f"no action {action!r}")
    authorize_action(request, viewer, csrf_token, needed)
    page = f"{PREFIX}/processes/{segment(namespace)}/{segment(process_id)}"
    if action == "remove" and confirmed != "yes":
        return confirm_page(
            request,
            viewer,
            title=f"Remove process {process_id}",
            question=f"Remove the process {process_id!r} of namespace {namespace!r}? Its state,"
            " its pending timer and its history are deleted; this cannot be undone.",
            action=f"{PREFIX}/process-actions/remove/{segment(namespace)}/{segment(process_id)}",
            button="Yes, remove it",
            back=page,
        )
    acting = client.acting_as(viewer.actor).processes
    try:
        if action == "remove":
            await acting.remove(namespace, process_id, timeout=ACTION_WAIT_SEC)
            return back_to(f"{PREFIX}/processes?namespace={_quote(namespace)}")
        ask = acting.call if action == "call" else acting.repair
        response = await ask(namespace, process_id, _args(args), timeout=ACTION_WAIT_SEC)
        said = f"{action}: {json.dumps(response, default=str)}"
    except ProcessNotFound:
        raise HTTPException(404, f"no live process {process_id!r}") from None
    except (ProcessConflict, ProcessTaskFailed, InvalidJob) as exc:
        said = f"{action} refused or failed: {exc}"
    except ProcessTimeout as exc:
        said = f"{action}: no response within {ACTION_WAIT_SEC:g}s; its task {exc.task_id} goes on"
    return back_to(f"{page}?said={_quote(said)}")


def _quote(text: str) -> str:
    """`text` (its first 500 characters) as a query parameter's value."""
    return quote(text[:500], safe="")
