"""What the indexes beyond the claim's cost writes: a fresh database with every index, and
without those of a migration (0012: the job list's; 0014 and 0015: finished jobs for the
pruner, heartbeat entries, and 0017's running jobs per partition_key; 0016: a task's and a
partition_key's jobs newest first; 0021: the search of jobs by args); 20,000 jobs with args
of three keys enqueued in batches of 1,000, then drained by 10 slots, and the WAL written per
job by both. Three rounds rotating the variants; medians.

    python benchmarks/index_cost.py --dsn postgresql://postgres@127.0.0.1:55432/postgres
    python benchmarks/index_cost.py --dsn … --only without_0021 with
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import run

from dataloader import NewJob

#: Statements turning a freshly migrated database into each variant.
VARIANTS: dict[str, list[str]] = {
    "without_0012": ["DROP INDEX ix_dl_jobs_created", "DROP INDEX ix_dl_jobs_lock_key_hash"],
    "without_0014_0015": [
        "DROP INDEX ix_dl_jobs_finished",
        "DROP INDEX ix_dl_job_events_heartbeats",
        "DROP INDEX ix_dl_jobs_running_partition_hash",
    ],
    "without_0016": [
        "DROP INDEX ix_dl_jobs_task_created",
        "DROP INDEX ix_dl_jobs_partition_created",
    ],
    "without_0021": ["DROP INDEX ix_dl_jobs_args"],
    # the args index written straight into its trees, not through its pending list
    "0021_without_fastupdate": ["ALTER INDEX ix_dl_jobs_args SET (fastupdate = off)"],
    "with": [],
}
JOBS = 20_000


def job_with_args(i: int) -> NewJob:
    """A job as an ETL's: a day, a source and a number in its args."""
    return run.job(i, {"day": f"2026-01-{i % 28 + 1:02}", "source": f"s3://in/{i}.csv", "n": i})


async def once(bench: run.Bench, variant: str) -> tuple[float, float, float]:
    """(enqueue jobs/s, drain jobs/s, WAL bytes per job) of one variant."""
    await bench.fresh_database()
    for statement in VARIANTS[variant]:
        await bench.sql(statement)
    wal_before = await bench.sql("SELECT pg_current_wal_lsn()::text")
    started = time.perf_counter()
    await bench.bulk_insert(JOBS, job_with_args)
    enqueue = JOBS / (time.perf_counter() - started)
    drain = JOBS / await bench.drain(JOBS, 10)
    wal = await bench.sql(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::float8", wal_before
    )
    return enqueue, drain, wal / JOBS


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="a server's admin DSN")
    parser.add_argument("--only", nargs="*", choices=list(VARIANTS), help="these variants only")
    options = parser.parse_args()
    bench = run.Bench(options.dsn, quick=False)
    names = options.only or list(VARIANTS)
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    for r in range(3):
        for name in names[r:] + names[:r]:
            figures[name].append(await once(bench, name))
    print("| variant | enqueue jobs/s | drain jobs/s | WAL bytes/job |\n| --- | --- | --- | --- |")
    for name, rounds in figures.items():
        enqueue, drain, wal = (statistics.median(f[k] for f in rounds) for k in range(3))
        print(f"| {name} | {enqueue:,.0f} | {drain:,.0f} | {wal:,.0f} |")


if __name__ == "__main__":
    asyncio.run(main())
