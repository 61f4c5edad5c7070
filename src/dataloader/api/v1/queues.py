"""API v1 queue routes: what each queue holds now (the client's `stats`)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, Path
from starlette.convertors import Convertor, register_url_convertor

from dataloader.api.auth import AUTH_ERRORS, AuthorizedRoute, requires
from dataloader.api.deps import from_state
from dataloader.api.v1.schemas import Name, QueueListResponse, QueueStatsResponse
from dataloader.client import Client
from dataloader.config import Scope
from dataloader.core.models import QueueStats


class _AnyText(Convertor[str]):
    """A path parameter that takes the rest of the path, whatever it holds: a queue's name may
    hold a slash (`etl/daily`), and one it may not hold (a line break) must reach the name's
    check (422) rather than match no route (404, before the token is even checked)."""

    regex = "(?s:.+)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("dl_any_text", _AnyText())

router = APIRouter(
    prefix="/api/v1/queues", tags=["queues"], responses=AUTH_ERRORS, route_class=AuthorizedRoute
)


Queues = Annotated[Client, Depends(from_state("client"))]


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
async def get_queue(
    client: Queues, queue: Annotated[Name, Path(description="The queue's name.")]
) -> QueueStatsResponse:
    """What one queue holds now (all zeros for a queue that holds nothing)."""
    return _response((await client.stats(queue))[queue])


def _response(stats: QueueStats) -> QueueStatsResponse:
    return QueueStatsResponse(**asdict(stats), total=stats.total)
