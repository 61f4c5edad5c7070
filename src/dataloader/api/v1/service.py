"""API v1 business logic: thin rules over the repository."""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict
from typing import Any

from pydantic import ValidationError

from dataloader.api.live import LiveTasks, describe_known
from dataloader.config import Settings
from dataloader.exceptions import InvalidJobArgs, JobNotFound, UnknownTask
from dataloader.storage.repositories import JobRepository, JobState, NewJob
from dataloader.workers.pipelines.registry import PipelineRegistry

from .schemas import JobStatusResponse, TriggerRequest, TriggerResponse


class JobsService:
    """Trigger, read and cancel jobs."""

    def __init__(
        self,
        repo: JobRepository,
        registry: PipelineRegistry,
        settings: Settings,
        live_tasks: LiveTasks,
    ) -> None:
        self._repo = repo
        self._registry = registry
        self._settings = settings
        self._live_tasks = live_tasks

    async def trigger(self, request: TriggerRequest) -> TriggerResponse:
        """Idempotent enqueue; args are checked when the task is registered in this process.
        A task no live process knows is refused (UnknownTask) unless DL_ALLOW_UNKNOWN_TASKS:
        a misspelt name would otherwise be retried for minutes before it failed."""
        if not self._settings.allow_unknown_tasks and not await self._live_tasks.knows(
            request.task
        ):
            known = describe_known(self._live_tasks.last_known or frozenset())
            raise UnknownTask(request.task, known)
        self._registry.validate_args(request.task, request.args)
        self._check_json_types(request.task, request.args)
        result = await self._repo.enqueue(
            NewJob(
                queue=request.queue,
                task=request.task,
                lock_key=request.lock_key,
                args=request.args,
                idempotency_key=request.idempotency_key,
                partition_key=request.partition_key,
                priority=request.priority,
                available_at=request.available_at,
                max_attempts=request.max_attempts,
                lease_ttl_sec=request.lease_ttl_sec or self._settings.default_lease_ttl_sec,
                producer=request.producer,
                consumer_group=request.consumer_group,
            )
        )
        return TriggerResponse(job_id=result.job_id, status=result.status, created=result.created)

    def _check_json_types(self, task: str, args: dict[str, Any]) -> None:
        """Args as the OpenAPI schema states them (the task's model as JSON Schema): pydantic's
        lax mode would also take `true` for a number or `"5"` for an integer, which the schema
        refuses. Whole numbers stay integers, as JSON Schema counts them (`2.0` is one)."""
        found = self._registry.get(task)
        if found is None or found.args_model is None:
            return
        try:
            found.args_model.model_validate_json(json.dumps(_whole_numbers(args)), strict=True)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in ('args', *e['loc']))}: {e['msg']}" for e in exc.errors()
            )
            raise InvalidJobArgs(problems) from None

    async def status(self, job_id: uuid.UUID) -> JobStatusResponse:
        """The job's state; JobNotFound if there is none."""
        return _response(await self._repo.get(job_id))

    async def cancel(self, job_id: uuid.UUID) -> JobStatusResponse:
        """Cancel (queued → canceled; running → cancel requested; finished → unchanged)."""
        return _response(await self._repo.cancel(job_id))


def _whole_numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _whole_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(item) for item in value]
    return value


def _response(state: JobState | None) -> JobStatusResponse:
    if state is None:
        raise JobNotFound("job not found")
    return JobStatusResponse(**asdict(state))
