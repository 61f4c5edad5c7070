"""API v1 routes of durable processes (`client.processes`): start, call, repair, remove, read.

`start`, `call` and `repair` answer with the processor's response, waiting for it up to the
request's `timeout_sec` (DL_PROCESS_WAIT_MAX_SEC at most, whatever the request asks for, up to
MAX_WAIT_SEC); past it, 504 with the task's id, whose response
`GET /api/v1/process-tasks/{task_id}` waits for again (the task goes on). Scopes as for jobs:
`read` reads, `trigger` starts and calls, `admin` repairs and removes.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Path, Query, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from dataloader.api.auth import AUTH_ERRORS, Actor, AuthorizedRoute, requires
from dataloader.api.deps import from_state
from dataloader.api.segments import SegmentRoute
from dataloader.api.v1.schemas import UNPARSABLE_BODY, ErrorResponse, IdempotencyKey, Name
from dataloader.api.v1.service import JobsService
from dataloader.client import Client
from dataloader.config import PROCESS_WAIT_BOUND_SEC, Scope
from dataloader.core.processes import (
    NAMESPACE_MAX_CHARS,
    PROCESS_ID_MAX_CHARS,
    Event,
    Process,
    ProcessStatus,
    TaskKind,
    check_namespace,
    check_process_id,
    task_name_of,
)
from dataloader.exceptions import ProcessNotFound
from dataloader.processes import MAX_PAGE

#: Longest wait for a response a request may ask for: the bound of DL_PROCESS_WAIT_MAX_SEC.
#: A request waits the smaller of its `timeout_sec` and the setting (`_response`).
MAX_WAIT_SEC: Final = PROCESS_WAIT_BOUND_SEC
DEFAULT_WAIT_SEC: Final = 30.0


class ProcessRoute(SegmentRoute, AuthorizedRoute):
    """A route of a process: its namespace and id are one percent-encoded path segment each
    (`report%2Fcall`), matched on the path as sent (`api.segments`), so that every id the
    library accepts has a URL, and no id (`call`, `events`, `a/call`) spells another route."""


router = APIRouter(
    prefix="/api/v1/processes",
    tags=["processes"],
    responses=AUTH_ERRORS,
    route_class=ProcessRoute,
)
tasks_router = APIRouter(
    prefix="/api/v1/process-tasks",
    tags=["processes"],
    responses=AUTH_ERRORS,
    route_class=AuthorizedRoute,
)

Processes = Annotated[Client, Depends(from_state("client"))]
JobsServiceDep = Annotated[JobsService, Depends(from_state("jobs_service"))]
Namespace = Annotated[
    str,
    Path(
        min_length=1,
        max_length=NAMESPACE_MAX_CHARS,
        description="The process's namespace, as one path segment (percent-encoded).",
    ),
    AfterValidator(check_namespace),
]
ProcessId = Annotated[
    str,
    Path(
        min_length=1,
        max_length=PROCESS_ID_MAX_CHARS,
        description="The process's id, as one path segment: percent-encoded, `/` as `%2F`.",
    ),
    AfterValidator(check_process_id),
]
Wait = Annotated[
    float,
    Field(
        gt=0,
        le=MAX_WAIT_SEC,
        description="Seconds to wait for the response (then 504); DL_PROCESS_WAIT_MAX_SEC"
        " (60 by default) at most: a request that asks for more waits that long.",
    ),
]


class ErrorWithTask(BaseModel):
    """A task that did not answer (504) or failed (409): its id, whose job can be read."""

    detail: str
    task_id: uuid.UUID


class Conflict(BaseModel):
    """409: what the process's state refuses (`reason`), or a task that failed."""

    detail: str
    reason: str
    task_id: uuid.UUID | None = None


ERRORS: Final[dict[int | str, dict[str, Any]]] = {
    404: {"model": ErrorResponse, "description": "No live process has this namespace and id"},
    409: {"model": Conflict, "description": "The process's state refuses it, or the task failed"},
    504: {"model": ErrorWithTask, "description": "No response within `timeout_sec`"},
}


class TimerResponse(BaseModel):
    kind: TaskKind
    due_at: datetime
    task_id: uuid.UUID


class ProcessResponse(BaseModel):
    """A live process (its history is read apart: `…/events`)."""

    namespace: str
    process_id: str
    queue: str
    status: ProcessStatus
    detail: str | None
    aux_state: Any
    metadata: dict[str, Any]
    last_event_id: int = Field(description="Events in its history (the last one's id).")
    corrupted_by: uuid.UUID | None = Field(description="The task that put it in error.")
    timer: TimerResponse | None = Field(description="Its pending timer.")
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, process: Process) -> ProcessResponse:
        timer = process.timer
        return cls(
            namespace=process.namespace,
            process_id=process.process_id,
            queue=process.queue,
            status=process.status,
            detail=process.detail,
            aux_state=process.aux_state,
            metadata=dict(process.metadata),
            last_event_id=process.last_event_id,
            corrupted_by=process.corrupted_by,
            timer=None
            if timer is None
            else TimerResponse(kind=timer.kind, due_at=timer.due_at, task_id=timer.task_id),
            created_at=process.created_at,
            updated_at=process.updated_at,
        )


class StartRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    args: dict[str, Any] | None = Field(
        default=None, description="The init task's args (a JSON object)."
    )
    metadata: dict[str, Any] | None = None
    queue: Name | None = Field(
        default=None, description="The queue of its tasks (default: the namespace's)."
    )
    timeout_sec: Wait = DEFAULT_WAIT_SEC


class CallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    args: dict[str, Any] | None = Field(
        default=None, description="The task's args (a JSON object)."
    )
    idempotency_key: IdempotencyKey | None = Field(
        default=None, description="A repeated call with the same key is the same task."
    )
    timeout_sec: Wait = DEFAULT_WAIT_SEC


class TaskAnswer(BaseModel):
    """The processor's response to a task."""

    task_id: uuid.UUID
    response: Any


class StartAnswer(TaskAnswer):
    process: ProcessResponse | None = Field(description="The process after its init.")


class ProcessEventResponse(BaseModel):
    event_id: int
    task_id: uuid.UUID
    ts: datetime
    payload: Any
    metadata: dict[str, Any] | None

    @classmethod
    def of(cls, event: Event) -> ProcessEventResponse:
        return cls(
            event_id=event.event_id,
            task_id=event.task_id,
            ts=event.ts,
            payload=event.payload,
            metadata=None if event.metadata is None else dict(event.metadata),
        )


class ProcessEventsResponse(BaseModel):
    events: list[ProcessEventResponse]


class ProcessListResponse(BaseModel):
    processes: list[ProcessResponse]
    next_cursor: int | None = Field(description="Pass as `cursor` for the next page.")


