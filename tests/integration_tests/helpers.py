"""Helpers shared by the integration tests: polling, the jobs API client, schema introspection."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import httpx

from dataloader.core.retry import Linear, RetryPolicy
from dataloader.core.transitions import Outcome, Transition, after_attempt
from dataloader.storage import queries
from dataloader.storage.protocol import ClaimedJob, WorkerProtocol
from dataloader.tasks import TaskRegistry
from dataloader.workers.base import QueueWorker
from dataloader.workers.job_context import JobContext
from dataloader.workers.manager import WorkerManager

T = TypeVar("T")

#: Advisory locks of jobs held in the current database (pg_locks spans the whole server,
#: which parallel tests share).
ADVISORY_LOCKS = """
SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory'
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  -- not the key a client listening for ended jobs holds (queries.LISTENER_LOCK): it may
  -- linger on after its last wait
  AND NOT (classid = 1684828011 AND objid = 2 AND objsubid = 2)
"""


async def wait_until(
    probe: Callable[[], Awaitable[T]], timeout: float = 15, what: str = "condition"
) -> T:
    """Poll `probe` until it returns something truthy (database state has no events to await)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


class JobsApi:
    """The v1 jobs API over an httpx client (in-process ASGI or a real socket)."""

    client: httpx.AsyncClient

    def describe_failure(self) -> str:
        """Extra text for a failed wait (a subprocess adds its log)."""
        return ""

    async def trigger(self, **body: Any) -> str:
        """POST a trigger (queue `default` and a unique lock_key unless given); the job id."""
        body.setdefault("queue", "default")
        body.setdefault("lock_key", f"k-{time.monotonic_ns()}")
        response = await self.client.post("/api/v1/jobs/trigger", json=body)
        assert response.status_code == 200, response.text
        job_id: str = response.json()["job_id"]
        return job_id

    async def status(self, job_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/api/v1/jobs/{job_id}/status")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def wait_status(self, job_id: str, *statuses: str, timeout: float = 20) -> dict[str, Any]:
        """Poll the job's status until it is one of `statuses`."""

        async def probe() -> dict[str, Any] | None:
            body = await self.status(job_id)
            return body if body["status"] in statuses else None

        try:
            return await wait_until(probe, timeout, f"job {job_id} to become {statuses}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}{self.describe_failure()}") from None


def block_first_run(registry: TaskRegistry, task: str) -> asyncio.Event:
    """Register `task`: its first run blocks until cancelled (then sets the returned event),
    later runs return at once (whatever their attempt number: a refunded run keeps it)."""
    stopped = asyncio.Event()

    @registry.register(task)
    async def block(ctx: JobContext[dict[str, Any]]) -> None:
        if stopped.is_set():
            return
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.set()
            raise

    return stopped


def pipeline_running(manager: WorkerManager, job_id: str) -> Callable[[], Awaitable[bool]]:
    """A probe: the job's pipeline task runs in `manager`'s process."""

    async def probe() -> bool:
        running = manager.runtime.running
        return any(str(j) == job_id and r.task is not None for j, r in running.items())

    return probe


async def claimed_since_now(worker: QueueWorker) -> None:
    """Return once `worker` has answered a claim that started after this call."""
    target = worker.claims_started + 1
    worker.wake()

    async def answered() -> bool:
        return worker.claims_answered >= target

    await wait_until(answered, what=f"a claim of {worker.queue}")


async def add_worker(
    conn: asyncpg.Connection,
    worker_id: str,
    queues: dict[str, int],
    tasks: list[str],
    *,
    seen_ago_sec: float = 0,
    period_sec: float = 5,
    task_queues: dict[str, str] | None = None,
) -> None:
    """A row of another process, last seen `seen_ago_sec` ago, whose contracts name the
    queues of `task_queues` ({task: queue}; the others name none)."""
    specs = {task: {"name": task, "queue": (task_queues or {}).get(task)} for task in tasks}
    await conn.execute(
        "INSERT INTO dl_workers (worker_id, host, pid, version, queues, tasks, task_specs,"
        " period_sec, seen_at) VALUES ($1, 'elsewhere', 1, '0', $2::jsonb, $3, $4::jsonb, $5,"
        " now() - make_interval(secs => $6))",
        worker_id,
        json.dumps(queues),
        tasks,
        json.dumps(specs),
        period_sec,
        seen_ago_sec,
    )


async def event_kinds(conn: asyncpg.Connection, job_id: str) -> list[str]:
    """The kinds of a job's journal rows, oldest first."""
    rows = await conn.fetch(
        "SELECT kind FROM dl_job_events WHERE job_id = $1::text::uuid ORDER BY event_id",
        str(job_id),
    )
    return [r["kind"] for r in rows]


async def lifecycle_kinds(conn: asyncpg.Connection, job_id: str) -> list[str]:
    """The kinds of a job's journal rows but heartbeats, oldest first: a beat journals one
    whenever it comes, even between the end of a run and the write of its outcome."""
    return [kind for kind in await event_kinds(conn, job_id) if kind != "heartbeat"]


async def event_payloads(conn: asyncpg.Connection, job_id: str, kind: str) -> list[Any]:
    """The payloads of a job's journal rows of one kind, oldest first."""
    rows = await conn.fetch(
        "SELECT payload::text FROM dl_job_events WHERE job_id = $1::text::uuid AND kind = $2"
        " ORDER BY event_id",
        str(job_id),
        kind,
    )
    return [json.loads(r["payload"]) for r in rows]


async def schema_definitions(conn: asyncpg.Connection) -> dict[str, str]:
    """Definitions of the indexes, constraints, triggers, trigger function and enum of the
    spec's tables, keyed by object."""
    found: dict[str, str] = {}
    for r in await conn.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename IN ('dl_jobs', 'dl_job_events')"
    ):
        found[f"index {r['indexname']}"] = r["indexdef"]
    for r in await conn.fetch(
        "SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint"
        " WHERE conrelid IN ('dl_jobs'::regclass, 'dl_job_events'::regclass)"
    ):
        found[f"constraint {r['conname']}"] = r["def"]
    for r in await conn.fetch(
        "SELECT tgname, pg_get_triggerdef(oid) AS def FROM pg_trigger"
        " WHERE tgrelid = 'dl_jobs'::regclass AND NOT tgisinternal"
    ):
        found[f"trigger {r['tgname']}"] = r["def"]
    found["function notify_job_ready"] = await conn.fetchval(
        "SELECT pg_get_functiondef('notify_job_ready'::regproc)"
    )
    found["type dl_status"] = await conn.fetchval(
        "SELECT string_agg(enumlabel, ',' ORDER BY enumsortorder) FROM pg_enum"
        " WHERE enumtypid = 'dl_status'::regtype"
    )
    return found


