"""API v1 queue routes: what each queue holds now (the client's `stats`); pause and resume,
and the audit log that records who did them."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from starlette.convertors import Convertor, register_url_convertor

from dataloader.api.auth import AUTH_ERRORS, Actor, AuthorizedRoute, requires
from dataloader.api.deps import from_state
from dataloader.api.v1.schemas import (
    UNPARSABLE_BODY,
    Name,
    QueueEventResponse,
    QueueEventsResponse,
    QueueLimitsBody,
    QueueListResponse,
    QueueSettingsResponse,
    QueueStatsResponse,
)
from dataloader.client import Client
from dataloader.config import Scope
from dataloader.core.models import QueueStats
from dataloader.core.queues import QueueSettings


class _AnyText(Convertor[str]):
    """A path parameter that takes the rest of the path, whatever it holds: a queue's name may
    hold a slash (`etl/daily`), and one it may not hold (a line break) must reach the name's
    check (422) rather than match no route (404, before the token is even checked). Except
    the actions' suffixes: `GET …/etl/pause` is the pause action's path with the wrong method
    (405), not a queue named `etl/pause` (such a queue is steered from the client or CLI)."""

    regex = "(?s:.+)(?<!/pause)(?<!/resume)(?<!/limits)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("dl_any_text", _AnyText())

router = APIRouter(
    prefix="/api/v1/queues", tags=["queues"], responses=AUTH_ERRORS, route_class=AuthorizedRoute
)
#: The queues' audit log, apart: any path under /api/v1/queues/ may be a queue's name.
audit_router = APIRouter(
    prefix="/api/v1/queue-events",
    tags=["queues"],
    responses=AUTH_ERRORS,
    route_class=AuthorizedRoute,
)


Queues = Annotated[Client, Depends(from_state("client"))]
QueueName = Annotated[Name, Path(description="The queue's name.")]


@router.post(
    "/{queue:dl_any_text}/pause",
    response_model=QueueSettingsResponse,
    operation_id="pause_queue",
    dependencies=[requires(Scope.admin)],
)
async def pause_queue(client: Queues, queue: QueueName, actor: Actor) -> QueueSettingsResponse:
    """Pause a queue: from now on no worker of any replica claims its jobs; those running
    finish, and triggers are still accepted. Persisted (a restart keeps it paused) and recorded
    in the queue's audit log with the caller; pausing a paused queue changes nothing."""
    return _settings(await client.acting_as(actor).pause(queue))


@router.post(
    "/{queue:dl_any_text}/resume",
    response_model=QueueSettingsResponse,
    operation_id="resume_queue",
    dependencies=[requires(Scope.admin)],
)
async def resume_queue(client: Queues, queue: QueueName, actor: Actor) -> QueueSettingsResponse:
    """Resume a paused queue: its workers are woken and claim again. Recorded in the audit
    log; resuming a queue that is not paused changes nothing."""
    return _settings(await client.acting_as(actor).resume(queue))


@router.put(
    "/{queue:dl_any_text}/limits",
    response_model=QueueSettingsResponse,
    responses=UNPARSABLE_BODY,
    operation_id="set_queue_limits",
    dependencies=[requires(Scope.admin)],
)
async def set_queue_limits(
    client: Queues, queue: QueueName, body: QueueLimitsBody, actor: Actor
) -> QueueSettingsResponse:
    """Set a queue's limits, held across every replica: jobs running at once (in the queue,
    and per partition_key) and jobs started per second; null removes a limit. Claims of a
    queue with limits take turns across replicas so that the limits hold exactly. Recorded in
    the audit log with the caller (when they change)."""
    settings = await client.acting_as(actor).set_limits(queue, **body.model_dump())
    return _settings(settings)


@audit_router.get(
    "",
    response_model=QueueEventsResponse,
    operation_id="list_queue_events",
    dependencies=[requires(Scope.read)],
)
async def list_queue_events(
    client: Queues,
    queue: Annotated[Name, Query(description="The queue's name.")],
    after: Annotated[int, Query(ge=0, le=2**63 - 1, description="The last event_id seen.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="Events at most.")] = 1000,
) -> QueueEventsResponse:
    """A queue's audit log, oldest first: who paused and resumed it, and when. Pass the last
    `event_id` seen as `after` to read on."""
    events = await client.queue_events(queue, after=after, limit=limit)
    return QueueEventsResponse(events=[QueueEventResponse(**asdict(e)) for e in events])


@router.get(
    "",
    response_model=QueueListResponse,
    operation_id="list_queues",
    dependencies=[requires(Scope.read)],
)
async def list_queues(client: Queues) -> QueueListResponse:
    """Every queue holding jobs that are queued, running, failed or lost, by name, with what
    it holds. Reads only the jobs in those states: as fast with millions of finished jobs in
    the table as with none."""
    return QueueListResponse(queues=[_response(s) for s in (await client.stats()).values()])


@router.get(
    "/{queue:dl_any_text}",
    response_model=QueueStatsResponse,
    operation_id="get_queue",
    dependencies=[requires(Scope.read)],
)
async def get_queue(client: Queues, queue: QueueName) -> QueueStatsResponse:
    """What one queue holds now (all zeros for a queue that holds nothing)."""
    return _response((await client.stats(queue))[queue])


def _response(stats: QueueStats) -> QueueStatsResponse:
    fields = asdict(stats)
    fields["throughput"] = [{**asdict(t), "per_minute": t.per_minute} for t in stats.throughput]
    return QueueStatsResponse(**fields, total=stats.total)


def _settings(settings: QueueSettings) -> QueueSettingsResponse:
    return QueueSettingsResponse(**asdict(settings))
