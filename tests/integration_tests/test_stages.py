"""Stages: a success enqueues the next stages (a task's `then=`, the handler's `ctx.then`) in the
transaction that writes the success; a failed stage stops the chain, and says so."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel

from dataloader import testing
from dataloader.core.models import Stage
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext

from .conftest import StartService
from .helpers import event_payloads, wait_until


async def _jobs_of(conn: asyncpg.Connection, task: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT job_id, queue, lock_key, status::text AS status, args::text AS args,"
        " idempotency_key, producer, partition_key FROM dl_jobs WHERE task = $1"
        " ORDER BY created_at, job_id",
        task,
    )


async def test_a_chain_of_stages_passes_each_result_on(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    @registry.task("etl.extract", queue="etl", then="etl.transform")
    async def extract(ctx: JobContext[dict[str, Any]]) -> dict[str, int]:
        return {"rows": ctx.args["rows"]}

    @registry.task("etl.transform", then=("etl.load",))
    async def transform(ctx: JobContext[dict[str, Any]]) -> int:
        return int(ctx.args["rows"]) * 2

    @registry.task("etl.load")
    async def load(ctx: JobContext[dict[str, Any]]) -> dict[str, Any]:
        return {"loaded": ctx.args}

    service = await start_service(workers=[{"queue": "etl", "concurrency": 2}])
    first = await service.dl.enqueue("etl.extract", {"rows": 21}, lock_key="day:1")

    async def loaded() -> asyncpg.Record | None:
        rows = await _jobs_of(conn, "etl.load")
        return rows[0] if rows and rows[0]["status"] == "succeeded" else None

    last = await wait_until(loaded, what="the last stage done")
    assert json.loads(last["args"]) == {"result": 42}  # a result that is no object is wrapped
    (second,) = await _jobs_of(conn, "etl.transform")
    assert json.loads(second["args"]) == {"rows": 21}
    # each stage: the lock_key of the one before, its queue (none of their own), named after it
    assert {(r["queue"], r["lock_key"]) for r in (second, last)} == {("etl", "day:1")}
    assert second["producer"] == "stage:etl.extract"
    assert second["idempotency_key"].startswith(f"stage:{first.job_id}:")
    done = await event_payloads(conn, str(first.job_id), "done")
    assert done[0]["then"] == ["etl.transform"]


async def test_the_handler_adds_stages_with_their_own_options(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    class Report(BaseModel):
        day: str

    @registry.task("etl.split", queue="etl")
    async def split(ctx: JobContext[dict[str, Any]]) -> None:
        for part in range(3):
            ctx.then("etl.part", {"part": part}, lock_key=f"part:{part}", priority=5)
        ctx.then("etl.report", Report(day="2026-11-25"), partition_key="reports")

    @registry.task("etl.part")
    async def part(ctx: JobContext[dict[str, Any]]) -> None: ...

    @registry.task("etl.report", queue="reports", args=Report)
    async def report(ctx: JobContext[Report]) -> None: ...

    service = await start_service(
        workers=[{"queue": "etl", "concurrency": 2}, {"queue": "reports", "concurrency": 1}]
    )
    job = await service.dl.enqueue("etl.split", lock_key="split", partition_key="client-7")
    assert (await service.dl.wait(job.job_id, timeout=30)).status == "succeeded"
    # enqueued by one statement: one created_at, so in the order of their lock_keys here
    parts = sorted(await _jobs_of(conn, "etl.part"), key=lambda r: r["lock_key"])
    assert [(r["queue"], r["lock_key"]) for r in parts] == [("etl", f"part:{i}") for i in range(3)]
    assert [json.loads(r["args"]) for r in parts] == [{"part": i} for i in range(3)]
    assert {r["partition_key"] for r in parts} == {"client-7"}  # the running job's
    (reported,) = await _jobs_of(conn, "etl.report")
    assert reported["queue"] == "reports"  # the stage task's own queue
    assert (reported["lock_key"], reported["partition_key"]) == ("split", "reports")

    async def all_done() -> bool:
        rows = [*await _jobs_of(conn, "etl.part"), *await _jobs_of(conn, "etl.report")]
        return all(r["status"] == "succeeded" for r in rows)

    await wait_until(all_done, what="every stage done")


async def test_a_failed_stage_stops_the_chain_and_says_where(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    @registry.task("etl.flaky", queue="etl", then="etl.next")
    async def flaky(ctx: JobContext[dict[str, Any]]) -> None:
        ctx.then("etl.extra")  # asked again by each attempt: only a success enqueues it
        if ctx.attempt < ctx.args["succeed_at"]:
            raise RuntimeError(f"attempt {ctx.attempt} fails")

    @registry.task("etl.next")
    async def after(ctx: JobContext[dict[str, Any]]) -> None: ...

    @registry.task("etl.extra")
    async def extra(ctx: JobContext[dict[str, Any]]) -> None: ...

    service = await start_service(workers=[{"queue": "etl", "concurrency": 2}])
    stops = await service.dl.enqueue("etl.flaky", {"succeed_at": 99}, lock_key="a", max_attempts=2)
    recovers = await service.dl.enqueue(
        "etl.flaky", {"succeed_at": 2}, lock_key="b", max_attempts=2
    )
    assert (await service.dl.wait(stops.job_id, timeout=30)).status == "failed"
    assert (await service.dl.wait(recovers.job_id, timeout=30)).status == "succeeded"
    failed = await event_payloads(conn, str(stops.job_id), "failed")
    assert failed[0]["stopped_before"] == ["etl.next", "etl.extra"]
    # the job that failed once and then succeeded enqueued each stage once
    for task in ("etl.next", "etl.extra"):
        rows = await _jobs_of(conn, task)
        assert [r["lock_key"] for r in rows] == ["b"], task


async def test_a_success_is_written_only_with_its_stages(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """When the stages cannot be written, neither is the success: the outcome's write is tried
    again, and both land together once it can."""
    await conn.execute(
        """
        CREATE FUNCTION refuse_stage() RETURNS trigger AS $$
        BEGIN RAISE EXCEPTION 'the stage table is read-only today'; END $$ LANGUAGE plpgsql;
        CREATE TRIGGER refuse_stage BEFORE INSERT ON dl_jobs
        FOR EACH ROW WHEN (NEW.task = 'etl.refused') EXECUTE FUNCTION refuse_stage();
        """
    )

    @registry.task("etl.first", queue="etl", then="etl.refused")
    async def first(ctx: JobContext[dict[str, Any]]) -> None: ...

    @registry.task("etl.refused")
    async def refused(ctx: JobContext[dict[str, Any]]) -> None: ...

    service = await start_service(workers=[{"queue": "etl", "concurrency": 1}])
    job = await service.dl.enqueue("etl.first", lock_key="a")
    completer = service.manager.completer

    async def write_failed() -> bool:
        return completer.failed_writes > 0

    await wait_until(write_failed, what="the outcome's write refused")
    status = await conn.fetchval("SELECT status::text FROM dl_jobs WHERE job_id = $1", job.job_id)
    assert status == "running"
    assert await _jobs_of(conn, "etl.refused") == []
    await conn.execute("DROP TRIGGER refuse_stage ON dl_jobs")
    assert (await service.dl.wait(job.job_id, timeout=60)).status == "succeeded"
    assert len(await _jobs_of(conn, "etl.refused")) == 1


async def test_a_stage_its_task_refuses_fails_the_job(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    class Needs(BaseModel):
        day: str

    @registry.task("etl.bad_result", queue="etl", then="etl.strict")
    async def bad_result(ctx: JobContext[dict[str, Any]]) -> dict[str, int]:
        return {"rows": 1}

    @registry.task("etl.strict", args=Needs)
    async def strict(ctx: JobContext[Needs]) -> None: ...

    service = await start_service(workers=[{"queue": "etl", "concurrency": 1}])
    job = await service.dl.enqueue("etl.bad_result", lock_key="a", max_attempts=3)
    state = await service.dl.wait(job.job_id, timeout=30)
    assert state.status == "failed"
    assert state.attempt == 1  # not retried: the next attempt would make the same stage
    assert state.error is not None
    assert state.error.startswith("next stage: ")
    assert await _jobs_of(conn, "etl.strict") == []


async def test_run_task_shows_the_stages_a_success_would_enqueue() -> None:
    registry = TaskRegistry()

    @registry.task("etl.a", queue="etl", then="etl.b")
    async def a(ctx: JobContext[dict[str, Any]]) -> dict[str, int]:
        ctx.then("etl.c", {"x": 1}, lock_key="other")
        return {"rows": 2}

    run = await testing.run_task("etl.a", registry=registry)
    assert run.stages == [Stage("etl.b", {"rows": 2}), Stage("etl.c", {"x": 1}, lock_key="other")]


def test_stages_are_checked_when_asked_for() -> None:
    registry = TaskRegistry()
    with pytest.raises(ValueError, match="a batched task has no next stages"):
        registry.task("b", queue="q", batch_size=10, then="c")
    with pytest.raises(ValueError, match="then"):
        registry.task("b", queue="q", then="")
