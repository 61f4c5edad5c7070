"""The pipeline every fault scenario runs, loaded by the service processes through
`DL_PIPELINE_MODULES=tests.faults.pipeline`.

Each execution writes to the ledger (tests/faults/ledger.py) on its own connections: a
`fault_runs` row when it starts, its end when it stops for any reason, and
one `fault_effects` row for the job. The effect is what a real ETL job must get right: it is
*fenced* (written only while this attempt still owns the job, checked under the job row's
lock) and *idempotent* (a job re-run after its effect was written does not write it again).
A write the fence refuses is recorded in `fault_fenced_out`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Annotated, Any

import asyncpg
from pydantic import BaseModel, Field

from dataloader import JobContext, JobLost, pipeline
from dataloader.exceptions import JobInterrupted

TASK = "fault.work"
#: Tries of the write of a run's end, 0.2 s apart (a database restart takes ~1 s).
RECORD_END_TRIES = 150


class WorkArgs(BaseModel):
    """`steps` progress writes `step_sec` apart, then the effect."""

    steps: Annotated[int, Field(ge=0, le=10_000)] = 3
    step_sec: Annotated[float, Field(ge=0, le=60)] = 0.01


_pool: asyncpg.Pool | None = None
_pool_lock = asyncio.Lock()


async def ledger() -> asyncpg.Pool:
    """A small pool of the process, apart from the service's own connections (straight to
    the server when `FAULT_LEDGER_DSN` says how, past a proxy the scenario breaks)."""
    global _pool
    async with _pool_lock:
        if _pool is None:
            _pool = await asyncpg.create_pool(
                os.environ.get("FAULT_LEDGER_DSN") or os.environ["DL_DB_DSN"],
                min_size=0,
                max_size=4,
                command_timeout=10,
            )
        return _pool


@pipeline(TASK, args=WorkArgs)
async def work(ctx: JobContext[WorkArgs]) -> None:
    pool = await ledger()
    run_id = uuid.uuid4()
    # Times from this host's clock (the database's, too, on this machine), taken where the run
    # starts and stops: a ledger write that has to wait out a database restart must not move
    # them. The insert is shielded like the end below: a cancel arriving mid-insert must not
    # leave a started run whose end is never written.
    started = asyncio.ensure_future(
        pool.execute(
            "INSERT INTO fault_runs (run_id, job_id, attempt, pid, lock_key, started_at)"
            " VALUES ($1, $2, $3, $4, $5, $6)",
            run_id,
            ctx.job_id,
            ctx.attempt,
            os.getpid(),
            ctx.job.lock_key,
            now(),
        )
    )
    outcome = "error"
    try:
        await asyncio.shield(started)
        for step in range(ctx.args.steps):
            ctx.check_cancelled()
            await asyncio.sleep(ctx.args.step_sec)
            await ctx.set_progress(step=step + 1)
        await write_effect(pool, ctx)
        outcome = "done"
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    except JobInterrupted as exc:
        outcome = type(exc).__name__
        raise
    finally:
        # the run stops, whatever stops it, only once its end is in the ledger
        await through_cancels(record_end(pool, started, run_id, now(), outcome))


def now() -> datetime:
    return datetime.now(UTC)


async def through_cancels(work: Coroutine[Any, Any, None]) -> None:
    """Await `work` to its end, however many cancels arrive meanwhile."""
    task = asyncio.ensure_future(work)
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)


async def record_end(
    pool: asyncpg.Pool,
    started: asyncio.Future[str],
    run_id: uuid.UUID,
    ended_at: datetime,
    outcome: str,
) -> None:
    """Write the run's end once its start is written (or could not be), retrying while the
    database is unreachable."""
    with contextlib.suppress(Exception):
        await started
    for _ in range(RECORD_END_TRIES):
        try:
            await pool.execute(
                "UPDATE fault_runs SET ended_at = $2, outcome = $3 WHERE run_id = $1",
                run_id,
                ended_at,
                outcome,
            )
            return
        except Exception:  # the database is restarting, or the connection went bad: again
            await asyncio.sleep(0.2)


async def write_effect(pool: asyncpg.Pool, ctx: JobContext[WorkArgs]) -> None:
    """The job's one effect: fenced on this attempt owning the job, and written once."""
    async with pool.acquire() as conn, conn.transaction():
        owner = await conn.fetchrow(
            "SELECT status::text AS status, claim_token FROM dl_jobs WHERE job_id = $1 FOR SHARE",
            ctx.job_id,
        )
        if owner is None or (owner["status"], owner["claim_token"]) != ("running", ctx.claim_token):
            await conn.execute(
                "INSERT INTO fault_fenced_out (job_id, attempt, pid) VALUES ($1, $2, $3)",
                ctx.job_id,
                ctx.attempt,
                os.getpid(),
            )
            fenced_out = True
        else:
            await conn.execute(
                "INSERT INTO fault_effects (job_id, attempt, pid)"
                " SELECT $1, $2, $3 WHERE NOT EXISTS"
                " (SELECT 1 FROM fault_effects WHERE job_id = $1)",
                ctx.job_id,
                ctx.attempt,
                os.getpid(),
            )
            fenced_out = False
    if fenced_out:
        raise JobLost("the effect's fence refused this attempt")
