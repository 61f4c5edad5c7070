"""Jobs: a filtered, paged list; a job with its facts, args, result and journal; cancel and
retry."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Form, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from dataloader import JobPage
from dataloader.api.parameters import CheckedRoute
from dataloader.base import JobStatus
from dataloader.client import Client
from dataloader.config import Scope
from dataloader.core.models import JobEvent, JobState, stage_parent
from dataloader.core.waiting import Reason, ServingProcess, why_not_running
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
from dataloader.exceptions import JobNotFound, NotRetryable

router = APIRouter(prefix=PREFIX, route_class=CheckedRoute)

#: Jobs a page of the list shows.
PAGE_SIZE = 50
#: Running jobs read to say which hold a queued job back (a queue's, a partition's), at most.
RUNNING_READ = 1000
#: A job's stages its page lists, at most.
STAGES_SHOWN = 50
#: The filters of the list, as its query parameters.
FILTERS = (
    "queue",
    "status",
    "task",
    "lock_key",
    "partition_key",
    "args",
    "created_from",
    "created_until",
)
#: Filters holding an instant: a date and time, UTC unless it has an offset.
INSTANT_FILTERS = ("created_from", "created_until")


#: Pages of the list the way back to newer ones remembers (`Paging`); from further on, newer
#: pages are reached from the first.
BACK_PAGES = 50


@dataclass(frozen=True, slots=True)
class JobList:
    """A page of jobs and the filters that chose it."""

    filters: dict[str, str]
    page: JobPage
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Paging:
    """The links from a page of the list to the others (None: no such page). Pages follow
    each other by keyset (`Client.list`'s cursor), newest first; the way back is the cursors
    of the pages before this one, carried along in the link (`back`, BACK_PAGES at most),
    so that "newer" shows the page shown before, whatever was enqueued since."""

    newer: str | None
    older: str | None
    first: str | None


def paging_of(filters: dict[str, str], cursor: str, back: str, next_cursor: str | None) -> Paging:
    """The links of the page at `cursor` ("" the first) of the list of `filters`, reached
    through the pages whose cursors `back` lists (oldest first, separated by dots), followed
    by the page at `next_cursor` (None: this is the last)."""
    stack = [c for c in back.split(".") if c][-BACK_PAGES:] if cursor else []

    def link(at: str, behind: list[str]) -> str:
        query = dict(filters)
        if at:
            query["cursor"] = at
        if behind:
            query["back"] = ".".join(behind[-BACK_PAGES:])
        return f"{PREFIX}/jobs" + (f"?{urlencode(query)}" if query else "")

    older = None if next_cursor is None else link(next_cursor, [*stack, cursor] if cursor else [])
    newer = None if not cursor else link(stack[-1] if stack else "", stack[:-1])
    return Paging(newer=newer, older=older, first=link("", []) if cursor else None)


def list_filters(filters: dict[str, str]) -> dict[str, Any]:
    """The filters given (not empty), as `Client.list` takes them: instants parsed (UTC
    unless they say otherwise); ValueError naming one that is not an instant."""
    given: dict[str, Any] = {name: value for name, value in filters.items() if value}
    for name in INSTANT_FILTERS:
        if name in given:
            given[name] = instant_of(name, given[name])
    return given


def instant_of(name: str, text: str) -> datetime:
    """`text` (ISO 8601, as a browser's date and time field gives it) as an instant, in UTC
    when it has no offset."""
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{name}: not a date and time like 2026-01-31T09:30") from None
    return instant if instant.tzinfo is not None else instant.replace(tzinfo=UTC)


def field_value(name: str, value: str) -> str:
    """What the list's form shows in the field of the filter `name` given `value`: an instant
    in UTC, as a date and time field holds it (it holds no offset: `2026-01-01T12:00+02:00`
    is shown `2026-01-01T10:00:00`, the same instant, so that filtering again keeps it);
    anything else as given."""
    if name not in INSTANT_FILTERS or not value:
        return value
    try:
        instant = instant_of(name, value).astimezone(UTC)
    except ValueError:
        return value
    # a date and time field takes milliseconds at most
    shown = instant.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{shown}.{instant.microsecond // 1000:03d}" if instant.microsecond else shown


async def job_list_of(client: Client, filters: dict[str, str], cursor: str | None) -> JobList:
    """The page of jobs matching `filters` (empty ones ignored) after `cursor`; a filter that
    cannot be (an unknown status, args that are not a JSON object, a foreign cursor) is
    said, with no job."""
    given = {name: value for name, value in filters.items() if value}
    try:
        page = await client.list(**list_filters(given), limit=PAGE_SIZE, cursor=cursor or None)
    except ValueError as exc:
        return JobList(given, JobPage([], None), str(exc))
    return JobList(given, page)


#: Journal entries that end an attempt (`picked` starts one).
ATTEMPT_ENDS = frozenset({"done", "failed", "requeue", "lost", "canceled", "backoff", "rerun"})


@dataclass(slots=True)
class Attempt:
    """One run of a job, as its journal tells it: from `picked` to the entry that ended it
    (none yet: it is running)."""

    number: int | None
    worker: str | None
    started: datetime
    ended: datetime | None = None
    #: The kind of the entry that ended it (`done`, `requeue`, `failed` …).
    outcome: str | None = None
    error: str | None = None
    traceback: str | None = None


def attempts_of(journal: list[JobEvent]) -> list[Attempt]:
    """The job's attempts, oldest first, from its journal (oldest first)."""
    attempts: list[Attempt] = []
    for event in journal:
        payload = event.payload if isinstance(event.payload, dict) else {}
        if event.kind == "picked":
            attempts.append(Attempt(payload.get("attempt"), payload.get("worker"), event.ts))
        elif event.kind in ATTEMPT_ENDS and attempts and attempts[-1].outcome is None:
            last = attempts[-1]
            last.ended, last.outcome = event.ts, event.kind
            last.error, last.traceback = payload.get("error"), payload.get("traceback")
    return attempts


@dataclass(frozen=True, slots=True)
class JobView:
    """A job with all the dashboard shows of it."""

    state: JobState
    args: Any
    partition_key: str | None
    #: Its journal, oldest first, heartbeats folded into a count.
    events: list[JobEvent]
    heartbeats: int
    #: Why it is not running (a queued job only).
    waiting: list[Reason] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    #: The job whose success enqueued this one as its stage, if any.
    parent: uuid.UUID | None = None
    #: The jobs this one's successes enqueued as its stages (STAGES_SHOWN at most).
    stages: list[JobState] = field(default_factory=list)

    @property
    def cancellable(self) -> bool:
        return not self.state.finished and not self.state.cancel_requested

    @property
    def retryable(self) -> bool:
        return self.state.status in (JobStatus.FAILED, JobStatus.LOST, JobStatus.CANCELED)


async def job_view_of(client: Client, job_id: uuid.UUID) -> JobView | None:
    state = await client.get(job_id)
    if state is None:
        return None
    args, partition_key = await client.args(job_id)
    journal = await client.events(job_id)
    events = [e for e in journal if e.kind != "heartbeat"]
    waiting = await why_waiting(client, state, partition_key)
    return JobView(
        state,
        args,
        partition_key,
        events,
        heartbeats=len(journal) - len(events),
        waiting=waiting,
        attempts=attempts_of(events),
        parent=stage_parent(state.idempotency_key),
        stages=await client.stages(job_id, limit=STAGES_SHOWN),
    )


async def why_waiting(client: Client, job: JobState, partition_key: str | None) -> list[Reason]:
    """Why the queued `job` is not running, from what the client reads now."""
    if job.status is not JobStatus.QUEUED:
        return []
    queue = (await client.stats(job.queue)).get(job.queue)
    holder = None
    if job.lock_key is not None:  # a lock_free job waits for no other
        running = await client.list(lock_key=job.lock_key, status=JobStatus.RUNNING, limit=1)
        holder = running.jobs[0] if running.jobs else None
    workers = await client.workers()
    per_partition = None if queue is None else queue.limits.max_running_per_partition
    partition_running = None
    if partition_key is not None and per_partition is not None:
        page = await client.list(
            queue=job.queue,
            partition_key=partition_key,
            status=JobStatus.RUNNING,
            limit=min(per_partition, RUNNING_READ),
        )
        partition_running = page.jobs
    # running jobs are few (the processes' slots): one page names those in the way
    in_queue = []
    if queue is not None and queue.running:
        in_queue = (
            await client.list(queue=job.queue, status=JobStatus.RUNNING, limit=RUNNING_READ)
        ).jobs
    return why_not_running(
        job,
        now=datetime.now(UTC),
        queue=queue,
        holder=holder,
        served_queues={queue for w in workers for queue in w.queues},
        known_tasks={task for w in workers for task in w.tasks},
        partition_running=partition_running,
        running=in_queue,
        serving=[
            ServingProcess(w.worker_id, f"{w.host} pid {w.pid}", w.queues[job.queue])
            for w in workers
            if job.queue in w.queues
        ],
    )


def filters_of(request: Request) -> dict[str, str]:
    """The list's filters as the query gives them (`FILTERS`; absent ones empty)."""
    return {name: request.query_params.get(name, "") for name in FILTERS}


@router.get("/jobs", response_class=HTMLResponse, include_in_schema=False)
async def jobs(
    request: Request,
    client: PageClient,
    viewer: PageViewer,
    cursor: Annotated[str, Query()] = "",
    back: Annotated[str, Query()] = "",
) -> HTMLResponse:
    """Jobs filtered by the query's `FILTERS`, newest first, a page after `cursor` (reached
    through the pages of `back`: see `paging_of`)."""
    filters = filters_of(request)
    listed = await job_list_of(client, filters, cursor)
    return render(
        request,
        viewer,
        "jobs.html",
        listed=listed,
        paging=paging_of(listed.filters, cursor, back, listed.page.next_cursor),
        statuses=[s.value for s in JobStatus],
        field_value=field_value,
    )


@router.get("/jobs/find", include_in_schema=False)
async def find(client: PageClient, viewer: PageViewer, q: str = "") -> RedirectResponse:
    """A job by its id or idempotency key."""
    wanted = q.strip()
    job_id: uuid.UUID | None
    try:
        job_id = uuid.UUID(wanted)
    except ValueError:
        found = await client.find(wanted) if wanted else None
        job_id = found.job_id if found is not None else None
    if job_id is None:
        return back_to(f"{PREFIX}/jobs?missing=1")
    return back_to(f"{PREFIX}/jobs/{job_id}")


@router.get("/jobs/{job_id}", response_class=HTMLResponse, include_in_schema=False)
async def job(
    request: Request, client: PageClient, viewer: PageViewer, job_id: str
) -> HTMLResponse:
    try:
        view = await job_view_of(client, uuid.UUID(job_id))
    except ValueError:
        view = None
    if view is None:
        raise HTTPException(404, f"no job {job_id}")
    return render(request, viewer, "job.html", job=view)


@router.post("/jobs/{job_id}/{action}", include_in_schema=False)
async def act(
    request: Request,
    client: PageClient,
    viewer: PageViewer,
    job_id: uuid.UUID,
    action: Literal["cancel", "retry"],
    csrf_token: Annotated[str | None, Form(alias=CSRF_FIELD)] = None,
    confirmed: Annotated[str, Form(alias=CONFIRM_FIELD)] = "",
) -> Response:
    """Cancel or retry the job (scope trigger, as in the API), then show it again. A cancel
    not yet confirmed asks first, and changes nothing."""
    authorize_action(request, viewer, csrf_token, Scope.trigger)
    if action == "cancel" and confirmed != "yes":
        return confirm_page(
            request,
            viewer,
            title=f"Cancel job {job_id}",
            question=f"Cancel the job {job_id}? A queued job ends canceled; a running one is"
            " asked to stop, and ends canceled once it does.",
            action=f"{PREFIX}/jobs/{job_id}/cancel",
            button="Yes, cancel it",
            back=f"{PREFIX}/jobs/{job_id}",
        )
    acting = client.acting_as(viewer.actor)
    try:
        await (acting.cancel if action == "cancel" else acting.retry)(job_id)
    except JobNotFound:
        raise HTTPException(404, f"no job {job_id}") from None
    except NotRetryable as exc:
        raise HTTPException(409, str(exc)) from None
    return back_to(f"{PREFIX}/jobs/{job_id}")
