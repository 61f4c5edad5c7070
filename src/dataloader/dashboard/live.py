"""Live views: a job's status and progress pushed to every viewer of it (Server-Sent Events).

One `JobWatch` per process serves every viewer: while anyone watches, it reads every watched
job in one statement a second (progress is not announced), and at once when one of them ends
(the client's one LISTEN connection hears it: `Client.ends_of`), and hands each viewer the
states that changed. So viewers cost the database one read a second whatever their number,
not one each. A browser tab that is hidden
closes its stream (static/dashboard.js) and opens it again when shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Final

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import StreamingResponse

from dataloader.api.parameters import CheckedRoute
from dataloader.client import Client
from dataloader.core import display
from dataloader.core.models import JobState
from dataloader.dashboard.common import (
    PREFIX,
    PageViewer,
    pages_of,
    pretty_json,
    render_queue_facts,
    render_system,
)
from dataloader.health import SystemStatus

log = logging.getLogger(__name__)
router = APIRouter(prefix=PREFIX, route_class=CheckedRoute)

#: How often the watched jobs are read.
READ_EVERY_SEC: Final = 1.0
#: How often the overview is read while anyone watches it.
SYSTEM_EVERY_SEC: Final = 2.0
#: A comment line sent this often keeps proxies from closing a quiet stream.
KEEPALIVE_SEC: Final = 15.0


class JobWatch:
    """Every viewer's live job views, fed by one reader."""

    def __init__(self, client: Callable[[], Client]) -> None:
        self._client = client
        self._viewers: dict[uuid.UUID, set[asyncio.Queue[JobState]]] = {}
        self._last: dict[uuid.UUID, JobState] = {}
        self._reader: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    @contextlib.asynccontextmanager
    async def watch(self, job_id: uuid.UUID) -> AsyncIterator[asyncio.Queue[JobState]]:
        """The states of `job_id` as they change, starting with its state now."""
        updates: asyncio.Queue[JobState] = asyncio.Queue(maxsize=16)
        self._viewers.setdefault(job_id, set()).add(updates)
        known = self._last.get(job_id)
        if known is not None:
            updates.put_nowait(known)
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read(), name="dataloader-dashboard-live")
        self._wake.set()
        try:
            async with self._client().ends_of(job_id) as ended:
                waker = asyncio.create_task(self._wake_on(ended), name="dataloader-dashboard-end")
                try:
                    yield updates
                finally:
                    waker.cancel()
        finally:
            viewers = self._viewers.get(job_id)
            if viewers is not None:
                viewers.discard(updates)
                if not viewers:
                    del self._viewers[job_id]
                    self._last.pop(job_id, None)

    async def _wake_on(self, ended: asyncio.Event) -> None:
        """Read at once each time a watched job may have ended."""
        while True:
            await ended.wait()
            ended.clear()
            self._wake.set()

    async def _read(self) -> None:
        """Read the watched jobs while anyone watches; a failed read is retried (and logged)."""
        while self._viewers:
            self._wake.clear()
            try:
                states = await self._client().get_many(list(self._viewers))
            except Exception as exc:  # the database may be away: the viewers wait
                log.warning("reading the dashboard's watched jobs failed: %r", exc)
                states = {}
            for job_id, state in states.items():
                if self._last.get(job_id) != state:
                    self._last[job_id] = state
                    for updates in self._viewers.get(job_id, ()):
                        if updates.full():  # a slow viewer gets the latest state only
                            updates.get_nowait()
                        updates.put_nowait(state)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), READ_EVERY_SEC)


#: Renders a view of the whole system (a fragment of HTML, the same for every viewer).
Render = Callable[[SystemStatus], str]


