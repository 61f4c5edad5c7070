"""Checkpoints: `ctx.checkpoint(value)` persists, fenced on the claim, and the attempt after a
failure, a rescue by the reaper or a client's retry resumes from it (`ctx.resume_from`); a long
load killed with SIGKILL twice resumes in new processes and repeats at most a chunk per kill."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from dataloader import JobLost
from dataloader.base import JobStatus
from dataloader.storage.protocol import WorkerProtocol
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext, RunState
from dataloader.workers.reaper import Reaper

from . import etl_task
from .conftest import StartService
from .helpers import event_payloads, wait_until
from .procs import Launcher, ServiceProcess

REPO_ROOT = Path(__file__).resolve().parents[2]


class Boom(Exception):
    """What the failing attempts of these tests raise."""


async def stored_checkpoint(conn: asyncpg.Connection, job_id: Any) -> Any:
    """The job's checkpoint as the database holds it (JSON text, or None)."""
    return await conn.fetchval("SELECT checkpoint::text FROM dl_jobs WHERE job_id = $1", job_id)


async def test_the_attempt_after_a_failure_resumes_from_the_last_checkpoint(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    seen: list[Any] = []

    @registry.task("t.resume", queue="default", max_attempts=3, retry=0)
    async def resume(ctx: JobContext[dict[str, Any]]) -> int:
        seen.append(ctx.resume_from)
        if ctx.attempt == 1:
            await ctx.checkpoint({"next": 3})
            await ctx.checkpoint({"next": 6, "day": "2026-01-01"})
            raise Boom("the source went away")
        return int(ctx.resume_from["next"])

    service = await start_service()
    job = await service.dl.enqueue("t.resume", lock_key="k")
    state = await service.dl.wait(job.job_id, timeout=30)
    assert (state.status, state.attempt, state.result) == (JobStatus.SUCCEEDED, 2, 6)
    assert seen == [None, {"next": 6, "day": "2026-01-01"}]
    assert state.checkpoint == {"next": 6, "day": "2026-01-01"}
    body = await service.status(str(job.job_id))
    assert body["checkpoint"] == state.checkpoint


async def test_a_client_retry_keeps_the_checkpoint(
    start_service: StartService, registry: TaskRegistry
) -> None:
    seen: list[Any] = []

    @registry.task("t.retried", queue="default", max_attempts=1)
    async def retried(ctx: JobContext[dict[str, Any]]) -> None:
        seen.append(ctx.resume_from)
        if ctx.resume_from is None:
            await ctx.checkpoint({"next": 40})
            raise Boom("credentials expired")

    service = await start_service()
    job = await service.dl.enqueue("t.retried", lock_key="k")
    state = await service.dl.wait(job.job_id, timeout=30)
    assert (state.status, state.checkpoint) == (JobStatus.FAILED, {"next": 40})
    after = await service.dl.retry(job.job_id)
    assert after.checkpoint == {"next": 40}
    state = await service.dl.wait(job.job_id, timeout=30)
    assert state.status is JobStatus.SUCCEEDED
    assert seen == [None, {"next": 40}]


async def test_a_rescued_attempt_resumes_and_the_stale_claim_cannot_checkpoint(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """A worker claims the job, saves a checkpoint and goes silent; the reaper sends the job
    back; another worker resumes from the checkpoint; the first one's late checkpoint is
    refused (JobLost) and changes nothing."""
    seen: list[Any] = []
    saved, proceed = asyncio.Event(), asyncio.Event()

    @registry.task("t.rescued", queue="default")
    async def rescued(ctx: JobContext[dict[str, Any]]) -> None:
        seen.append(ctx.resume_from)
        await ctx.checkpoint({"next": 8})
        saved.set()
        await proceed.wait()

    producer = await start_service(run_workers=False)
    job = await producer.dl.enqueue("t.rescued", lock_key="k")
    protocol = WorkerProtocol(producer.context.pool)
    (claimed,) = await protocol.claim("default", 1, "silent-worker")
    silent = JobContext(claimed, {}, app=producer.context, state=RunState(), protocol=protocol)
    assert silent.resume_from is None
    await silent.checkpoint({"next": 5})
    assert await stored_checkpoint(conn, job.job_id) == '{"next": 5}'

    await conn.execute(
        "UPDATE dl_jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = $1",
        job.job_id,
    )
    assert await Reaper(protocol, "test-reaper").run_once() == {"queued": 1}
    (requeued,) = await event_payloads(conn, str(job.job_id), "requeue")
    assert requeued["reason"] == "lease expired"

    worker = await start_service()
    await asyncio.wait_for(saved.wait(), timeout=30)
    assert seen == [{"next": 5}]  # the rescued attempt resumed where the silent one stopped
    with pytest.raises(JobLost):
        await silent.checkpoint({"next": 99})
    assert await stored_checkpoint(conn, job.job_id) == '{"next": 8}'
    proceed.set()
    state = await worker.dl.wait(job.job_id, timeout=30)
    assert (state.status, state.attempt, state.checkpoint) == (
        JobStatus.SUCCEEDED,
        2,
        {"next": 8},
    )


async def test_a_checkpoint_that_cannot_be_stored_is_refused_and_writes_nothing(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    refused: list[str] = []

    @registry.task("t.big", queue="default")
    async def big(ctx: JobContext[dict[str, Any]]) -> None:
        await ctx.checkpoint({"next": 1})
        for value in ("x" * 2000, object()):
            try:
                await ctx.checkpoint(value)
            except ValueError as exc:
                refused.append(str(exc))
        assert ctx.resume_from == {"next": 1}

    service = await start_service(max_result_bytes=1024)
    job = await service.dl.enqueue("t.big", lock_key="k")
    state = await service.dl.wait(job.job_id, timeout=30)
    assert state.status is JobStatus.SUCCEEDED, state.error
    assert refused == [
        "the checkpoint is 2002 bytes of JSON, more than DL_MAX_RESULT_BYTES (1024)",
        "the checkpoint is not JSON: Unable to serialize unknown type: <class 'object'>",
    ]
    assert await stored_checkpoint(conn, job.job_id) == '{"next": 1}'


# --- a long load killed with SIGKILL ----------------------------------------------------------

ROWS, CHUNK = 2000, 50
#: Rows the load must have moved on by before each kill (several chunks: each kill interrupts
#: work the process really did, not its start-up).
PROGRESS_BEFORE_KILL = 400

#: Where the load stands: its checkpoint, and the rows committed (one snapshot).
LOAD_STATE = """
SELECT COALESCE((SELECT (checkpoint->>'next')::int FROM dl_jobs WHERE job_id = $1::text::uuid),
                0) AS checkpoint,
       (SELECT count(*)::int FROM etl_target) AS committed
"""


async def test_a_load_killed_twice_resumes_from_its_checkpoints_in_new_processes(
    launcher: Launcher, db_dsn: str, conn: asyncpg.Connection
) -> None:
    """The first kill falls between a chunk's commit and its checkpoint (that chunk is written
    again), the second just after a checkpoint (nothing is written again)."""
    began = time.monotonic()
    for statement in etl_task.TABLES:
        await conn.execute(statement)
    env = {
        "DL_PIPELINE_MODULES": "tests.integration_tests.etl_task",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        "WORKERS_JSON": f'[{{"queue": "{etl_task.QUEUE}", "concurrency": 1}}]',
    }

    async def start() -> ServiceProcess:
        process = launcher.start(db_dsn, **env)
        await process.wait_healthy()
        return process

    async def load_state() -> tuple[int, int]:
        row = await conn.fetchrow(LOAD_STATE, job_id)
        return row["checkpoint"], row["committed"]

    async def kill_when(process: ServiceProcess, target: int, chunk_pending: bool) -> None:
        """Kill `process` once its checkpoint passed `target` and a chunk is committed but
        not yet checkpointed (`chunk_pending`), or all committed rows are checkpointed."""

        async def moment() -> bool:
            checkpoint, committed = await load_state()
            return checkpoint >= target and (committed > checkpoint) == chunk_pending

        try:
            await wait_until(moment, timeout=45, what=f"the load to pass row {target}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}{process.describe_failure()}") from None
        process.kill()
        assert await process.wait() < 0

    process = await start()
    job_id = await process.trigger(
        task=etl_task.TASK,
        queue=etl_task.QUEUE,
        lock_key="etl",
        args={"rows": ROWS, "chunk": CHUNK, "commit_pause_sec": 0.06, "pause_sec": 0.06},
    )
    killed: list[tuple[int, int]] = []  # (checkpoint, rows committed) when each process died
    killed_pids: list[int] = []
    for chunk_pending in (True, False):
        resumed_from = killed[-1][0] if killed else 0
        await kill_when(process, resumed_from + PROGRESS_BEFORE_KILL, chunk_pending)
        killed_pids.append(process.pid)
        killed.append(await load_state())
        assert killed[-1][0] < ROWS, "the load ended before the kill: slow it down"
        process = await start()

    body = await process.wait_status(job_id, "succeeded", timeout=45)
    rows = await conn.fetch("SELECT id, value, writes FROM etl_target ORDER BY id")
    assert [r["id"] for r in rows] == list(range(ROWS))
    assert all(r["value"] == etl_task.expected_value(r["id"]) for r in rows)
    # what was written again is exactly what each killed process had committed past its last
    # checkpoint: at most one chunk per kill
    rewrites = sum(r["writes"] - 1 for r in rows)
    pending = [committed - checkpoint for checkpoint, committed in killed]
    assert all(0 <= p <= CHUNK for p in pending), killed
    assert rewrites == sum(pending) <= CHUNK * len(killed), (rewrites, killed)

    # each process after a kill resumed exactly where the killed one had checkpointed
    first_start: dict[int, int] = {}
    for row in await conn.fetch("SELECT pid, resume_from FROM etl_starts ORDER BY at"):
        first_start.setdefault(row["pid"], row["resume_from"])
    resumed = [first_start[pid] for pid in (*killed_pids, process.pid)]
    assert resumed == [0, *(checkpoint for checkpoint, _ in killed)]
    assert body["result"] == {"rows": ROWS, "resumed_from": killed[-1][0]}
    reasons = [p["reason"] for p in await event_payloads(conn, job_id, "requeue")]
    assert reasons == ["lease expired", "lease expired"]  # rescued by a reaper both times
    print(  # the measurement, for the record (pytest -s -n 0 shows it)
        f"\nSIGKILL load: {ROWS} rows in chunks of {CHUNK}, killed at (checkpoint, committed)"
        f" {killed}, {rewrites} rows rewritten, {time.monotonic() - began:.1f}s"
    )
