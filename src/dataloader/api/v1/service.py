"""API v1 business logic: the client's rules (`dataloader.Client`), plus what only HTTP needs:
refusing jobs sent where they cannot run (`core.routing`, from what live processes know), and
triggers that break the contract (DL_CONTRACT_FILE)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict

from dataloader.api.live import LiveTasks
from dataloader.client import Client
from dataloader.config import Settings
from dataloader.contract import ContractGuard
from dataloader.core.models import JobState, NewJob
from dataloader.exceptions import JobNotFound

from .schemas import (
    JobBulkRequest,
    JobBulkResponse,
    JobEventResponse,
    JobEventsResponse,
    JobListQuery,
    JobListResponse,
    JobStatusResponse,
    TriggerRequest,
    TriggerResponse,
)

#: A stream says something at least this often (a comment), so that proxies keep it open.
SSE_KEEPALIVE_SEC = 15.0


class JobsService:
    """Trigger, read and cancel jobs."""

    def __init__(
        self,
        client: Client,
        settings: Settings,
        live_tasks: LiveTasks,
        contract: ContractGuard | None = None,
    ) -> None:
        self._client = client
        self._settings = settings
        self._live_tasks = live_tasks
        self._contract = contract

    async def check_route(self, task: str, queue: str) -> None:
        """Refuse a job of `task` sent to `queue` where it certainly cannot run
        (`core.routing`, as `trigger` does)."""
        await self._live_tasks.check(
            task, queue, self._client.registry, allow_unknown=self._settings.allow_unknown_tasks
        )

    async def trigger(self, request: TriggerRequest, actor: str) -> TriggerResponse:
        """Idempotent enqueue, with the client's checks and defaults, refused where it
        certainly cannot run (`core.routing`): on another queue than its task's (InvalidJob),
        or on a queue whose live processes all lack its task (UnknownTask, unless
        DL_ALLOW_UNKNOWN_TASKS). A task nobody knows on a queue nobody serves is accepted:
        its jobs wait for their workers, and /status says so."""
        await self.check_route(request.task, request.queue)
        if self._contract is not None:
            self._contract.check(request.task, request.queue, request.args)
        result = await self._client.acting_as(actor).enqueue(
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
                lease_ttl_sec=request.lease_ttl_sec,
                producer=request.producer,
                consumer_group=request.consumer_group,
            )
        )
        return TriggerResponse(job_id=result.job_id, status=result.status, created=result.created)

    async def status(self, job_id: uuid.UUID) -> JobStatusResponse:
        """The job's state; JobNotFound if there is none."""
        return _response(await self._client.get(job_id))

    async def list(self, query: JobListQuery) -> JobListResponse:
        """A page of jobs newest first."""
        page = await self._client.list(**query.model_dump(exclude_none=True))
        return JobListResponse(
            jobs=[JobStatusResponse(**asdict(job)) for job in page.jobs],
            next_cursor=page.next_cursor,
        )

    async def events(self, job_id: uuid.UUID, after: int, limit: int) -> JobEventsResponse:
        """The job's journal after event `after`; JobNotFound if there is no such job."""
        events = await self._client.events(job_id, after=after, limit=limit)
        if not events and await self._client.get(job_id) is None:
            raise JobNotFound("job not found")
        return JobEventsResponse(events=[JobEventResponse(**asdict(e)) for e in events])

    async def cancel_many(self, request: JobBulkRequest, actor: str) -> JobBulkResponse:
        """Cancel the jobs matching the request's filters."""
        done = await self._client.acting_as(actor).cancel_many(**request.model_dump())
        return JobBulkResponse(matched=done.matched, changed=done.changed, more=done.more)

    async def retry_many(self, request: JobBulkRequest, actor: str) -> JobBulkResponse:
        """Retry the retryable jobs matching the request's filters."""
        done = await self._client.acting_as(actor).retry_many(**request.model_dump())
        return JobBulkResponse(matched=done.matched, changed=done.changed, more=done.more)

    async def stream(self, job_id: uuid.UUID, after: int) -> AsyncIterator[str]:
        """The job's updates as Server-Sent Events until it ends: `journal` (each entry, its
        `event_id` as the event's id), `progress`, then `end` (its final status); a comment
        every SSE_KEEPALIVE_SEC of silence. JobNotFound before anything is sent if there is
        no such job."""
        if await self._client.get(job_id) is None:
            raise JobNotFound("job not found")
        return self._events(job_id, after)

    async def _events(self, job_id: uuid.UUID, after: int) -> AsyncIterator[str]:
        async for update in self._client.follow(job_id, after=after, idle_sec=SSE_KEEPALIVE_SEC):
            if update.event is not None:
                body = JobEventResponse(**asdict(update.event)).model_dump_json()
                yield f"id: {update.event.event_id}\nevent: journal\ndata: {body}\n\n"
            elif update.state is not None:
                body = _response(update.state).model_dump_json()
                yield f"event: {update.kind}\ndata: {body}\n\n"
            else:
                yield ": keep-alive\n\n"

    async def retry(self, job_id: uuid.UUID, actor: str) -> JobStatusResponse:
        """A failed, lost or canceled job back to the queue (NotRetryable otherwise)."""
        return _response(await self._client.acting_as(actor).retry(job_id))

    async def cancel(self, job_id: uuid.UUID, actor: str) -> JobStatusResponse:
        """Cancel (queued → canceled; running → cancel requested; finished → unchanged)."""
        return _response(await self._client.acting_as(actor).cancel(job_id))


def _response(state: JobState | None) -> JobStatusResponse:
    if state is None:
        raise JobNotFound("job not found")
    return JobStatusResponse(**asdict(state))
