"""API v1 routes (spec §5)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import StreamingResponse
from starlette.convertors import StringConvertor, register_url_convertor

from dataloader.api.auth import AUTH_ERRORS, Actor, AuthorizedRoute, request_actor, requires
from dataloader.api.deps import from_state
from dataloader.api.v1.schemas import (
    UNPARSABLE_BODY,
    ErrorResponse,
    IdempotencyConflictResponse,
    JobBulkRequest,
    JobBulkResponse,
    JobEventsResponse,
    JobListQuery,
    JobListResponse,
    JobStatusResponse,
    TriggerRequest,
    TriggerResponse,
)
from dataloader.api.v1.service import JobsService
from dataloader.config import Scope

#: The routes beside `/{job_id}` whose last segment is a word, not a job's id.
ACTIONS = ("trigger", "cancel", "retry")


class JobIdConvertor(StringConvertor):
    """A path segment that may be a job's id: anything but the actions beside it, so that
    `GET /api/v1/jobs/cancel` is refused with 405 (the route takes POST), not read as a
    malformed id; an id that is no UUID still reaches the route and gets its 422."""

    regex = f"(?!(?:{'|'.join(ACTIONS)})$)[^/]+"


register_url_convertor("job_id", JobIdConvertor())

router = APIRouter(
    prefix="/api/v1/jobs", tags=["jobs"], responses=AUTH_ERRORS, route_class=AuthorizedRoute
)


Service = Annotated[JobsService, Depends(from_state("jobs_service"))]


def jobs_service(request: Request) -> JobsService:
    """The service, as `Service` gives it, read off the request. The hottest routes (the
    trigger, a job's status) take no dependency they can do without: FastAPI solves each one
    through its general machinery, about 2 % of the service's CPU per dependency on the
    trigger's path."""
    service: JobsService = request.app.state.jobs_service
    return service


NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "No job with this id"}
}


@router.post(
    "/trigger",
    response_model=TriggerResponse,
    responses={
        **UNPARSABLE_BODY,
        409: {
            "model": IdempotencyConflictResponse,
            "description": "The idempotency_key already names a job with other fields",
        },
    },
    operation_id="trigger_job",
    dependencies=[requires(Scope.trigger)],
)
async def trigger(body: TriggerRequest, request: Request) -> TriggerResponse:
    """Enqueue a job. The same `idempotency_key` with the same fields returns the same job
    (`created: false`); with other fields it is a 409 naming the job and the fields. The
    journal's `queued` entry names the caller (`by`: `token:<name>`, or `api`)."""
    return await jobs_service(request).trigger(body, request_actor(request))


@router.get(
    "",
    response_model=JobListResponse,
    operation_id="list_jobs",
    dependencies=[requires(Scope.read)],
)
async def list_jobs(query: Annotated[JobListQuery, Query()], service: Service) -> JobListResponse:
    """Jobs newest first, filtered by every parameter given, a page at a time (`next_cursor`).
    Answered from indexes: a page costs milliseconds beside millions of finished jobs."""
    return await service.list(query)


@router.post(
    "/cancel",
    response_model=JobBulkResponse,
    responses=UNPARSABLE_BODY,
    operation_id="cancel_jobs",
    dependencies=[requires(Scope.admin)],
)
async def cancel_jobs(body: JobBulkRequest, service: Service, actor: Actor) -> JobBulkResponse:
    """Cancel the jobs matching every filter given (at least one), newest first, `limit` at
    most, each as `cancel_job` would (queued: canceled now; running: asked to stop; finished:
    left). Filter on `status: queued` to go on, call after call, while `more` is true. Each
    job's journal names the caller."""
    return await service.cancel_many(body, actor)


