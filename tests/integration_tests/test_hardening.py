"""Edge cases of the worker and the API: self-fencing, broken pipelines, unstorable errors,
cancel racing a backoff, pathological request bodies."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel, field_validator

from dataloader.core.transitions import Ended, Outcome
from dataloader.storage.protocol import WorkerProtocol
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext

from .conftest import StartService
from .helpers import (
    block_first_run,
    event_kinds,
    event_payloads,
    finish_claimed,
    pipeline_running,
    wait_until,
)


async def test_a_job_whose_lease_cannot_be_extended_is_stopped_before_it_expires(
    start_service: StartService, registry: TaskRegistry, db_dsn: str
) -> None:
    stopped = block_first_run(registry, "t.long")

    # Beats every 0.5 s (a third of the 1.5 s the 2 s lease allows without an extension): the
    # job must be stopped between two of them.
    service = await start_service(heartbeat_sec=10)
    job_id = await service.trigger(task="t.long", lease_ttl_sec=2)
    await wait_until(pipeline_running(service.manager, job_id), what="the pipeline to start")
    blocker = await asyncpg.connect(db_dsn)
    transaction = blocker.transaction()
    await transaction.start()
    # Another session holds the row: heartbeats block, the lease cannot be extended.
    await blocker.execute("SELECT 1 FROM dl_jobs WHERE job_id = $1 FOR UPDATE", job_id)
    try:
        await asyncio.wait_for(stopped.wait(), timeout=10)
        # Stopped between two heartbeats, with time left on its lease for the hand-back to be
        # written before the reaper may take the job (here the row is ours to read).
        time_left = "SELECT lease_expires_at - clock_timestamp() FROM dl_jobs WHERE job_id = $1"
        assert await blocker.fetchval(time_left, job_id) > timedelta(0)
    finally:
        await transaction.rollback()
        await blocker.close()
    body = await service.wait_status(job_id, "succeeded")
    assert body["attempt"] == 1  # stopped by our side, not by the job: the attempt is refunded
    conn = await asyncpg.connect(db_dsn)
    try:
        journal = await event_payloads(conn, job_id, "requeue")
    finally:
        await conn.close()
    assert [p["refunded"] for p in journal] == [True]


async def test_args_validator_raising_a_type_error_fails_the_job_and_is_a_422(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    class Args(BaseModel):
        n: int

        @field_validator("n")
        @classmethod
        def odd(cls, value: int) -> int:
            if value % 2 == 0:
                raise TypeError("even numbers are not supported")
            return value

    @registry.register("t.odd", args=Args)
    async def odd(ctx: JobContext[Args]) -> None:
        return None

    service = await start_service()
    response = await service.client.post(
        "/api/v1/jobs/trigger",
        json={"queue": "default", "task": "t.odd", "lock_key": "k", "args": {"n": 2}},
    )
    assert response.status_code == 422
    assert "even numbers" in response.text
    job_id = await conn.fetchval(
        "INSERT INTO dl_jobs (job_id, queue, task, args, lock_key)"
        " VALUES (gen_random_uuid(), 'default', 't.odd', '{\"n\": 2}', 'k') RETURNING job_id::text"
    )
    body = await service.wait_status(job_id, "failed")
    assert body["attempt"] == 1
    assert "even numbers are not supported" in body["error"]


def test_a_plain_function_registered_as_a_pipeline_runs_in_a_thread() -> None:
    registry = TaskRegistry()

    def not_async(ctx: object) -> None:
        return None

    registry.register("t.sync")(not_async)
    task = registry.get("t.sync")
    assert task is not None
    assert task.threaded


async def test_an_error_text_postgres_cannot_store_is_escaped_not_lost(
    start_service: StartService, registry: TaskRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    # pytest's own log capture would carry the raw text to the xdist controller, which
    # cannot serialise a lone surrogate; our JSON formatter escapes it (see test_logger).
    caplog.set_level(logging.CRITICAL, logger="dataloader")

    @registry.register("t.surrogate")
    async def surrogate(ctx: JobContext[dict[str, Any]]) -> None:
        raise ValueError("half an emoji \ud83d and a NUL \x00")

    service = await start_service()
    job_id = await service.trigger(task="t.surrogate", max_attempts=1)
    body = await service.wait_status(job_id, "failed")
    assert body["error"] == "ValueError: half an emoji \\ud83d and a NUL \\x00"
    journal = (await service.client.get(f"/api/v1/jobs/{job_id}/events")).json()["events"]
    (failed,) = [e["payload"] for e in journal if e["kind"] == "failed"]
    assert failed["traceback"].endswith("ValueError: half an emoji \\ud83d and a NUL \\x00")


async def test_a_cancel_that_lands_before_a_backoff_cancels_the_job(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False)
    job_id = await service.trigger(task="demo.noop", queue="manual")
    protocol = WorkerProtocol(service.context.pool)
    (claimed,) = await protocol.claim("manual", 1, "test-worker")
    response = await service.client.post(f"/api/v1/jobs/{job_id}/cancel")
    assert response.json()["cancel_requested"] is True
    busy = Outcome(Ended.BACKED_OFF, holder="outside dataloader", backoff_sec=60)
    assert await finish_claimed(protocol, claimed, busy, "test-worker")  # its key was busy
    body = await service.status(job_id)
    assert (body["status"], body["attempt"]) == ("canceled", 0)
    assert body["finished_at"] is not None
    assert (await event_kinds(conn, job_id))[-1] == "canceled"


def _nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.parametrize(
    "body",
    [
        {"queue": "q", "task": "t", "lock_key": "k", "args": _nested(600)},
        {"queue": "q", "task": "t", "lock_key": "k", "args": _nested(70)},
        {
            "queue": [
                [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
            ],
            "task": "t",
            "lock_key": "k",
        },
        {"queue": "q" * 10_000, "task": "t", "lock_key": "k"},
    ],
    ids=["args-600-deep", "args-70-deep", "queue-a-deep-list", "queue-10k-chars"],
)
async def test_pathological_bodies_get_a_short_422(
    start_service: StartService, conn: asyncpg.Connection, body: dict[str, Any]
) -> None:
    service = await start_service(run_workers=False)
    response = await service.client.post("/api/v1/jobs/trigger", json=body)
    assert response.status_code == 422, response.text
    assert len(response.content) < 2000  # the offending input is not echoed back whole
    assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 0
