"""API v1 task routes: the contracts of the tasks live workers run, and the tasks of queued
jobs that none of them knows."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from dataloader.api.auth import AUTH_ERRORS, AuthorizedRoute, requires
from dataloader.api.deps import from_state
from dataloader.api.v1.schemas import (
    AwaitedTaskResponse,
    TaskContractResponse,
    TaskListResponse,
)
from dataloader.client import Client
from dataloader.config import Scope

router = APIRouter(
    prefix="/api/v1/tasks", tags=["tasks"], responses=AUTH_ERRORS, route_class=AuthorizedRoute
)


Reader = Annotated[Client, Depends(from_state("client"))]


@router.get(
    "",
    response_model=TaskListResponse,
    operation_id="list_tasks",
    dependencies=[requires(Scope.read)],
)
async def list_tasks(client: Reader) -> TaskListResponse:
    """Every task some live worker runs: its queue and options, the JSON Schema of its args
    (validate before you trigger) and of its result, and the processes that publish it; then
    the tasks of queued jobs that no live process knows, with their queues."""
    return TaskListResponse(
        tasks=[
            TaskContractResponse.model_validate(p.spec | {"name": p.name, "workers": p.workers})
            for p in await client.published_tasks()
        ],
        awaited=[
            AwaitedTaskResponse(name=task, queues=queues)
            for task, queues in (await client.awaited_tasks()).items()
        ],
    )
