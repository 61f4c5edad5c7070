"""Queue-table health over time: a steady enqueue rate drained by one worker process.

    python benchmarks/steady.py --dsn postgresql://postgres@127.0.0.1:55432/postgres \
        --rate 500 --seconds 600

Every `--sample` seconds it prints (and finally writes as JSON) the size of `dl_jobs` and of
its claim indexes, the dead tuples autovacuum has not reclaimed yet, and the p50/p99 of the
claim statement and of enqueue-to-start over the window. Healthy: the claim indexes, dead
tuples and latencies level off while the table grows only by the finished jobs it keeps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

import asyncpg
from run import DBNAME, QUEUE, RESULTS, Bench, admin_dsn, job  # benchmarks/ is on sys.path

from dataloader import JobContext, Runner, TaskRegistry

SIZES = """
SELECT pg_total_relation_size('dl_jobs') AS total,
       pg_relation_size('dl_jobs') AS heap,
       pg_relation_size('ix_dl_jobs_claim') AS claim_index_spec,
       pg_relation_size('ix_dl_jobs_claim_ready') AS claim_index,
       pg_relation_size('ix_dl_jobs_running_lease') AS lease_index,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'dl_jobs') AS dead_tuples,
       (SELECT count(*) FROM dl_jobs WHERE status = 'queued') AS queued,
       (SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'dl_jobs') AS autovacuums
"""


def p(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", help="admin DSN of a server (default: embedded PostgreSQL)")
    parser.add_argument("--rate", type=float, default=500, help="jobs enqueued per second")
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--sample", type=float, default=30, help="seconds per sample")
    args = parser.parse_args()
    bench = Bench(admin_dsn(args), quick=False)
    await bench.fresh_database()

    starts: list[float] = []
    registry = TaskRegistry()

    @registry.register("noop")
    async def record(ctx: JobContext[dict[str, Any]]) -> None:
        starts.append((time.time() - ctx.args["t0"]) * 1000)

    claims: list[float] = []
    samples: list[dict[str, Any]] = []
    watcher = await asyncpg.connect(bench.dsn)
    async with Runner(bench.settings(10), registry) as dl:
        assert dl.manager is not None
        repo = dl.manager.runtime.repo
        claim = repo.claim

        async def timed_claim(*a: Any, **k: Any) -> Any:
            started = time.perf_counter()
            try:
                return await claim(*a, **k)
            finally:
                claims.append((time.perf_counter() - started) * 1000)

        repo.claim = timed_claim  # type: ignore[method-assign]
        began = time.monotonic()
        next_sample = began + args.sample
        sent = 0
        while (now := time.monotonic()) - began < args.seconds:
            due = int((now - began) * args.rate)
            if due > sent:
                batch = [job(i, {"t0": time.time()}) for i in range(sent, due)]
                await dl.client.enqueue_many(batch)
                sent = due
            if now >= next_sample:
                row = dict(await watcher.fetchrow(SIZES))
                row.update(
                    t=round(now - began),
                    claim_p50_ms=p(claims, 50),
                    claim_p99_ms=p(claims, 99),
                    start_p50_ms=p(starts, 50),
                    start_p99_ms=p(starts, 99),
                )
                claims.clear()
                starts.clear()
                samples.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                next_sample += args.sample
            await asyncio.sleep(0.01)
    await watcher.close()
    out = RESULTS / f"steady-{datetime.now(UTC).strftime('%Y-%m-%dT%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rate": args.rate, "seconds": args.seconds, "samples": samples}))
    header = ("t", "queued", "total_MB", "claim_idx_kB", "dead", "claim_p99", "start_p99")
    print(" | ".join(header))
    for s in samples:
        print(
            f"{s['t']} | {s['queued']} | {s['total'] / 2**20:.1f} | "
            f"{(s['claim_index'] + s['claim_index_spec']) / 1024:.0f} | {s['dead_tuples']} | "
            f"{s['claim_p99_ms']:.2f} | {s['start_p99_ms']:.2f}"
        )
    print(f"\nJSON: {out} (database {DBNAME}, queue {QUEUE})")


if __name__ == "__main__":
    asyncio.run(main())
