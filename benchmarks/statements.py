"""What one job costs PostgreSQL, statement by statement: `n` no-op jobs (a lock_key each, or
none with `--lock-free`) are enqueued in batches of 1,000 and drained by 10 slots (`--slots`)
of a `Runner`, on a server with
`pg_stat_statements` loaded; then each statement's calls, server time, rows, buffers and WAL
per job are printed, the costliest first, and the database's tables and indexes by size.

    python benchmarks/statements.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

With `--spec-floor`, the same jobs go through the least the spec asks of a job instead: the
spec's DDL alone (migration 0001) and one index in the claim's order, each job inserted, claimed
and ended by one row update each, with its journal row written by the same statement (batches
of 1,000, claims and ends of 20 by 10 connections; no lease, fence, lock or handler). That is
a floor under any queue on the spec's tables that journals each state change.

With `--peer pgqueuer_defaults` (or `pgqueuer`, at `--slots`), the shared harness's peer
enqueues the same number of jobs in batches of 1,000 and drains them instead, and its
database's statements are printed the same way (benchmarks/peers.sh builds its environment).

The server must have `shared_preload_libraries = 'pg_stat_statements'`; the extension is
created in the benchmark's database. Statements run by this script itself (resets, reads of
the statistics) are left out.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import run

import dataloader.storage.migrations as migrations
from dataloader import NewJob

#: Per statement of the database named $1, its share of the drain: calls, time, rows,
#: buffers touched and WAL.
PROFILE = """
SELECT regexp_replace(left(query, 400), '\\s+', ' ', 'g') AS query, calls,
       total_exec_time AS ms, rows, shared_blks_hit + shared_blks_read AS blocks,
       shared_blks_dirtied AS dirtied, wal_records, wal_bytes
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)
  AND query NOT LIKE '%pg_stat_statements%'
