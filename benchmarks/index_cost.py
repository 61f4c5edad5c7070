"""What the indexes beyond the claim's cost writes: a fresh database with every index, and
without those of a migration (0012: the job list's; 0014 and 0015: finished jobs for the
pruner, heartbeat entries, and 0017's running jobs per partition_key; 0016: a task's and a
partition_key's jobs newest first); 20,000 jobs enqueued in batches of 1,000, then drained by
10 slots. Three rounds rotating the variants; medians.

    python benchmarks/index_cost.py --dsn postgresql://postgres@127.0.0.1:55432/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import run

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
    "with": [],
}
JOBS = 20_000


async def once(bench: run.Bench, variant: str) -> tuple[float, float]:
    """(enqueue jobs/s, drain jobs/s) of one variant."""
    await bench.fresh_database()
    for statement in VARIANTS[variant]:
        await bench.sql(statement)
    started = time.perf_counter()
    await bench.bulk_insert(JOBS)
    enqueue = JOBS / (time.perf_counter() - started)
    return enqueue, JOBS / await bench.drain(JOBS, 10)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="a server's admin DSN")
    bench = run.Bench(parser.parse_args().dsn, quick=False)
    names = list(VARIANTS)
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for r in range(3):
        for name in names[r:] + names[:r]:
            figures[name].append(await once(bench, name))
    print("| variant | enqueue jobs/s | drain jobs/s |\n| --- | --- | --- |")
    for name, rounds in figures.items():
        enqueue = statistics.median(f[0] for f in rounds)
        drain = statistics.median(f[1] for f in rounds)
        print(f"| {name} | {enqueue:,.0f} | {drain:,.0f} |")


if __name__ == "__main__":
    asyncio.run(main())