#: Retries at once (the tests of outcomes do not wait for their retry times).
NO_DELAY = Linear(0)


async def finish_claimed(
    protocol: WorkerProtocol,
    claimed: ClaimedJob,
    outcome: Outcome,
    worker_id: str,
    retry: RetryPolicy = NO_DELAY,
) -> Transition | None:
    """Write `outcome` of a job claimed by hand, as the worker's completer does: decide on the
    claim's facts, write fenced, decide again if the row changed meanwhile. The transition
    written, or None when the job was not ours (a busy row fails the test)."""
    facts = claimed.facts()
    for _ in range(5):
        transition = after_attempt(outcome, facts, retry)
        applied = (await protocol.finish([(claimed, facts, transition)], worker_id)).get(
            claimed.job_id
        )
        if applied is None:
            return None
        assert applied.state != "busy", "the job's row is held by someone else"
        if applied.state == "written":
            return transition
        assert applied.facts is not None
        facts = applied.facts
    raise AssertionError("the job kept changing")


def parking_insert(job_id: uuid.UUID, queue: str, task: str, lock_key: str) -> tuple[Any, ...]:
    """INSERT_JOB of one job of `lock_key`, parked if a job of that key runs, as an enqueue
    that commits at once asks (see Parking at insert in `queries`)."""
    return queries.INSERT_JOB.bind(
        job_id=job_id,
        queue=queue,
        task=task,
        args="{}",
        idempotency_key=None,
        lock_key=lock_key,
        partition_key="",
        priority=100,
        available_at=None,
        delay_sec=None,
        max_attempts=5,
        lease_ttl_sec=60,
        producer=None,
        consumer_group=None,
        actor="test",
        park_behind_running=True,
    )
