"""Job lifecycle through the real worker: claim → heartbeat → finish, retries, failures."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel

from dataloader import JobStatus
from dataloader.exceptions import NonRetryableError
from dataloader.tasks import TaskRegistry
from dataloader.workers.claims import Claimed
from dataloader.workers.job_context import JobContext

from .conftest import StartService, wait_until
from .helpers import event_kinds, lifecycle_kinds


async def test_noop_job_succeeds_and_is_journaled(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service()
    job_id = await service.trigger(task="demo.noop")
    body = await service.wait_status(job_id, "succeeded")
    assert body["attempt"] == 1
    assert body["started_at"] is not None
    assert body["finished_at"] is not None
    assert await lifecycle_kinds(conn, job_id) == ["queued", "picked", "done"]
    lease = await conn.fetchval("SELECT lease_expires_at FROM dl_jobs WHERE job_id = $1", job_id)
    assert lease is None


async def test_heartbeat_extends_the_lease_while_the_job_runs(
    start_service: StartService, conn: asyncpg.Connection, registry: TaskRegistry
) -> None:
    release = asyncio.Event()

    @registry.register("t.block")
    async def block(ctx: JobContext[dict[str, Any]]) -> None:
        await release.wait()

    service = await start_service(heartbeat_sec=0.1)
    job_id = await service.trigger(task="t.block")
    await service.wait_status(job_id, "running")
    first = await conn.fetchrow(
        "SELECT heartbeat_at, lease_expires_at FROM dl_jobs WHERE job_id = $1", job_id
    )

    async def beaten() -> bool:
        row = await conn.fetchrow(
            "SELECT heartbeat_at, lease_expires_at FROM dl_jobs WHERE job_id = $1", job_id
        )
        return row["heartbeat_at"] > first["heartbeat_at"] and (
            row["lease_expires_at"] > first["lease_expires_at"]
        )

    await wait_until(beaten, what="a heartbeat")
    release.set()
    await service.wait_status(job_id, "succeeded")
    kinds = await event_kinds(conn, job_id)
    assert kinds[:2] == ["queued", "picked"]
    assert kinds[-1] == "done"
    assert "heartbeat" in kinds  # the first beat of a job is journaled


async def test_retries_then_success(start_service: StartService, conn: asyncpg.Connection) -> None:
    service = await start_service()
    job_id = await service.trigger(task="demo.fail", args={"fail_times": 2})
    body = await service.wait_status(job_id, "succeeded")
    assert body["attempt"] == 3
    assert body["error"] is None
    kinds = await event_kinds(conn, job_id)
    assert kinds.count("requeue") == 2
    assert kinds[-1] == "done"


async def test_retries_exhausted_ends_failed_with_the_error(start_service: StartService) -> None:
    service = await start_service()
    job_id = await service.trigger(task="demo.fail", args={"fail_times": 10}, max_attempts=3)
    body = await service.wait_status(job_id, "failed")
    assert body["attempt"] == 3
    assert "DemoFailure" in body["error"]
    assert "attempt 3" in body["error"]
    assert body["finished_at"] is not None


async def test_retry_waits_base_times_attempt(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(retry_base_sec=1000)
    job_id = await service.trigger(task="demo.fail", args={"fail_times": 1})
    await service.wait_status(job_id, "queued")  # back in the queue after attempt 1

    async def requeued() -> Any:
        return await conn.fetchrow(
            "SELECT attempt, available_at - now() AS delay FROM dl_jobs"
            " WHERE job_id = $1 AND status = 'queued' AND attempt = 1",
            job_id,
        )

    row = await wait_until(requeued, what="the retry to be scheduled")
    assert 990 < row["delay"].total_seconds() <= 1000


async def test_non_retryable_error_fails_at_once(
    start_service: StartService, registry: TaskRegistry
) -> None:
    @registry.register("t.fatal")
    async def fatal(ctx: JobContext[dict[str, Any]]) -> None:
        raise NonRetryableError("bad input file")

    service = await start_service()
    job_id = await service.trigger(task="t.fatal")
    body = await service.wait_status(job_id, "failed")
    assert body["attempt"] == 1
    assert body["error"] == "NonRetryableError: bad input file"


async def test_invalid_args_fail_without_retry(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    class Args(BaseModel):
        day: int

    @registry.register("t.typed", args=Args)
    async def typed(ctx: JobContext[Args]) -> None:
        raise AssertionError("must not run")

    service = await start_service()
    # Written directly: the API would refuse these args with a 422 (tested with the API).
    job_id = await conn.fetchval(
        "INSERT INTO dl_jobs (job_id, queue, task, args, lock_key)"
        " VALUES (gen_random_uuid(), 'default', 't.typed', $1::jsonb, 'k') RETURNING job_id",
        '{"day": "x"}',
    )
    body = await service.wait_status(str(job_id), "failed")
    assert body["attempt"] == 1
    assert body["error"].startswith("invalid args: args.day")


async def test_unknown_task_is_retried_then_failed(start_service: StartService) -> None:
    # the HTTP trigger refuses a task no live process knows unless told otherwise (a rolling
    # deploy); the library never checks. Either way, the worker retries it like an error.
    service = await start_service(allow_unknown_tasks=True)
    job_id = await service.trigger(task="nobody.knows", max_attempts=2)
    body = await service.wait_status(job_id, "failed")
    assert body["attempt"] == 2
    assert "no task registered as 'nobody.knows'" in body["error"]


async def test_priority_order(start_service: StartService, registry: TaskRegistry) -> None:
    order: list[int] = []

    @registry.register("t.record")
    async def record(ctx: JobContext[dict[str, Any]]) -> None:
        order.append(ctx.args["n"])

    # API only first, so that every job is queued before a worker looks.
    api = await start_service(run_workers=False)
    ids = []
    for n, priority in [(1, 50), (2, 10), (3, 100), (4, 10), (5, 0)]:
        ids.append(await api.trigger(task="t.record", args={"n": n}, priority=priority))
    service = await start_service(workers=[{"queue": "default", "concurrency": 1}])
    for job_id in ids:
        await service.wait_status(job_id, "succeeded")
    assert order == [5, 2, 4, 1, 3]


async def test_delayed_job_starts_on_time_without_polling(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service()  # safety poll is 300 s: only the due-time timer can wake it
    await service.wait_status(await service.trigger(task="demo.noop"), "succeeded")
    due = await conn.fetchval("SELECT now() + interval '1.5 seconds'")
    job_id = await service.trigger(task="demo.noop", available_at=due.isoformat())
    await service.wait_status(job_id, "succeeded", timeout=10)
    started = await conn.fetchval("SELECT started_at FROM dl_jobs WHERE job_id = $1", job_id)
    assert started >= due
    assert (started - due).total_seconds() < 2


async def test_pipeline_progress_is_visible(start_service: StartService) -> None:
    service = await start_service()
    job_id = await service.trigger(task="demo.sleep", args={"seconds": 0.3, "chunks": 3})
    body = await service.wait_status(job_id, "succeeded")
    assert body["progress"] == {"done": 3, "total": 3}


async def test_pipeline_gets_the_app_context(
    start_service: StartService, registry: TaskRegistry
) -> None:
    from sqlalchemy import text

    seen: list[int] = []

    @registry.register("t.sql")
    async def sql(ctx: JobContext[dict[str, Any]]) -> None:
        async with ctx.app.sessionmaker() as session:
            seen.append((await session.execute(text("SELECT 41 + 1"))).scalar_one())

    service = await start_service()
    await service.wait_status(await service.trigger(task="t.sql"), "succeeded")
    assert seen == [42]


async def test_a_job_made_ready_while_a_claim_runs_keeps_the_worker_from_idling(
    start_service: StartService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that found nothing read the queue before a job became ready (an outcome
    written, a job enqueued) whose wake-up came while it ran: the worker does not call itself
    idle on that claim, so `run_until_empty` returns only once the job has run."""
    service = await start_service()
    await service.manager.wait_idle()
    claims = service.manager.queues["default"].claims
    real_claim = claims.claim
    enqueued: list[uuid.UUID] = []

    async def claim_then_a_job_arrives(*args: Any, **kwargs: Any) -> Claimed:
        claimed = await real_claim(*args, **kwargs)
        if not enqueued:  # once: after the claim's read, before its answer is seen
            job = await service.dl.enqueue("demo.noop", queue="default")
            enqueued.append(job.job_id)
            service.manager.queues["default"].wake()
        return claimed

    monkeypatch.setattr(claims, "claim", claim_then_a_job_arrives)
    await service.manager.wait_idle()
    state = await service.dl.get(enqueued[0])
    assert state is not None
    assert state.status is JobStatus.SUCCEEDED
