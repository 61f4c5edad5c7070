"""What one job costs PostgreSQL, statement by statement: `n` no-op jobs (a lock_key each, or
none with `--lock-free`) are enqueued in batches of 1,000 and drained by 10 slots (`--slots`)
of a `Runner`, on a server with
`pg_stat_statements` loaded; then each statement's calls, server time, rows, buffers and WAL
per job are printed, the costliest first, and the database's tables and indexes by size.

    python benchmarks/statements.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

The server must have `shared_preload_libraries = 'pg_stat_statements'`; the extension is
created in the benchmark's database. Statements run by this script itself (resets, reads of
the statistics) are left out.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import run

from dataloader import NewJob

#: Per statement, its share of the drain: calls, time, rows, buffers touched and WAL.
PROFILE = """
SELECT regexp_replace(left(query, 400), '\\s+', ' ', 'g') AS query, calls,
       total_exec_time AS ms, rows, shared_blks_hit + shared_blks_read AS blocks,
       shared_blks_dirtied AS dirtied, wal_records, wal_bytes
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query NOT LIKE '%pg_stat_statements%'
ORDER BY total_exec_time DESC
"""

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


async def profile(
    bench: run.Bench, n: int, make: Callable[[int], NewJob] = run.job, slots: int = 10
) -> tuple[list[asyncpg.Record], list[Any], float]:
    """The statements of enqueueing and draining `n` jobs (`make(i)`) with `slots` slots,
    their sizes after, and jobs/s."""
    await bench.fresh_database()
    conn = await asyncpg.connect(bench.dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.execute("SELECT pg_stat_statements_reset()")
        started = time.perf_counter()
        await bench.bulk_insert(n, make)
        await bench.drain(n, slots)
        rate = n / (time.perf_counter() - started)
        statements = await conn.fetch(PROFILE)
        await conn.execute("VACUUM dl_jobs, dl_job_events")
        sizes = await conn.fetch(SIZES)
    finally:
        await conn.close()
    return statements, sizes, rate


def print_profile(statements: list[asyncpg.Record], sizes: list[Any], n: int, rate: float) -> None:
    total_ms = sum(s["ms"] for s in statements)
    total_wal = sum(int(s["wal_bytes"]) for s in statements)
    print(f"{n:,} jobs enqueued and drained at {rate:,.0f} jobs/s (both timed);")
    per_job = f"{total_ms / n * 1000:,.1f} µs per job, WAL {total_wal / n:,.0f} bytes per job"
    print(f"server time {per_job}")
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
    options = parser.parse_args()
    bench = run.Bench(options.dsn, quick=False)
    make = run.lock_free_job if options.lock_free else run.job
    statements, sizes, rate = await profile(bench, options.n, make, options.slots)
    print_profile(statements, sizes, options.n, rate)


if __name__ == "__main__":
    asyncio.run(main())