class SystemWatch:
    """Every viewer's live views of the system (the overview's queues and warnings, a queue's
    facts), fed by one reader: while anyone watches, the whole system's status
    (`Client.status`: an index range per queue, whatever the jobs' number) is read every
    SYSTEM_EVERY_SEC; each view is rendered once for all its viewers and handed to them when
    it changed."""

    def __init__(self, client: Callable[[], Client]) -> None:
        self._client = client
        #: Each view watched, by its key: how it renders, and its viewers.
        self._views: dict[str, tuple[Render, set[asyncio.Queue[str]]]] = {}
        self._last: dict[str, str] = {}
        self._reader: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def watch(self, key: str, render: Render) -> AsyncIterator[asyncio.Queue[str]]:
        """The view `key` (rendered by `render`) each time it changes."""
        updates: asyncio.Queue[str] = asyncio.Queue(maxsize=4)
        self._views.setdefault(key, (render, set()))[1].add(updates)
        if key in self._last:
            updates.put_nowait(self._last[key])
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read(), name="dataloader-dashboard-system")
        try:
            yield updates
        finally:
            viewers = self._views[key][1]
            viewers.discard(updates)
            if not viewers:
                del self._views[key]
                self._last.pop(key, None)

    async def _read(self) -> None:
        while self._views:
            try:
                status: SystemStatus | None = await self._client().status()
            except Exception as exc:  # the database may be away: the viewers wait
                log.warning("reading the dashboard's system status failed: %r", exc)
                status = None
            for key, (render, viewers) in list(self._views.items()):
                if status is None:
                    break
                try:
                    html = render(status)
                except Exception:  # a bug of one view: the others still go on
                    log.exception("rendering the dashboard's view %r failed", key)
                    continue
                if html != self._last.get(key):
                    self._last[key] = html
                    for updates in list(viewers):
                        if updates.full():
                            updates.get_nowait()
                        updates.put_nowait(html)
            await asyncio.sleep(SYSTEM_EVERY_SEC)


def watch_of(request: Request) -> JobWatch:
    watch: JobWatch = request.app.state.dashboard_live
    return watch


def event_of(state: JobState) -> str:
    """One Server-Sent Event: what a job's page shows live."""
    progress = state.progress or {}
    data = {
        "status": state.status.value,
        "finished": state.finished,
        "cancel_requested": state.cancel_requested,
        "attempt": state.attempt,
        "done": progress.get("done"),
        "total": progress.get("total"),
        "progress": progress,
        # as the page formats it (masked, its controls escaped), so that the two agree
        "progress_text": display.visible(pretty_json(progress)),
        "has_progress": bool(progress),
    }
    return sse("state", json.dumps(data, default=str))


def sse(event: str, data: str) -> str:
    """One Server-Sent Event named `event` carrying `data` (one `data:` line per line)."""
    lines = "".join(f"data: {line}\n" for line in data.splitlines() or [""])
    return f"event: {event}\n{lines}\n"


@router.get("/live/system", include_in_schema=False)
async def live_system(request: Request, viewer: PageViewer) -> StreamingResponse:
    """The overview's warnings and queues as they change (text/event-stream)."""
    return _system_view(request, "overview", render_system)


@router.get("/live/queues/{queue:dl_any_text}", include_in_schema=False)
async def live_queue(request: Request, viewer: PageViewer, queue: str) -> StreamingResponse:
    """A queue's facts as they change (text/event-stream)."""
    return _system_view(request, f"queue:{queue}", functools.partial(render_queue_facts, queue))


def _system_view(request: Request, key: str, render: Render) -> StreamingResponse:
    """The view `key` of the system (as `render` draws it) each time it changes."""
    watch: SystemWatch = request.app.state.dashboard_system

    async def stream() -> AsyncIterator[str]:
        async with watch.watch(key, render) as updates:
            while True:
                try:
                    html = await asyncio.wait_for(updates.get(), KEEPALIVE_SEC)
                except TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                yield sse("system", html)

    return _streaming(stream())


@router.get("/jobs/{job_id}/live", include_in_schema=False)
async def live_job(request: Request, viewer: PageViewer, job_id: uuid.UUID) -> StreamingResponse:
    """The job's status and progress as they change, until it ends (text/event-stream)."""
    client = pages_of(request).client()
    if await client.get(job_id) is None:
        raise HTTPException(404, f"no job {job_id}")
    watch = watch_of(request)

    async def stream() -> AsyncIterator[str]:
        async with watch.watch(job_id) as updates:
            while True:
                try:
                    state = await asyncio.wait_for(updates.get(), KEEPALIVE_SEC)
                except TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                yield event_of(state)
                if state.finished:
                    return

    return _streaming(stream())


def _streaming(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