@router.get(
    "",
    response_model=ProcessListResponse,
    operation_id="list_processes",
    dependencies=[requires(Scope.read)],
)
async def list_processes(
    client: Processes,
    namespace: Annotated[str | None, Query(min_length=1, max_length=NAMESPACE_MAX_CHARS)] = None,
    status: Annotated[ProcessStatus | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    cursor: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> ProcessListResponse:
    """Live processes newest first, of a namespace and a status when given, a page at a time
    (`next_cursor`)."""
    page = await client.processes.list(
        namespace=namespace, status=status, limit=limit, cursor=cursor
    )
    return ProcessListResponse(
        processes=[ProcessResponse.of(p) for p in page.processes], next_cursor=page.next_cursor
    )


@router.post(
    "/{namespace:dl_segment}/{process_id:dl_segment}/call",
    response_model=TaskAnswer,
    responses={**UNPARSABLE_BODY, **ERRORS},
    operation_id="call_process",
    dependencies=[requires(Scope.trigger)],
)
async def call_process(
    client: Processes, namespace: Namespace, process_id: ProcessId, body: CallRequest, actor: Actor
) -> TaskAnswer:
    """Call the process: its processor runs the call after the tasks before it, and its
    response is the answer. 404: no such process; 409: it is in error (only a repair is
    accepted), or the processor failed; 504: no response within `timeout_sec` (the call goes
    on: `GET /api/v1/process-tasks/{task_id}`)."""
    return await _answer(client.acting_as(actor), namespace, process_id, TaskKind.CALL, body)


@router.post(
    "/{namespace:dl_segment}/{process_id:dl_segment}/repair",
    response_model=TaskAnswer,
    responses={**UNPARSABLE_BODY, **ERRORS},
    operation_id="repair_process",
    dependencies=[requires(Scope.admin)],
)
async def repair_process(
    client: Processes, namespace: Namespace, process_id: ProcessId, body: CallRequest, actor: Actor
) -> TaskAnswer:
    """Repair a process in error: its processor runs a `repair` task, whose success returns
    the process to `running`. 409 when the process is not in error."""
    return await _answer(client.acting_as(actor), namespace, process_id, TaskKind.REPAIR, body)


@router.get(
    "/{namespace:dl_segment}/{process_id:dl_segment}/events",
    response_model=ProcessEventsResponse,
    responses={404: ERRORS[404]},
    operation_id="list_process_events",
    dependencies=[requires(Scope.read)],
)
async def list_process_events(
    client: Processes,
    namespace: Namespace,
    process_id: ProcessId,
    after: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
) -> ProcessEventsResponse:
    """The process's history, oldest first: the events after event `after`, `limit` at most."""
    events = await client.processes.events(namespace, process_id, after=after, limit=limit)
    return ProcessEventsResponse(events=[ProcessEventResponse.of(e) for e in events])


@router.post(
    "/{namespace:dl_segment}/{process_id:dl_segment}",
    response_model=StartAnswer,
    responses={**UNPARSABLE_BODY, **ERRORS},
    operation_id="start_process",
    dependencies=[requires(Scope.trigger)],
)
async def start_process(
    client: Processes,
    namespace: Namespace,
    process_id: ProcessId,
    body: StartRequest,
    actor: Actor,
    service: JobsServiceDep,
) -> StartAnswer:
    """Start the process: its processor runs the `init` task, whose response is the answer.
    A start of a live process with the same args answers as its first start did; with other
    args, 409. Refused (422) where its tasks certainly cannot run: on a queue whose live
    processes all lack the namespace's processor (as a job's trigger is)."""
    processes = client.acting_as(actor).processes
    await service.check_route(task_name_of(namespace), processes.queue_of(namespace, body.queue))
    task_id = await processes.submit(
        namespace,
        process_id,
        TaskKind.INIT,
        body.args,
        metadata=body.metadata,
        queue=body.queue,
    )
    response = await _response(client, task_id, body.timeout_sec)
    process = await processes.get(namespace, process_id)
    return StartAnswer(
        task_id=task_id,
        response=response,
        process=None if process is None else ProcessResponse.of(process),
    )


@router.get(
    "/{namespace:dl_segment}/{process_id:dl_segment}",
    response_model=ProcessResponse,
    responses={404: ERRORS[404]},
    operation_id="get_process",
    dependencies=[requires(Scope.read)],
)
async def get_process(
    client: Processes, namespace: Namespace, process_id: ProcessId
) -> ProcessResponse:
    """The live process, with its pending timer."""
    process = await client.processes.get(namespace, process_id)
    if process is None:
        raise ProcessNotFound(namespace, process_id)
    return ProcessResponse.of(process)


@router.delete(
    "/{namespace:dl_segment}/{process_id:dl_segment}",
    response_model=TaskAnswer,
    responses=ERRORS,
    operation_id="remove_process",
    dependencies=[requires(Scope.admin)],
)
async def remove_process(
    client: Processes,
    namespace: Namespace,
    process_id: ProcessId,
    actor: Actor,
    timeout_sec: Annotated[float, Query(gt=0, le=MAX_WAIT_SEC)] = DEFAULT_WAIT_SEC,
) -> TaskAnswer:
    """Remove the process after the task it runs: its timer and queued tasks are canceled,
    its id is free at once, its history is kept until retention prunes it."""
    processes = client.acting_as(actor).processes
    task_id = await processes.submit(namespace, process_id, TaskKind.REMOVE)
    return TaskAnswer(task_id=task_id, response=await _response(client, task_id, timeout_sec))


@tasks_router.get(
    "/{task_id}",
    response_model=TaskAnswer,
    responses=ERRORS,
    operation_id="get_process_task_response",
    dependencies=[requires(Scope.read)],
)
async def get_process_task_response(
    client: Processes,
    task_id: uuid.UUID,
    timeout_sec: Annotated[float, Query(gt=0, le=MAX_WAIT_SEC)] = DEFAULT_WAIT_SEC,
) -> TaskAnswer:
    """The response of a process's task (after a 504, say), waiting up to `timeout_sec`."""
    return TaskAnswer(task_id=task_id, response=await _response(client, task_id, timeout_sec))


async def _answer(
    client: Client, namespace: str, process_id: str, kind: TaskKind, body: CallRequest
) -> TaskAnswer:
    """Submit a call or repair of the process and answer with its response."""
    task_id = await client.processes.submit(
        namespace, process_id, kind, body.args, idempotency_key=body.idempotency_key
    )
    return TaskAnswer(task_id=task_id, response=await _response(client, task_id, body.timeout_sec))


async def _response(client: Client, task_id: uuid.UUID, timeout_sec: float) -> Any:
    """The task's response, waited for `timeout_sec` at most, DL_PROCESS_WAIT_MAX_SEC at most."""
    wait = min(timeout_sec, client.settings.process_wait_max_sec)
    return await client.processes.response(task_id, wait)


@router.api_route(
    "/{namespace:dl_segment}/{process_id:dl_segment}",
    methods=["PUT", "PATCH", "OPTIONS", "TRACE"],
    include_in_schema=False,
    dependencies=[requires(Scope.read)],
)
async def other_methods() -> Response:
    """405 naming every method a process's path takes (the first route of the path would
    name its own only)."""
    return Response(status_code=405, headers={"Allow": "DELETE, GET, HEAD, POST"})
