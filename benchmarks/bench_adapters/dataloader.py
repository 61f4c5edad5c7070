"""dataloader adapter: asyncpg, the library's `Runner` (what the service runs), full protocol.

The full worker protocol is on: batched claim with FOR UPDATE SKIP LOCKED, an advisory lock per
job's lock_key on the process's lock-holding connection, lease + heartbeat, fenced finish, and
the `dl_job_events` journal written by the same statements. Durability is PostgreSQL's default.

Settings changed from dataloader defaults (everything else is default):
* `WORKERS_JSON` = one queue `bench` with `concurrency` slots (default: queue `default`, 4).
* each job gets its own `lock_key` (independent jobs, as the peers' jobs are).
"""

from __future__ import annotations

import asyncio
import time
from importlib.metadata import version
from typing import Any

from dataloader import JobContext, NewJob, Runner, Settings, TaskRegistry, WorkerSpec

from . import _common

DBNAME = "bench_dataloader"
QUEUE = "bench"
BATCH = 1000
_dsn: str | None = None


def versions() -> dict[str, str]:
    return {"dataloader": version("dataloader"), "asyncpg": version("asyncpg")}


def _settings(concurrency: int = 1) -> Settings:
    return Settings(
        _env_file=None,
        db_dsn=_dsn,
        workers=[WorkerSpec(queue=QUEUE, concurrency=concurrency)],
    )


def _job(i: int, args: dict[str, Any] | None = None) -> NewJob:
    return NewJob(queue=QUEUE, task="noop", lock_key=f"job-{i}", args=args or {})


async def setup(dsn: str) -> None:
    global _dsn
    _dsn = _common.recreate_database(dsn, DBNAME)
    async with Runner(_settings(), run_workers=False):  # applies the migrations
        pass


async def enqueue(n: int, batch: bool) -> None:
    async with Runner(_settings(), run_workers=False) as dl:
        if batch:
            for start in range(0, n, BATCH):
                await dl.client.enqueue_many([_job(i) for i in range(start, min(n, start + BATCH))])
        else:
            for i in range(n):
                await dl.client.enqueue(_job(i))


async def drain(n: int, concurrency: int) -> None:
    registry = TaskRegistry()
    handled = 0

    @registry.register("noop")
    async def noop(ctx: JobContext[dict[str, Any]]) -> None:
        nonlocal handled
        handled += 1

    async with Runner(_settings(concurrency), registry) as dl:
        await dl.run_until_empty()
    async with Runner(_settings(), run_workers=False) as dl:
        succeeded = await dl.context.pool.fetchval(
            "SELECT count(*) FROM dl_jobs WHERE queue = $1 AND status = 'succeeded'", QUEUE
        )
    if handled < n or succeeded != n:
        raise RuntimeError(f"drain incomplete: handled={handled} succeeded={succeeded} n={n}")


async def latency(samples: int, interval_s: float, concurrency: int = 10) -> list[float]:
    registry = TaskRegistry()
    seen: dict[int, float] = {}

    @registry.register("noop")
    async def noop(ctx: JobContext[dict[str, Any]]) -> None:
        seen[ctx.args["i"]] = time.perf_counter() - ctx.args["t0"]

    async with Runner(_settings(concurrency), registry) as dl:
        await asyncio.sleep(_common.WORKER_START_S)
        total = _common.WARMUP_JOBS + samples
        for i in range(total):
            t0 = time.perf_counter()
            await dl.client.enqueue(_job(i, {"i": i, "t0": t0}))
            await asyncio.sleep(interval_s)
        await _common.wait_until(lambda: len(seen) >= total, 30, "latency jobs")
    return [seen[i] for i in range(_common.WARMUP_JOBS, total)]