@router.post(
    "/retry",
    response_model=JobBulkResponse,
    responses=UNPARSABLE_BODY,
    operation_id="retry_jobs",
    dependencies=[requires(Scope.admin)],
)
async def retry_jobs(body: JobBulkRequest, service: Service, actor: Actor) -> JobBulkResponse:
    """Retry the failed, lost and canceled jobs among those matching every filter given (at
    least one, e.g. `{"queue": "etl", "status": "failed"}`), `limit` looked at, each as
    `retry_job` would; jobs in other states are skipped. Each job's journal names the
    caller."""
    return await service.retry_many(body, actor)


@router.get(
    "/{job_id:job_id}",
    response_model=JobStatusResponse,
    responses=NOT_FOUND,
    operation_id="get_job",
    dependencies=[requires(Scope.read)],
)
@router.get(
    "/{job_id}/status",
    response_model=JobStatusResponse,
    responses=NOT_FOUND,
    operation_id="get_job_status",
    dependencies=[requires(Scope.read)],
)
async def job(job_id: uuid.UUID, request: Request) -> JobStatusResponse:
    """A job: its status, attempt, timings, error and progress (the same answer at
    `/{job_id}` and at the spec's `/{job_id}/status`)."""
    return await jobs_service(request).status(job_id)


@router.get(
    "/{job_id}/events",
    response_model=JobEventsResponse,
    responses=NOT_FOUND,
    operation_id="list_job_events",
    dependencies=[requires(Scope.read)],
)
async def events(
    job_id: uuid.UUID,
    service: Service,
    after: Annotated[int, Query(ge=0, le=2**63 - 1, description="The last event_id seen.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="Events at most.")] = 1000,
) -> JobEventsResponse:
    """A job's journal, oldest first: pass the last `event_id` seen as `after` to read on."""
    return await service.events(job_id, after, limit)


@router.get(
    "/{job_id}/stream",
    response_class=StreamingResponse,
    responses={
        **NOT_FOUND,
        200: {
            "content": {"text/event-stream": {}},
            "description": "Server-Sent Events until the job ends: `journal` (each entry of its"
            " journal, its event_id as the event's id), `progress` and `end` (the job's status"
            " then).",
        },
    },
    operation_id="stream_job",
    dependencies=[requires(Scope.read)],
)
async def stream(
    job_id: uuid.UUID,
    service: Service,
    last_event_id: Annotated[
        str,
        Header(
            pattern=r"^[0-9]{0,18}$",
            description="Resume after this journal entry (what a reconnecting browser sends).",
        ),
    ] = "",
    after: Annotated[
        int, Query(ge=0, le=2**63 - 1, description="Start after this journal entry.")
    ] = 0,
) -> StreamingResponse:
    """A job's journal and progress as Server-Sent Events, from its first entry (or after
    `after`, or the `Last-Event-ID` a reconnecting browser sends) until it ends; the stream
    closes after the `end` event. A running job's journal and progress are read every half
    second; its end is heard at once."""
    events = await service.stream(job_id, int(last_event_id) if last_event_id else after)
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post(
    "/{job_id}/retry",
    response_model=JobStatusResponse,
    responses={
        **NOT_FOUND,
        409: {"model": ErrorResponse, "description": "The job is not failed, lost or canceled"},
    },
    operation_id="retry_job",
    dependencies=[requires(Scope.trigger)],
)
async def retry(job_id: uuid.UUID, service: Service, actor: Actor) -> JobStatusResponse:
    """Send a failed, lost or canceled job back to the queue with a fresh budget of attempts;
    it resumes from its checkpoint. The journal names the caller."""
    return await service.retry(job_id, actor)


@router.post(
    "/{job_id}/cancel",
    response_model=JobStatusResponse,
    responses=NOT_FOUND,
    operation_id="cancel_job",
    dependencies=[requires(Scope.trigger)],
)
async def cancel(job_id: uuid.UUID, service: Service, actor: Actor) -> JobStatusResponse:
    """Cancel: queued jobs never run; running ones stop at their next cancellation check.
    The journal names the caller."""
    return await service.cancel(job_id, actor)
