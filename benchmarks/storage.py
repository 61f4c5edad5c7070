"""What a job leaves in the database: bytes per finished job and dead tuples under a steady load.

    python benchmarks/storage.py --dsn postgresql://postgres@127.0.0.1:55432/postgres
    python benchmarks/storage.py --dsn … --systems dataloader_lock_free,procrastinate --rounds 1

Each system gets a fresh database (the shared harness's adapter creates its schema), one worker
of `--concurrency` slots running no-op jobs, and a producer offering `--rate` jobs per second in
batches every 0.1 s for `--seconds`; then the worker drains what is left. Every second the
run samples the dead tuples of the system's tables (what autovacuum has not reclaimed yet);
at the end it reports their peak (and that peak over the jobs finished per second: a system
slower than the load leaves fewer dead tuples only because it finishes fewer jobs), the jobs
finished per second during the offered load, and the size of the system's tables with their
indexes and TOAST per finished job, by relation.
Use a server with autovacuum on (the harness's `pg.sh start`), as in production.

Systems: `dataloader` (a lock_key each), `dataloader_lock_free` (no lock_key), and the peers
`procrastinate` and `pgqueuer`, each run in its own virtual environment (`--venvs`, built by
benchmarks/peers.sh) with the shared harness (`BENCH_HARNESS`) on its path. Rounds rotate the
order; medians.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
HARNESS = Path(os.environ.get("BENCH_HARNESS", HERE.parent.parent / "shared" / "bench"))
#: The relations of each system's queue (LIKE patterns over pg_class.relname).
PREFIX = {"dataloader": "dl\\_%", "procrastinate": "procrastinate\\_%", "pgqueuer": "pgqueuer%"}
#: How each system counts its finished jobs.
FINISHED = {
    "dataloader": "SELECT count(*) FROM dl_jobs WHERE status = 'succeeded'",
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
    "pgqueuer": "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
}
TICK = 0.1


@contextlib.asynccontextmanager
async def _dataloader(dsn: str, concurrency: int, lock_free: bool) -> AsyncIterator[Any]:
    from dataloader import JobContext, NewJob, Runner, Settings, TaskRegistry, WorkerSpec

    registry = TaskRegistry()

    @registry.register("noop")
    async def noop(ctx: JobContext[dict[str, Any]]) -> None:
        return None

    settings = Settings(
        _env_file=None, db_dsn=dsn, workers=[WorkerSpec(queue="bench", concurrency=concurrency)]
    )
    made = 0

    async def enqueue(k: int) -> None:
        nonlocal made
        keys = [None if lock_free else f"job-{made + i}" for i in range(k)]
        made += k
        await dl.client.enqueue_many(
            [NewJob(queue="bench", task="noop", lock_key=key) for key in keys]
        )

    async with Runner(settings, registry) as dl:
        yield enqueue


@contextlib.asynccontextmanager
async def _procrastinate(dsn: str, concurrency: int) -> AsyncIterator[Any]:
    from adapters import procrastinate as adapter  # the harness's: its pool and settings

    app = adapter._app(concurrency)

    @app.task(name=adapter.TASK)
    async def noop() -> None:
        return None

    async with app.open_async():
        worker = asyncio.create_task(
            app.run_worker_async(concurrency=concurrency, install_signal_handlers=False)
        )
        try:
            yield lambda k: noop.batch_defer_async(*([{}] * k))
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker


@contextlib.asynccontextmanager
async def _pgqueuer(dsn: str, concurrency: int) -> AsyncIterator[Any]:
    import asyncpg
    from adapters import pgqueuer as adapter
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    worker_conn, producer_conn = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    pgq = PgQueuer(AsyncpgDriver(worker_conn))

    @pgq.entrypoint(adapter.ENTRYPOINT)
    async def noop(job: Any) -> None:
        return None

    queries = Queries(AsyncpgDriver(producer_conn))
    worker = asyncio.create_task(pgq.run(**adapter._run_kwargs(concurrency)))
    try:
        yield lambda k: queries.enqueue([adapter.ENTRYPOINT] * k, [None] * k, [0] * k)
    finally:
        pgq.shutdown.set()
        await asyncio.wait_for(worker, 60)
        await producer_conn.close()
        await worker_conn.close()


SYSTEMS: dict[str, tuple[str, Callable[[str, int], Any]]] = {
    "dataloader": ("dataloader", lambda dsn, c: _dataloader(dsn, c, lock_free=False)),
    "dataloader_lock_free": ("dataloader", lambda dsn, c: _dataloader(dsn, c, lock_free=True)),
    "procrastinate": ("procrastinate", _procrastinate),
    "pgqueuer": ("pgqueuer", _pgqueuer),
}


def _sizes_sql(prefix: str) -> str:
    return f"""
SELECT c.relname, pg_total_relation_size(c.oid) AS total, pg_relation_size(c.oid) AS heap,
       pg_indexes_size(c.oid) AS indexes, COALESCE(s.n_dead_tup, 0) AS dead,
       COALESCE(s.autovacuum_count, 0) AS autovacuums
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relkind = 'r' AND c.relname LIKE '{prefix}' AND c.relnamespace = 'public'::regnamespace
"""


def _index_sizes_sql(prefix: str) -> str:
    return f"""
SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes
WHERE relname LIKE '{prefix}' ORDER BY 2 DESC
"""


async def _query(psql: Callable[[str, str], str], dsn: str, sql: str) -> list[list[str]]:
    out = await asyncio.to_thread(psql, dsn, sql)
    return [line.split("|") for line in out.splitlines() if line]


async def measure(
    system: str, admin_dsn: str, rate: float, seconds: float, concurrency: int
) -> dict[str, Any]:
    """One run of `system` (in this interpreter: its library must be importable)."""
    sys.path.insert(0, str(HARNESS))
    os.environ.setdefault("BENCH_ADAPTER_PATH", str(HERE / "bench_adapters"))
    adapters = importlib.import_module("adapters")
    adapters.__path__.insert(0, os.environ["BENCH_ADAPTER_PATH"])
    from adapters import _common

    family, worker = SYSTEMS[system]
    adapter = importlib.import_module(f"adapters.{family}")
    await adapter.setup(admin_dsn)
    dsn = _common.with_dbname(admin_dsn, adapter.DBNAME)
    sizes = _sizes_sql(PREFIX[family])
    dead_peak, offered = 0, 0

    async def sample() -> tuple[int, int]:
        rows = await _query(_common.psql, dsn, sizes)
        finished = int((await _query(_common.psql, dsn, FINISHED[family]))[0][0])
        return sum(int(r[4]) for r in rows), finished

    async with worker(dsn, concurrency) as enqueue:
        started = time.perf_counter()
        per_tick, next_sample = rate * TICK, started + 1.0
        while (elapsed := time.perf_counter() - started) < seconds:
            due = int(per_tick * (int(elapsed / TICK) + 1)) - offered
            if due > 0:
                await enqueue(due)
                offered += due
            now = time.perf_counter()
            if now >= next_sample:
                dead, _ = await sample()
                dead_peak, next_sample = max(dead_peak, dead), now + 1.0
            await asyncio.sleep(
                max(0.0, started + (int(elapsed / TICK) + 1) * TICK - time.perf_counter())
            )
        _, finished_in_window = await sample()
        while True:  # drain what is left, still sampling
            dead, finished = await sample()
            dead_peak = max(dead_peak, dead)
            if finished >= offered:
                break
            await asyncio.sleep(1.0)
        drained = time.perf_counter() - started
    rows = await _query(_common.psql, dsn, sizes)
    indexes = await _query(_common.psql, dsn, _index_sizes_sql(PREFIX[family]))
    total = sum(int(r[1]) for r in rows)
    return {
        "system": system,
        "offered": offered,
        "offered_per_s": offered / seconds,
        "finished_per_s_under_load": finished_in_window / seconds,
        "drained_s": drained,
        "dead_tuples_peak": dead_peak,
        "dead_tuples_end": sum(int(r[4]) for r in rows),
        "autovacuums": sum(int(r[5]) for r in rows),
        "bytes": total,
        "bytes_per_job": total / offered,
        "relations": {
            r[0]: {"total": int(r[1]), "heap": int(r[2]), "indexes": int(r[3])} for r in rows
        },
        "indexes": {name: int(size) for name, size in indexes},
    }


def _python(system: str, venvs: Path) -> str:
    family = SYSTEMS[system][0]
    return sys.executable if family == "dataloader" else str(venvs / family / "bin" / "python")


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Run every system in its own interpreter, rounds rotating the order; medians."""
    systems = args.systems.split(",")
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for i in range(args.rounds):
        for system in systems[i % len(systems) :] + systems[: i % len(systems)]:
            command = [_python(system, Path(args.venvs)), __file__, "--one", system]
            command += ["--dsn", args.dsn, "--rate", str(args.rate), "--seconds", str(args.seconds)]
            command += ["--concurrency", str(args.concurrency)]
            print(f"round {i + 1}: {system}", file=sys.stderr, flush=True)
            out = subprocess.run(command, capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"{system} failed:\n{out.stderr[-3000:]}")
            runs[system].append(json.loads(out.stdout))
    return {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "params": {k: getattr(args, k) for k in ("rate", "seconds", "concurrency", "rounds")},
        "medians": {
            system: {
                key: statistics.median(run[key] for run in values)
                for key in values[0]
                if isinstance(values[0][key], int | float)
            }
            for system, values in runs.items()
        },
        "runs": runs,
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        "| system | finished/s under load | dead tuples, peak | the peak over finished/s "
        "| bytes per job | largest relations |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for system, m in result["medians"].items():
        last = result["runs"][system][-1]["relations"]
        top = sorted(last.items(), key=lambda kv: -kv[1]["total"])[:2]
        where = ", ".join(
            f"{name} {v['total'] / 1e6:.1f} MB ({v['indexes'] / 1e6:.1f} indexes)"
            for name, v in top
        )
        rate, dead = m["finished_per_s_under_load"], m["dead_tuples_peak"]
        lines.append(
            f"| {system} | {rate:,.0f} | {dead:,.0f} | {dead / rate:,.0f} s "
            f"| {m['bytes_per_job']:,.0f} | {where} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", required=True, help="admin DSN of a server with autovacuum on")
    parser.add_argument("--systems", default="dataloader,dataloader_lock_free,procrastinate")
    parser.add_argument("--rate", type=float, default=1200, help="jobs offered per second")
    parser.add_argument("--seconds", type=float, default=60, help="how long the load is offered")
    parser.add_argument("--concurrency", type=int, default=10, help="slots of the worker")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--venvs", default=os.environ.get("VENVS", "/tmp/bench-venvs"))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # one run of a system, JSON on stdout
    args = parser.parse_args()
    if args.one:
        result = asyncio.run(measure(args.one, args.dsn, args.rate, args.seconds, args.concurrency))
        print(json.dumps(result))
        return
    result = compare(args)
    results = HERE / "results"
    path = results / f"storage-{datetime.now(UTC).strftime('%Y-%m-%dT%H%M%S%z')}.json"
    path.write_text(json.dumps(result, indent=1))
    print(table(result))
    print(f"\n{path.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