ORDER BY total_exec_time DESC
"""

#: The database each peer of the shared harness creates for itself.
PEER_DATABASES = {"pgqueuer": "bench_pgqueuer", "pgqueuer_defaults": "bench_pgqueuer"}

#: dataloader's tables and their indexes by size (the table an index is of beside it).
SIZES = """
SELECT c.relname, COALESCE(t.relname, '') AS of_table, pg_relation_size(c.oid) AS bytes
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()
LEFT JOIN pg_index x ON x.indexrelid = c.oid
LEFT JOIN pg_class t ON t.oid = x.indrelid
WHERE (c.relkind = 'r' AND c.relname LIKE 'dl\\_%') OR t.relname LIKE 'dl\\_%'
ORDER BY bytes DESC
"""


@dataclass(frozen=True)
class Profile:
    """What a run cost: its statements (`PROFILE`'s rows), its relations by size (`SIZES`'s),
    the jobs, their rate, and the server's processes' CPU seconds over the run."""

    statements: list[asyncpg.Record]
    sizes: list[Any]
    n: int
    rate: float
    server_cpu_s: float


async def profile(
    bench: run.Bench, n: int, make: Callable[[int], NewJob] = run.job, slots: int = 10
) -> Profile:
    """The statements of enqueueing and draining `n` jobs (`make(i)`) with `slots` slots."""
    await bench.fresh_database()

    async def work() -> None:
        await bench.bulk_insert(n, make)
        await bench.drain(n, slots)

    return await _profiled(bench.dsn, run.DBNAME, n, work)


async def _profiled(
    dsn: str, database: str, n: int, work: Callable[[], Awaitable[None]], sizes: bool = True
) -> Profile:
    """What `work` on `n` jobs cost `database`: the statistics reset on `dsn`'s database, its
    statements after, the server's CPU and the rate over it, and (`sizes`) dataloader's
    relations by size once vacuumed (the statements were run on `dsn`'s database)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.execute("SELECT pg_stat_statements_reset()")
        started, server_before = time.perf_counter(), run._server_cpu_seconds()
        await work()
        server = run._server_cpu_seconds() - server_before
        rate = n / (time.perf_counter() - started)
        statements = await conn.fetch(PROFILE, database)
        relations = []
        if sizes:
            await conn.execute("VACUUM dl_jobs, dl_job_events")
            relations = await conn.fetch(SIZES)
    finally:
        await conn.close()
    return Profile(statements, relations, n, rate, server)


#: The spec-floor's queue: the spec's DDL, and an index in its claim's order.
FLOOR_SCHEMA = (
    (Path(migrations.__file__).parent / "0001_spec_schema.sql").read_text()
    + """
CREATE INDEX floor_claim_order ON dl_jobs (queue, priority, created_at) WHERE status = 'queued';
"""
)

#: The spec-floor's enqueue: `$1` jobs with a lock_key each, and their `queued` rows.
FLOOR_ENQUEUE = """
WITH ins AS (
    INSERT INTO dl_jobs (job_id, queue, task, lock_key)
    SELECT id, 'bench', 'demo.noop', id::text FROM unnest($1::uuid[]) AS id
    RETURNING job_id, queue
)
INSERT INTO dl_job_events (job_id, queue, kind) SELECT job_id, queue, 'queued' FROM ins
"""

#: The spec-floor's claim: the spec's claim of up to `$1` jobs, and their `picked` rows.
FLOOR_CLAIM = """
WITH cte AS (
    SELECT job_id FROM dl_jobs
    WHERE status = 'queued' AND queue = 'bench' AND available_at <= now()
    ORDER BY priority, created_at
    FOR UPDATE SKIP LOCKED LIMIT $1
), upd AS (
    UPDATE dl_jobs j
    SET status = 'running', started_at = COALESCE(started_at, now()), attempt = attempt + 1,
        lease_expires_at = now() + make_interval(secs => j.lease_ttl_sec), heartbeat_at = now()
    FROM cte WHERE j.job_id = cte.job_id
    RETURNING j.job_id, j.queue
)
INSERT INTO dl_job_events (job_id, queue, kind) SELECT job_id, queue, 'picked' FROM upd
RETURNING job_id
"""

#: The spec-floor's end: the spec's success of the jobs `$1`, and their `done` rows.
FLOOR_END = """
WITH upd AS (
    UPDATE dl_jobs SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL
    WHERE job_id = ANY($1::uuid[])
    RETURNING job_id, queue
)
INSERT INTO dl_job_events (job_id, queue, kind) SELECT job_id, queue, 'done' FROM upd
"""


async def profile_floor(bench: run.Bench, n: int, slots: int) -> Profile:
    """The statements of the spec-floor (`FLOOR_*`) enqueueing `n` jobs in batches of 1,000,
    and `slots` connections claiming and ending them 20 at a time until none is left."""
    await bench.empty_database()
    conn = await asyncpg.connect(bench.dsn)
    try:
        await conn.execute(FLOOR_SCHEMA)
    finally:
        await conn.close()

    async def worker() -> None:
        loop = await asyncpg.connect(bench.dsn)
        try:
            while claimed := [r["job_id"] for r in await loop.fetch(FLOOR_CLAIM, 20)]:
                await loop.execute(FLOOR_END, claimed)
        finally:
            await loop.close()

    async def work() -> None:
        enqueuer = await asyncpg.connect(bench.dsn)
        try:
            for first in range(0, n, 1000):
                batch = [uuid.uuid4() for _ in range(first, min(n, first + 1000))]
                await enqueuer.execute(FLOOR_ENQUEUE, batch)
        finally:
            await enqueuer.close()
        await asyncio.gather(*(worker() for _ in range(slots)))

    return await _profiled(bench.dsn, run.DBNAME, n, work)


async def profile_peer(bench: run.Bench, system: str, n: int, slots: int) -> Profile:
    """The statements of the harness's `system` enqueueing `n` jobs in batches of 1,000 and
    draining them (at `slots`, where the system takes a cap). Its rate and server CPU count
    the harness's start and its creation of the peer's database too."""

    async def work() -> None:
        await run._peer_run(bench, n, "drain", system, concurrency=slots)

    return await _profiled(bench.admin_dsn, PEER_DATABASES[system], n, work, sizes=False)


def print_profile(profile: Profile) -> None:
    statements, sizes, n = profile.statements, profile.sizes, profile.n
    total_ms = sum(s["ms"] for s in statements)
    total_wal = sum(int(s["wal_bytes"]) for s in statements)
    print(f"{n:,} jobs enqueued and drained at {profile.rate:,.0f} jobs/s (both timed);")
    print(f"server CPU {profile.server_cpu_s / n * 1e6:,.1f} µs per job (its processes);")
    per_job = f"{total_ms / n * 1000:,.1f} µs per job, WAL {total_wal / n:,.0f} bytes per job"
    print(f"statements' execution time {per_job}")
    print()
    print("| µs/job | share | calls/job | rows/job | blocks/job | WAL B/job | statement |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for s in statements:
        if s["ms"] < total_ms * 0.002:
            continue
        print(
            f"| {s['ms'] / n * 1000:,.1f} | {s['ms'] / total_ms:.0%} | {s['calls'] / n:.3f}"
            f" | {s['rows'] / n:.2f} | {s['blocks'] / n:.1f} | {int(s['wal_bytes']) / n:,.0f}"
            f" | `{s['query'][:110]}` |"
        )
    print()
    print("| relation | an index of | bytes per job |")
    print("| --- | --- | ---: |")
    for r in sizes:
        if r["bytes"] >= n:  # a byte a job or more
            print(f"| {r['relname']} | {r['of_table']} | {r['bytes'] / n:,.0f} |")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="a server's admin DSN")
    parser.add_argument("--n", type=int, default=20_000, help="jobs (default 20,000)")
    parser.add_argument(
        "--lock-free", action="store_true", help="jobs without a lock_key (no mutual exclusion)"
    )
    parser.add_argument("--slots", type=int, default=10, help="the Runner's slots (default 10)")
    parser.add_argument(
        "--peer", choices=sorted(PEER_DATABASES), help="profile this peer of the shared harness"
    )
    parser.add_argument(
        "--spec-floor", action="store_true", help="the least the spec's tables ask of a job"
    )
    options = parser.parse_args()
    bench = run.Bench(options.dsn, quick=False)
    if options.spec_floor:
        print_profile(await profile_floor(bench, options.n, options.slots))
    elif options.peer:
        print_profile(await profile_peer(bench, options.peer, options.n, options.slots))
    else:
        make = run.lock_free_job if options.lock_free else run.job
        print_profile(await profile(bench, options.n, make, options.slots))


if __name__ == "__main__":
    asyncio.run(main())
