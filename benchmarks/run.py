"""dataloader's benchmark suite: one command, a table on stdout, JSON in benchmarks/results/.

    python benchmarks/run.py                       # embedded PostgreSQL (no server needed)
    python benchmarks/run.py --dsn postgresql://postgres@127.0.0.1:55432/postgres
    python benchmarks/run.py --only drain_c10,latency --quick
    python benchmarks/run.py --only drain_pooled --pooler postgresql://postgres@127.0.0.1:6432/postgres

Every phase starts from a freshly created database `dl_bench` (migrated), runs the library or
the service exactly as users do (full protocol: lease, advisory lock per lock_key, journal,
fencing) with PostgreSQL's default durability, and reports jobs/s or milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.util
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx

from dataloader import (
    Batch,
    JobContext,
    NewJob,
    Process,
    ProcessResult,
    ProcessTask,
    Runner,
    Settings,
    TaskRegistry,
    WorkerSpec,
    metrics,
)
from dataloader.api import create_app
from dataloader.maintenance.pruner import Pruner, Retention
from dataloader.storage.connections import GuardedPool
from dataloader.storage.embedded import get_server
from dataloader.storage.maintenance import MaintenanceStore

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: The shared side-by-side harness and pgqueuer's virtual environment (benchmarks/peers.sh
#: builds it): when both are there, `service_drain` runs pgqueuer out of the box beside us.
HARNESS = Path(os.environ.get("BENCH_HARNESS", ROOT.parent / "shared" / "bench"))
PEER_PYTHON = Path(os.environ.get("VENVS", "/tmp/bench-venvs")) / "pgqueuer" / "bin" / "python"
DBNAME = "dl_bench"
QUEUE = "bench"

Phase = Callable[["Bench"], Awaitable[dict[str, Any]]]
PHASES: dict[str, Phase] = {}


def phase(name: str) -> Callable[[Phase], Phase]:
    def register(fn: Phase) -> Phase:
        PHASES[name] = fn
        return fn

    return register


def with_database(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


def percentile(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(p) - 1]


def job(i: int, args: dict[str, Any] | None = None) -> NewJob:
    return NewJob(queue=QUEUE, task="noop", lock_key=f"job-{i}", args=args or {})


def lock_free_job(i: int) -> NewJob:
    """A job that excludes no other (no lock_key): no advisory lock, no key bookkeeping."""
    return NewJob(queue=QUEUE, task="noop")


class Bench:
    """Database handling shared by the phases."""

    def __init__(self, admin_dsn: str, quick: bool, pooler: str | None = None) -> None:
        self.admin_dsn = admin_dsn
        self.dsn = with_database(admin_dsn, DBNAME)
        self.quick = quick
        #: The benchmark's database through a transaction-pooling PgBouncer (--pooler).
        self.pooled_dsn = None if pooler is None else with_database(pooler, DBNAME)

    def n(self, full: int) -> int:
        return max(1, full // 10) if self.quick else full

    async def empty_database(self) -> None:
        """The benchmark's database, created anew and empty."""
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{DBNAME}" WITH (FORCE)')
            await conn.execute(f'CREATE DATABASE "{DBNAME}"')
        finally:
            await conn.close()

    async def fresh_database(self) -> None:
        """The benchmark's database, created anew with dataloader's schema."""
        await self.empty_database()
        async with Runner(self.settings(auto_migrate=True), run_workers=False):
            pass

    def settings(self, concurrency: int = 1, **overrides: Any) -> Settings:
        return Settings(  # type: ignore[call-arg]
            _env_file=None,
            **(
                {
                    "db_dsn": self.dsn,
                    "workers": [WorkerSpec(queue=QUEUE, concurrency=concurrency)],
                    "auto_migrate": False,
                }
                | overrides
            ),
        )

    async def sql(self, query: str, *args: Any) -> Any:
        conn = await asyncpg.connect(self.dsn)
        try:
            return await conn.fetchval(query, *args)
        finally:
            await conn.close()

    async def bulk_insert(self, n: int, make: Callable[[int], NewJob] = job) -> None:
        """Enqueue `make(i)` for i in range(n), 1,000 jobs per batch."""
        async with Runner(self.settings(), run_workers=False) as dl:
            for start in range(0, n, 1000):
                await dl.client.enqueue_many([make(i) for i in range(start, min(n, start + 1000))])

    async def drain(self, n: int, concurrency: int, **overrides: Any) -> float:
        """Seconds to run `n` queued no-op jobs to `succeeded` (worker start and stop included)."""
        registry = noop_registry()
        started = time.perf_counter()
        async with Runner(self.settings(concurrency, **overrides), registry) as dl:
            await dl.run_until_empty()
        elapsed = time.perf_counter() - started
        done = await self.sql("SELECT count(*) FROM dl_jobs WHERE status = 'succeeded'")
        if done != n:
            raise RuntimeError(f"drain incomplete: {done} of {n} succeeded")
        return elapsed


def noop_registry() -> TaskRegistry:
    registry = TaskRegistry()

    @registry.register("noop")
    async def noop(ctx: JobContext[dict[str, Any]]) -> None:
        return None

    return registry


@phase("enqueue_single")
async def enqueue_single(b: Bench) -> dict[str, Any]:
    n = b.n(2000)
    async with Runner(b.settings(), run_workers=False) as dl:
        started = time.perf_counter()
        for i in range(n):
            await dl.client.enqueue(job(i))
        elapsed = time.perf_counter() - started
    return {"jobs": n, "jobs_per_s": n / elapsed}


@phase("enqueue_bulk")
async def enqueue_bulk(b: Bench) -> dict[str, Any]:
    """`enqueue_many` of 1,000 jobs per call on a fresh database: jobs with a lock_key each
    (`keyed`), jobs without one (`lock_free`), and the harness's pgqueuer batch enqueue
    (`pgqueuer`, when the shared harness is there: jobs/s only, as the harness creates its
    schema in the same run); jobs/s and the server's CPU per job, in rounds that rotate the
    order; medians."""
    n, rounds = b.n(20000), 1 if b.quick else 3

    async def ours(make: Callable[[int], NewJob]) -> dict[str, float]:
        await b.fresh_database()
        server_before, started = _server_cpu_seconds(), time.perf_counter()
        await b.bulk_insert(n, make)
        elapsed, server = time.perf_counter() - started, _server_cpu_seconds() - server_before
        return {"jobs_per_s": n / elapsed, "server_cpu_us_per_job": server / n * 1e6}

    async def pgqueuer() -> dict[str, float]:
        return {"jobs_per_s": await _peer_run(b, n, "batch", "pgqueuer")}

    kinds: dict[str, Callable[[], Awaitable[dict[str, float]]]] = {
        "keyed": lambda: ours(job),
        "lock_free": lambda: ours(lock_free_job),
    }
    if _has_peer():
        kinds["pgqueuer"] = pgqueuer
    result: dict[str, Any] = {"jobs": n, "batch": 1000, "rounds": rounds}
    result |= await _rotated(kinds, rounds)
    if "pgqueuer_jobs_per_s" in result:
        for kind in ("keyed", "lock_free"):
            result[f"{kind}_vs_pgqueuer"] = (
                result[f"{kind}_jobs_per_s"] / result["pgqueuer_jobs_per_s"]
            )
    return result


def _drain_phase(concurrency: int) -> Phase:
    async def run(b: Bench) -> dict[str, Any]:
        n = b.n(20000 if concurrency > 1 else 5000)
        await b.bulk_insert(n)
        elapsed = await b.drain(n, concurrency)
        return {"jobs": n, "concurrency": concurrency, "jobs_per_s": n / elapsed}

    return run


for _c in (1, 10, 50):
    phase(f"drain_c{_c}")(_drain_phase(_c))


@phase("drain_pooled")
async def drain_pooled(b: Bench) -> dict[str, Any]:
    """No-op jobs (a lock_key each) drained by one process of 10 slots, straight to the server
    and through a transaction-pooling PgBouncer (--pooler: DL_DB_DSN through it,
    DL_DB_DIRECT_DSN straight for the locks and LISTEN), alternating, three rounds of each on
    fresh databases: the medians, and their ratio."""
    if b.pooled_dsn is None:
        raise SystemExit("drain_pooled needs --pooler, a transaction-pooling PgBouncer's DSN")
    n = b.n(20000)
    routes: dict[str, dict[str, Any]] = {
        "direct": {},
        "pgbouncer": {"db_dsn": b.pooled_dsn, "db_direct_dsn": b.dsn},
    }
    rates: dict[str, list[float]] = {route: [] for route in routes}
    for i in range(1 if b.quick else 3):
        for route, overrides in routes.items():
            if i or route != "direct":  # the phase starts on a fresh database
                await b.fresh_database()
            await b.bulk_insert(n)
            rates[route].append(n / await b.drain(n, 10, **overrides))
    direct, pooled = (statistics.median(rates[route]) for route in routes)
    return {
        "jobs": n,
        "concurrency": 10,
        "direct_jobs_per_s": direct,
        "pgbouncer_jobs_per_s": pooled,
        "pgbouncer_ratio": pooled / direct,
        "rounds": [dict(zip(routes, r, strict=True)) for r in zip(*rates.values(), strict=True)],
    }


@phase("drain_2proc")
async def drain_two_processes(b: Bench) -> dict[str, Any]:
    """Independent no-op jobs (`demo.noop`, a lock_key each) drained by two worker processes of
    10 slots each, timed from the commit that enqueues them all, once both processes listen, to
    the last one's end: the processes' start (interpreter, imports, pools) is not timed.
    Medians of three rounds."""
    return await _medians(b, lambda: _drain_two_processes_once(b))


async def _drain_two_processes_once(b: Bench) -> dict[str, Any]:
    jobs = [NewJob(queue=QUEUE, task="demo.noop", lock_key=f"job-{i}") for i in range(b.n(20000))]
    return await _drain_by_processes(b, jobs, processes=2, slots=10)


@phase("latency")
async def latency(b: Bench) -> dict[str, Any]:
    samples, warmup, interval = b.n(200), 5, 0.02
    seen: dict[int, float] = {}
    all_seen = asyncio.Event()
    registry = TaskRegistry()

    @registry.register("noop")
    async def record(ctx: JobContext[dict[str, Any]]) -> None:
        seen[ctx.args["i"]] = time.perf_counter() - ctx.args["t0"]
        if len(seen) == warmup + samples:
            all_seen.set()

    async with Runner(b.settings(10), registry) as dl:
        await asyncio.sleep(1.0)  # the listener reaches LISTEN
        for i in range(warmup + samples):
            await dl.client.enqueue(job(i, {"i": i, "t0": time.perf_counter()}))
            await asyncio.sleep(interval)
        await asyncio.wait_for(all_seen.wait(), timeout=30)
    values = [seen[i] * 1000 for i in range(warmup, warmup + samples)]
    return {
        "samples": samples,
        "p50_ms": percentile(values, 50),
        "p95_ms": percentile(values, 95),
        "p99_ms": percentile(values, 99),
        "max_ms": max(values),
    }


@phase("delayed_latency")
async def delayed_latency(b: Bench) -> dict[str, Any]:
    """On an idle worker, one job at a time delayed by a second (the database's clock, as a
    durable process's `SetTimer(in_sec=1)` is): how late each starts after it came due, by the
    database's clock (`attempted_at - available_at`)."""
    samples = b.n(40)
    registry = TaskRegistry()

    @registry.register("noop")
    async def noop(ctx: JobContext[dict[str, Any]]) -> None:
        return None

    late_ms = []
    async with Runner(b.settings(10), registry) as dl:
        await asyncio.sleep(1.0)  # the listener reaches LISTEN
        for i in range(samples):
            new = NewJob(queue=QUEUE, task="noop", lock_key=f"job-{i}", delay=timedelta(seconds=1))
            ended = await dl.client.wait((await dl.client.enqueue(new)).job_id, timeout=30)
            assert ended.attempted_at is not None
            late_ms.append((ended.attempted_at - ended.available_at).total_seconds() * 1000)
    return {
        "samples": samples,
        "p50_ms": percentile(late_ms, 50),
        "p95_ms": percentile(late_ms, 95),
        "max_ms": max(late_ms),
        "late_over_100ms": sum(value > 100 for value in late_ms),
    }


async def _first_jobs_rate(b: Bench, backlog: int, measured: int) -> float:
    """jobs/s over the first `measured` jobs drained out of `backlog` ready ones."""
    await b.fresh_database()
    conn = await asyncpg.connect(b.dsn)
    try:
        # Setup data straight in SQL (no `queued` events): only the claim path is measured.
        await conn.execute(
            "INSERT INTO dl_jobs (job_id, queue, task, lock_key, created_at)"
            " SELECT gen_random_uuid(), $1, 'noop', 'job-' || i,"
            " now() - make_interval(secs => $2 - i) FROM generate_series(1, $2) AS i",
            QUEUE,
            backlog,
        )
        await conn.execute("VACUUM ANALYZE dl_jobs")
    finally:
        await conn.close()
    handled = 0
    reached = asyncio.Event()
    registry = TaskRegistry()

    @registry.register("noop")
    async def count(ctx: JobContext[dict[str, Any]]) -> None:
        nonlocal handled
        handled += 1
        if handled == measured:
            reached.set()

    async with Runner(b.settings(10), registry):
        started = time.perf_counter()
        await asyncio.wait_for(reached.wait(), timeout=600)
        elapsed = time.perf_counter() - started
    return measured / elapsed


@phase("backlog")
async def backlog(b: Bench) -> dict[str, Any]:
    measured = b.n(10000)
    small = await _first_jobs_rate(b, b.n(10000) + measured, measured)
    large = await _first_jobs_rate(b, b.n(1_000_000), measured)
    return {
        "measured_jobs": measured,
        "jobs_per_s_10k": small,
        "jobs_per_s_1m": large,
        "ratio": large / small,
    }


async def _hot_key_runs(b: Bench) -> None:
    """One job of lock_key `hot` runs (a lease of an hour, held by nobody here)."""
    await b.sql(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, attempt, started_at,"
        " heartbeat_at, lease_expires_at, claim_token)"
        " VALUES (gen_random_uuid(), $1, 'noop', 'hot', 'running', 1, now(), now(),"
        " now() + interval '1 hour', gen_random_uuid())",
        QUEUE,
    )


async def _running_key_enqueued(b: Bench, n: int) -> None:
    """One job of lock_key `hot` runs and `n` more of that key, older than every plain job,
    enqueued through the client as users do, wait for it."""
    await _hot_key_runs(b)
    await b.bulk_insert(n, lambda i: NewJob(queue=QUEUE, task="noop", lock_key="hot"))


async def _running_key(b: Bench, n: int) -> None:
    """The same rows written in plain SQL, as another program would."""
    await _hot_key_runs(b)
    await b.sql(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, created_at)"
        " SELECT gen_random_uuid(), $1, 'noop', 'hot', now() - interval '1 day'"
        " + i * interval '1 ms' FROM generate_series(1, $2) AS i",
        QUEUE,
        n,
    )


async def _delayed_ahead(b: Bench, n: int) -> None:
    """`n` jobs due tomorrow at priority 0, ahead of the plain jobs (priority 100), enqueued
    through the client as users do."""
    await b.bulk_insert(
        n,
        lambda i: NewJob(
            queue=QUEUE, task="noop", lock_key=f"later-{i}", priority=0, delay=timedelta(days=1)
        ),
    )


async def _delayed_ahead_in_sql(b: Bench, n: int) -> None:
    """The same rows written in plain SQL, as another program would: no claim has met them."""
    await b.sql(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, priority, available_at)"
        " SELECT gen_random_uuid(), $1, 'noop', 'later-' || i, 0, now() + interval '1 day'"
        " FROM generate_series(1, $2) AS i",
        QUEUE,
        n,
    )


async def _nothing(b: Bench, n: int) -> None:
    return None


#: Rows that cannot run, set up ahead of the plain jobs in claim order (see `blocked`).
BLOCKERS: dict[str, Callable[[Bench, int], Awaitable[None]]] = {
    "plain": _nothing,
    "running_key_enqueued": _running_key_enqueued,
    "running_key": _running_key,
    "delayed_ahead": _delayed_ahead,
    "delayed_ahead_sql": _delayed_ahead_in_sql,
}


async def _drain_behind(
    b: Bench, setup: Callable[[Bench, int], Awaitable[None]], blocked: int, plain: int
) -> float:
    """jobs/s of draining `plain` ready jobs (distinct lock keys) behind `blocked` rows that
    cannot run, set up by `setup`."""
    await b.fresh_database()
    await setup(b, blocked)
    await b.sql("VACUUM ANALYZE dl_jobs")
    await b.bulk_insert(plain)
    handled = 0
    done = asyncio.Event()
    registry = TaskRegistry()

    @registry.register("noop")
    async def count(ctx: JobContext[dict[str, Any]]) -> None:
        nonlocal handled
        handled += 1
        if handled == plain:
            done.set()

    started = time.perf_counter()
    async with Runner(b.settings(10), registry):
        await asyncio.wait_for(done.wait(), timeout=600)
        elapsed = time.perf_counter() - started
    return plain / elapsed


@phase("blocked")
async def blocked(b: Bench) -> dict[str, Any]:
    """The drain of ready jobs behind rows that cannot run: a running lock_key's queue, a
    calendar of delayed jobs. Each shape against the plain drain, measured alike, in rounds
    that rotate the order of the shapes (what one shape leaves the server to do, a checkpoint,
    autovacuum, falls on a different one each round); medians."""
    plain, blocked, rounds = b.n(20000), b.n(50000), 1 if b.quick else 3
    rates: dict[str, list[float]] = {name: [] for name in BLOCKERS}
    names = list(BLOCKERS)
    for i in range(rounds):
        for name in names[i:] + names[:i]:
            rates[name].append(await _drain_behind(b, BLOCKERS[name], blocked, plain))
    result: dict[str, Any] = {"jobs": plain, "blocked_rows": blocked, "rounds": rounds}
    for name, values in rates.items():
        result[f"{name}_jobs_per_s"] = statistics.median(values)
    for name in names[1:]:
        result[f"{name}_ratio"] = result[f"{name}_jobs_per_s"] / result["plain_jobs_per_s"]
    return result


async def _post(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, body: bytes
) -> bytes:
    """One keep-alive HTTP/1.1 POST of JSON; returns the answer's body (200 expected).

    A bare asyncio client: a full-featured one would spend more CPU than the server measured.
    """
    head = (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    writer.write(head + body)
    status = await reader.readline()
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    answer = await reader.readexactly(length)
    if b" 200 " not in status:
        raise RuntimeError(f"{path} answered {status!r}: {answer[:200]!r}")
    return answer


async def _http_load(port: int, requests: int, clients: int) -> list[float]:
    """Trigger `requests` jobs from `clients` keep-alive connections; returns latencies (ms)."""
    latencies: list[float] = []
    counter = iter(range(requests))

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i in counter:
                body = json.dumps({"queue": "http", "task": "noop", "lock_key": f"http-{i}"})
                started = time.perf_counter()
                await _post(reader, writer, "/api/v1/jobs/trigger", body.encode())
                latencies.append((time.perf_counter() - started) * 1000)
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies


def _start_service(b: Bench, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DL_")}
    # the service as users run it: its defaults (INFO logs) unless `env` says otherwise
    full_env.update({"DL_DB_DSN": b.dsn, "DL_HTTP_PORT": str(port)})
    full_env.update(env)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dataloader"],
        env=full_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, port


async def _wait_healthy(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: bench\r\n\r\n")
            if b" 200 " in await reader.readline():
                writer.close()
                return
            writer.close()
        except OSError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError("service did not become healthy")


async def _medians(b: Bench, once: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """`once` run three times (once with --quick), each on a fresh database: the median of
    each figure, and the figures of every round under `rounds`."""
    rounds = []
    for i in range(1 if b.quick else 3):
        if i:
            await b.fresh_database()
        rounds.append(await once())
    result = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    return result | {"rounds": rounds}


@phase("trigger_cost")
async def trigger_cost(b: Bench) -> dict[str, Any]:
    """What one HTTP trigger costs the service's process, in it: the application called
    through ASGI (no socket, no client in the process's CPU), as `http_trigger` calls it. The
    process's CPU per trigger from 32 callers at once (the median of 5 runs of 2,000), and
    the Python calls per trigger (one at a time, 200): a count that the machine's noise does
    not move, so that a change of a few per cent shows between two revisions."""
    settings = b.settings(workers=[], allow_unknown_tasks=True)
    app = create_app(settings, TaskRegistry(), run_workers=False)
    requests = b.n(2000)
    async with app.router.lifespan_context(app):
        trigger = _asgi_trigger(app)
        for i in range(200):  # warm-up: connections opened, caches filled
            await trigger(f"warm-{i}")
        rounds = []
        for r in range(5):
            keys = iter(range(requests))

            async def caller(r: int = r, keys: Any = keys) -> None:
                for i in keys:
                    await trigger(f"cost-{r}-{i}")

            cpu = time.process_time()
            await asyncio.gather(*(caller() for _ in range(32)))
            rounds.append((time.process_time() - cpu) / requests * 1e6)
        calls = 0

        def count(frame: Any, event: str, arg: Any) -> None:
            nonlocal calls
            if event in ("call", "c_call"):
                calls += 1

        sys.setprofile(count)
        try:
            for i in range(200):
                await trigger(f"counted-{i}")
        finally:
            sys.setprofile(None)
    return {
        "requests": requests,
        "cpu_us_per_trigger": statistics.median(rounds),
        "python_calls_per_trigger": calls / 200,
    }


def _asgi_trigger(app: Any) -> Callable[[str], Awaitable[None]]:
    """A trigger of a no-op job with lock_key `key`, through `app`'s ASGI interface as a
    server would call it; RuntimeError unless answered 200."""

    async def trigger(key: str) -> None:
        body = json.dumps({"queue": "http", "task": "noop", "lock_key": key}).encode()
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        answered: list[int] = []

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await asyncio.Event().wait()  # a disconnect never comes: the request is whole
            raise AssertionError

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                answered.append(message["status"])

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/api/v1/jobs/trigger",
            "raw_path": b"/api/v1/jobs/trigger",
            "root_path": "",
            "query_string": b"",
            "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 50000),
            "headers": [
                (b"host", b"bench"),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
        await app(scope, receive, send)
        if answered != [200]:
            raise RuntimeError(f"the trigger answered {answered}")

    return trigger


@phase("http_trigger")
async def http_trigger(b: Bench) -> dict[str, Any]:
    """Triggers from 32 keep-alive connections to one service process without workers."""
    return await _medians(b, lambda: _http_trigger_once(b))


async def _http_trigger_once(b: Bench) -> dict[str, Any]:
    requests, clients = b.n(10000), 32
    # The API alone: no process serves queue `http` or knows task `noop`, so the unknown-task
    # check is off (with it on, a trigger's check is a lookup in a set cached for a second).
    proc, port = _start_service(b, {"WORKERS_JSON": "[]", "DL_ALLOW_UNKNOWN_TASKS": "true"})
    try:
        await _wait_healthy(port)
        await _http_load(port, 200, clients)  # warm-up
        started = time.perf_counter()
        values = await _http_load(port, requests, clients)
        elapsed = time.perf_counter() - started
    finally:
        proc.terminate()
        proc.wait(30)
    return {
        "requests": requests,
        "clients": clients,
        "requests_per_s": requests / elapsed,
        "p50_ms": percentile(values, 50),
        "p99_ms": percentile(values, 99),
    }


async def _until_drained(b: Bench, timeout: float = 600) -> float:
    """Wait until no job is queued or running; returns the perf_counter time it was seen.
    Polled every 20 ms through the claim's indexes (a fraction of a millisecond a probe)."""
    conn = await asyncpg.connect(b.dsn)
    try:
        deadline = time.perf_counter() + timeout
        while await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM dl_jobs WHERE status IN ('queued', 'running'))"
        ):
            if time.perf_counter() > deadline:
                raise RuntimeError("the drain did not end in time")
            await asyncio.sleep(0.02)
        return time.perf_counter()
    finally:
        await conn.close()


async def _until_listening(b: Bench, processes: int) -> None:
    """Wait until `processes` worker processes have their LISTEN connection up."""
    deadline = time.monotonic() + 30
    while (
        await b.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1"
            " AND application_name = 'dataloader-listener' AND query LIKE 'LISTEN%'",
            DBNAME,
        )
        < processes
    ):
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not start listening")
        await asyncio.sleep(0.05)


def _serve_in_process(dsn: str, concurrency: int) -> None:
    """A library user's worker process: `Runner` with the built-in tasks, until terminated."""
    import dataloader.workers.pipelines.demo  # noqa: F401  (registers demo.noop)

    async def main() -> None:
        settings = Settings(  # type: ignore[call-arg]
            _env_file=None,
            db_dsn=dsn,
            workers=[WorkerSpec(queue=QUEUE, concurrency=concurrency)],
            auto_migrate=False,
        )
        async with Runner(settings):
            await asyncio.Event().wait()

    asyncio.run(main())


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_cpu_seconds() -> float:
    """CPU time used by this host's PostgreSQL processes (the benchmark's server runs here:
    the harness's, or the embedded one): those alive now, and through the postmaster's count
    of its ended children, the backends that have exited."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        if text.split(" (", 1)[1].startswith("postgres)"):
            fields = text.rsplit(")", 1)[1].split()
            own, children = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
            total += (own + children) / os.sysconf("SC_CLK_TCK")
    return total


async def _drain_by(b: Bench, kind: str, jobs: list[NewJob], concurrency: int) -> dict[str, float]:
    """Drain `jobs`, enqueued in one transaction once the workers listen, by one worker process
    of `kind`: `service` (`python -m dataloader` as users run it: default log level, HTTP API)
    or `library` (a `Runner` in a process of its own). Returns jobs/s and the process's CPU
    time per job."""
    await b.fresh_database()
    workers = json.dumps([{"queue": QUEUE, "concurrency": concurrency}])
    if kind == "service":
        service, _ = _start_service(b, {"WORKERS_JSON": workers})
        pid, stop = service.pid, service.terminate
    else:
        child = multiprocessing.get_context("spawn").Process(
            target=_serve_in_process, args=(b.dsn, concurrency)
        )
        child.start()
        assert child.pid is not None
        pid, stop = child.pid, child.terminate
    try:
        await _until_listening(b, 1)
        async with Runner(b.settings(), run_workers=False) as dl:
            await dl.client.enqueue_many(jobs)
        cpu_before, server_before = _cpu_seconds(pid), _server_cpu_seconds()
        started = time.perf_counter()
        ended = await _until_drained(b)
        cpu = _cpu_seconds(pid) - cpu_before
        server = _server_cpu_seconds() - server_before
    finally:
        stop()
        await asyncio.to_thread(os.waitpid, pid, 0)
    return {
        "jobs_per_s": len(jobs) / (ended - started),
        "cpu_us_per_job": cpu / len(jobs) * 1e6,
        "server_cpu_us_per_job": server / len(jobs) * 1e6,
    }


async def _rotated(
    kinds: dict[str, Callable[[], Awaitable[dict[str, float]]]], rounds: int
) -> dict[str, float]:
    """Each kind's measures, `rounds` times in an order that rotates every round (what one
    leaves the server to do, a checkpoint, autovacuum, falls on a different one each round):
    {f"{kind}_{measure}": median}."""
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    names = list(kinds)
    for i in range(rounds):
        for kind in names[i % len(names) :] + names[: i % len(names)]:
            runs[kind].append(await kinds[kind]())
    return {
        f"{kind}_{measure}": statistics.median(v[measure] for v in values)
        for kind, values in runs.items()
        for measure in values[0]
    }


def _has_peer() -> bool:
    """Whether the shared harness and pgqueuer's virtual environment are there."""
    return PEER_PYTHON.exists() and (HARNESS / "run.py").exists()


async def _peer_run(b: Bench, n: int, harness_phase: str, system: str, **options: int) -> float:
    """The figure of the harness's `harness_phase` (`drain`: jobs/s of the worker's whole
    run, start and stop included; `batch`: jobs/s of its enqueue in batches of 1,000) for
    `system` on `n` jobs, with the harness's `options` (concurrency=…)."""
    command = [str(PEER_PYTHON), str(HARNESS / "run.py"), "--system", system]
    command += ["--dsn", b.admin_dsn, "--n", str(n), "--phases", harness_phase]
    for name, value in options.items():
        command += [f"--{name}", str(value)]
    out = await asyncio.to_thread(
        subprocess.run, command, cwd=HARNESS, capture_output=True, check=True
    )
    figure = {"drain": "drain_jobs_per_s", "batch": "enqueue_batch_jobs_per_s"}[harness_phase]
    return float(json.loads(out.stdout)[figure])


async def _peer_drain(
    b: Bench, n: int, system: str = "pgqueuer_defaults", concurrency: int | None = None
) -> dict[str, float]:
    """pgqueuer out of the box (the harness's `pgqueuer_defaults`: batch 10, no concurrency
    cap), or the harness's `system` at `concurrency`, draining `n` jobs, timed by the harness
    around its worker's whole run (start and stop included). The server's CPU per job counts
    the harness's enqueue of the jobs too."""
    options = {} if concurrency is None else {"concurrency": concurrency}
    server_before = _server_cpu_seconds()
    jobs_per_s = await _peer_run(b, n, "drain", system, **options)
    server = _server_cpu_seconds() - server_before
    return {"jobs_per_s": jobs_per_s, "server_cpu_us_per_job_with_enqueue": server / n * 1e6}


@phase("service_drain")
async def service_drain(b: Bench) -> dict[str, Any]:
    """The service against the library on the same jobs: `demo.noop` jobs with distinct lock
    keys enqueued in one transaction, drained at concurrency 10 by `python -m dataloader` (its
    defaults: INFO logs, the HTTP API) or by a `Runner`; the service on the same number of
    jobs without a lock_key (`service_lock_free`: no mutual exclusion, as a pgqueuer job);
    and pgqueuer out of the box when the shared harness is there. In rounds that rotate the
    order; medians."""
    n, rounds = b.n(20000), 1 if b.quick else 3
    jobs = [NewJob(queue=QUEUE, task="demo.noop", lock_key=f"job-{i}") for i in range(n)]
    free = [NewJob(queue=QUEUE, task="demo.noop") for _ in range(n)]
    kinds: dict[str, Callable[[], Awaitable[dict[str, float]]]] = {
        "service": lambda: _drain_by(b, "service", jobs, 10),
        "service_lock_free": lambda: _drain_by(b, "service", free, 10),
        "library": lambda: _drain_by(b, "library", jobs, 10),
    }
    if _has_peer():
        kinds["pgqueuer_defaults"] = lambda: _peer_drain(b, n)
    result: dict[str, Any] = {"jobs": n, "concurrency": 10, "rounds": rounds}
    result |= await _rotated(kinds, rounds)
    result["ratio"] = result["service_jobs_per_s"] / result["library_jobs_per_s"]
    if "pgqueuer_defaults_jobs_per_s" in result:
        for kind in ("service", "service_lock_free"):
            result[f"{kind}_vs_pgqueuer_defaults"] = (
                result[f"{kind}_jobs_per_s"] / result["pgqueuer_defaults_jobs_per_s"]
            )
    return result


#: Slots of the worker process compared by `drain_slots`.
DRAIN_SLOTS = (10, 128, 256)


@phase("drain_slots")
async def drain_slots(b: Bench) -> dict[str, Any]:
    """How the drain grows with concurrency: the service (`python -m dataloader`, one process)
    draining `demo.noop` jobs without a lock_key, and with a lock_key each, at 10, 128 and
    256 slots; and pgqueuer (the harness's `pgqueuer`, one worker process) at the same
    concurrency, when the shared harness is there. Jobs/s and the server's CPU per job, for
    each; rounds that rotate the order, medians."""
    n, rounds = b.n(20000), 1 if b.quick else 3
    free = [NewJob(queue=QUEUE, task="demo.noop") for _ in range(n)]
    keyed = [NewJob(queue=QUEUE, task="demo.noop", lock_key=f"job-{i}") for i in range(n)]
    kinds: dict[str, Callable[[], Awaitable[dict[str, float]]]] = {}
    for slots in DRAIN_SLOTS:
        kinds[f"lock_free_{slots}"] = functools.partial(_drain_by, b, "service", free, slots)
        kinds[f"keyed_{slots}"] = functools.partial(_drain_by, b, "service", keyed, slots)
        if _has_peer():
            kinds[f"pgqueuer_{slots}"] = functools.partial(_peer_drain, b, n, "pgqueuer", slots)
    result: dict[str, Any] = {"jobs": n, "slots": list(DRAIN_SLOTS), "rounds": rounds}
    return result | await _rotated(kinds, rounds)


#: Batch sizes compared by `batch_sizes` (1: the single-job handler).
BATCH_SIZES = (1, 10, 100)


def sink_registry(size: int) -> TaskRegistry:
    """A small job: one row into a target table. One insert per job (`size` 1), or one per
    batch of up to `size` jobs."""
    registry = TaskRegistry()

    @registry.task("sink.one")
    async def one(ctx: JobContext[dict[str, Any]]) -> None:
        await ctx.resources.execute("INSERT INTO bench_sink VALUES ($1)", ctx.args["n"])

    @registry.task("sink.batch", queue=QUEUE, batch_size=max(2, size))
    async def many(batch: Batch[dict[str, Any]]) -> None:
        rows = [item.args["n"] for item in batch]
        await batch.resources.execute("INSERT INTO bench_sink SELECT unnest($1::int[])", rows)
        for item in batch:
            batch.done(item)

    return registry if size > 1 else registry.only(lambda task: task.name == "sink.one")


@contextlib.asynccontextmanager
async def _sink_pool(app: Any) -> AsyncIterator[asyncpg.Pool]:
    async with asyncpg.create_pool(app.dsn, min_size=4, max_size=4) as pool:
        yield pool


@phase("batch_sizes")
async def batch_sizes(b: Bench) -> dict[str, Any]:
    """Small jobs (one row into a target table each) drained by 4 slots, by a single-job
    handler and by batch handlers of 10 and 100; rounds rotate the order of the sizes."""
    n = b.n(10000)
    rates: dict[int, list[float]] = {size: [] for size in BATCH_SIZES}
    for r in range(1 if b.quick else 3):
        for size in BATCH_SIZES[r:] + BATCH_SIZES[:r]:
            await b.fresh_database()
            await b.sql("CREATE TABLE bench_sink (n int)")
            task = "sink.one" if size == 1 else "sink.batch"
            await b.bulk_insert(
                n, lambda i, t=task: NewJob(queue=QUEUE, task=t, lock_key=f"j{i}", args={"n": i})
            )
            started = time.perf_counter()
            async with Runner(b.settings(4), sink_registry(size), startup=_sink_pool) as dl:
                await dl.run_until_empty()
            rates[size].append(n / (time.perf_counter() - started))
            if await b.sql("SELECT count(*) FROM bench_sink") != n:
                raise RuntimeError(f"batch {size}: the sink lacks rows")
    result: dict[str, Any] = {"jobs": n, "slots": 4}
    for size in BATCH_SIZES:
        result[f"batch{size}_jobs_per_s"] = statistics.median(rates[size])
    result["rounds"] = {f"batch{size}": rates[size] for size in BATCH_SIZES}
    return result


#: The queues of `shared_slots`, and the two ways of serving them with 6 slots.
SHARED_QUEUES = ("bench.a", "bench.b", "bench.c")
SLOT_LAYOUTS: dict[str, list[dict[str, Any]]] = {
    "own_slots": [{"queue": q, "concurrency": 2} for q in SHARED_QUEUES],
    "shared_batch1": [{"queues": list(SHARED_QUEUES), "concurrency": 6}],
    "shared_batch10": [
        {
            "queues": list(SHARED_QUEUES),
            "concurrency": 6,
            "batch_size": dict.fromkeys(SHARED_QUEUES, 10),
        }
    ],
}


def _cycles() -> tuple[float, float]:
    """(cycles, their seconds in all) observed so far in this process, over every queue."""
    count = total = 0.0
    for family in metrics.CYCLE_DURATION.collect():
        for sample in family.samples:
            if sample.name.endswith("_count"):
                count += sample.value
            elif sample.name.endswith("_sum"):
                total += sample.value
    return count, total


@phase("shared_slots")
async def shared_slots(b: Bench) -> dict[str, Any]:
    """No-op jobs in three queues drained by 6 slots: 2 of each queue's own, or 6 shared
    round-robin one job or 10 jobs a cycle; jobs/s and the mean cycle of each layout, rounds
    rotating the order."""
    n = b.n(3000)
    names = list(SLOT_LAYOUTS)
    rates: dict[str, list[float]] = {name: [] for name in names}
    cycle_ms: dict[str, list[float]] = {name: [] for name in names}
    for r in range(1 if b.quick else 3):
        for name in names[r:] + names[:r]:
            await b.fresh_database()
            for queue in SHARED_QUEUES:
                await b.bulk_insert(
                    n, lambda i, q=queue: NewJob(queue=q, task="noop", lock_key=f"{q}{i}")
                )
            settings = b.settings(workers=SLOT_LAYOUTS[name])
            count_before, sum_before = _cycles()
            started = time.perf_counter()
            async with Runner(settings, noop_registry()) as dl:
                await dl.run_until_empty()
            rates[name].append(3 * n / (time.perf_counter() - started))
            count, total = _cycles()
            cycle_ms[name].append((total - sum_before) / max(1, count - count_before) * 1000)
            if await b.sql("SELECT count(*) FROM dl_jobs WHERE status = 'succeeded'") != 3 * n:
                raise RuntimeError(f"{name}: drain incomplete")
    result: dict[str, Any] = {"jobs": 3 * n, "slots": 6}
    for name in names:
        result[f"{name}_jobs_per_s"] = statistics.median(rates[name])
        result[f"{name}_mean_cycle_ms"] = statistics.median(cycle_ms[name])
    result["rounds"] = rates
    return result


@phase("serial_chain")
async def serial_chain(b: Bench) -> dict[str, Any]:
    """A serial chain: `demo.noop` jobs of one lock_key, enqueued in one transaction, drained
    by two worker processes of 4 slots each; each job can start only once the one before it has
    ended, on whichever process claims it."""
    return await _medians(b, lambda: _serial_chain_once(b))


async def _serial_chain_once(b: Bench) -> dict[str, Any]:
    jobs = [NewJob(queue=QUEUE, task="demo.noop", lock_key="chain") for _ in range(b.n(1000))]
    return await _drain_by_processes(b, jobs, processes=2, slots=4) | {
        "hand_offs_between_processes": await b.sql(
            "SELECT count(*) FROM (SELECT worker_id <> lag(worker_id) OVER (ORDER BY started_at)"
            " AS moved FROM dl_jobs) AS s WHERE moved"
        ),
    }


async def _drain_by_processes(
    b: Bench, jobs: list[NewJob], processes: int, slots: int
) -> dict[str, Any]:
    """`processes` worker processes of `slots` slots each run `jobs`, enqueued in one
    transaction once they all listen: jobs/s from its commit to the last job's end, and the
    share of the jobs the busiest process ran."""
    context = multiprocessing.get_context("spawn")
    children = [
        context.Process(target=_serve_in_process, args=(b.dsn, slots)) for _ in range(processes)
    ]
    for child in children:
        child.start()
    try:
        await _until_listening(b, len(children))
        async with Runner(b.settings(), run_workers=False) as dl:
            await dl.client.enqueue_many(jobs)
        started = time.perf_counter()
        ended = await _until_drained(b)
    finally:
        for child in children:
            child.terminate()
        await asyncio.to_thread(lambda: [child.join() for child in children])
    return {
        "jobs": len(jobs),
        "processes": processes,
        "slots_each": slots,
        "jobs_per_s": len(jobs) / (ended - started),
        "share_of_busier_process": max(await _shares(b)) / len(jobs),
    }


async def _shares(b: Bench) -> list[int]:
    conn = await asyncpg.connect(b.dsn)
    try:
        rows = await conn.fetch("SELECT count(*) AS n FROM dl_jobs GROUP BY worker_id")
        return [int(r["n"]) for r in rows]
    finally:
        await conn.close()


@phase("http_latency")
async def http_latency(b: Bench) -> dict[str, Any]:
    """Enqueue → start through HTTP at idle: one trigger at a time to a service with 10 idle
    slots, from the moment the client sends the request to the job's `started_at` (the
    database's clock, on this same host's clock as the client's)."""
    samples, warmup, interval = b.n(200), 5, 0.02
    workers = json.dumps([{"queue": QUEUE, "concurrency": 10}])
    service, port = _start_service(b, {"WORKERS_JSON": workers})
    sent: dict[str, float] = {}
    try:
        await _wait_healthy(port)
        await _until_listening(b, 1)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i in range(warmup + samples):
                body = json.dumps({"queue": QUEUE, "task": "demo.noop", "lock_key": f"l-{i}"})
                t0 = time.time()
                answer = await _post(reader, writer, "/api/v1/jobs/trigger", body.encode())
                if i >= warmup:
                    sent[json.loads(answer)["job_id"]] = t0
                await asyncio.sleep(interval)
        finally:
            writer.close()
        await _until_drained(b)
    finally:
        service.terminate()
        await asyncio.to_thread(service.wait, 30)
    conn = await asyncpg.connect(b.dsn)
    try:
        rows = await conn.fetch(
            "SELECT job_id::text AS id, extract(epoch FROM started_at)::float8 AS started"
            " FROM dl_jobs WHERE job_id::text = ANY($1)",
            list(sent),
        )
    finally:
        await conn.close()
    values = [(r["started"] - sent[r["id"]]) * 1000 for r in rows]
    return {
        "samples": len(values),
        "p50_ms": percentile(values, 50),
        "p95_ms": percentile(values, 95),
        "p99_ms": percentile(values, 99),
        "max_ms": max(values),
    }


async def _time_ms(call: Callable[[], Awaitable[Any]], times: int) -> float:
    """Median milliseconds of `times` awaits of `call()`, after one to warm up."""
    await call()
    values = []
    for _ in range(times):
        started = time.perf_counter()
        await call()
        values.append((time.perf_counter() - started) * 1000)
    return statistics.median(values)


#: What per-queue statistics cost before they read index ranges: the whole table grouped.
WHOLE_TABLE_COUNTS = "SELECT queue, status, count(*) FROM dl_jobs GROUP BY queue, status"


@phase("queue_stats")
async def queue_stats(b: Bench) -> dict[str, Any]:
    """Per-queue statistics beside 1,000,000 finished jobs: `Client.stats()` (10 queues of
    1,000 queued jobs, a tenth of them delayed) against the whole-table count per queue and
    status that `/status` runs. Medians of 50 calls each."""
    finished, queued = b.n(1_000_000), b.n(10_000)
    await b.sql(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, attempt, finished_at)"
        " SELECT gen_random_uuid(), 'q' || (i % 10), 'noop', 'done-' || i, 'succeeded', 1,"
        " now() FROM generate_series(1, $1::int) AS i",
        finished,
    )
    await b.bulk_insert(
        queued,
        lambda i: NewJob(
            queue=f"q{i % 10}",
            task="noop",
            lock_key=f"k-{i}",
            delay=timedelta(hours=1) if i % 10 == 0 else None,
        ),
    )
    await b.sql("VACUUM ANALYZE dl_jobs")
    conn = await asyncpg.connect(b.dsn)
    try:
        async with Runner(b.settings(), run_workers=False) as dl:
            stats_ms = await _time_ms(dl.client.stats, 50)
            counts_ms = await _time_ms(lambda: conn.fetch(WHOLE_TABLE_COUNTS), 50)
    finally:
        await conn.close()
    return {
        "finished_jobs": finished,
        "queued_jobs": queued,
        "client_stats_ms": stats_ms,
        "whole_table_counts_ms": counts_ms,
    }


@phase("retention")
async def retention(b: Bench) -> dict[str, Any]:
    """Beside 10,000,000 finished jobs (a tenth of them 40 days old, failed ones among them,
    20 tasks, one in 100,000 of a rare task and partition_key, args of a number and one of 20
    sources), and 10,000 queued:
    `GET /status`, `GET /api/v1/queues`, pages of `GET /api/v1/jobs` with the filters an
    operator gives, and the dashboard's pages (medians of 20 calls each); then the pruner
    deletes the old ones (1,000 per statement) and its rate is timed."""
    finished, old, queued = b.n(10_000_000), b.n(1_000_000), b.n(10_000)
    await b.sql(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, partition_key, status, attempt,"
        " created_at, started_at, finished_at, args)"
        " SELECT gen_random_uuid(), 'q' || (i % 10),"
        " CASE WHEN i % 100000 = 7 THEN 'rare' ELSE 't' || (i % 20) END, 'done-' || i,"
        " CASE WHEN i % 100000 = 7 THEN 'rare' ELSE '' END,"
        " CASE WHEN i % 50 = 0 THEN 'failed' ELSE 'succeeded' END::dl_status, 1, at, at, at,"
        " jsonb_build_object('n', i, 'source', 's' || (i % 20))"
        " FROM generate_series(1, $1::int) AS i,"
        " LATERAL (SELECT now() - make_interval(days => CASE WHEN i <= $2 THEN 40 ELSE 1 END)"
        "          - make_interval(secs => i % 86400) AS at) AS t",
        finished,
        old,
    )
    await b.bulk_insert(queued, lambda i: NewJob(queue=f"q{i % 10}", task="t", lock_key=f"k{i}"))
    await b.sql("VACUUM ANALYZE dl_jobs")
    settings = b.settings(prune_succeeded_after_sec=30 * 86_400, prune_failed_after_sec=30 * 86_400)
    app = create_app(settings, run_workers=False)
    queued_job = await b.sql("SELECT job_id FROM dl_jobs WHERE status = 'queued' LIMIT 1")
    failed_job = await b.sql("SELECT job_id FROM dl_jobs WHERE status = 'failed' LIMIT 1")
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench") as http,
    ):

        async def get(url: str) -> None:
            response = await http.get(url)
            if response.status_code != 200:
                raise RuntimeError(f"{url}: {response.status_code} {response.text[:200]}")

        await http.get("/ui", follow_redirects=True)  # the dashboard's session, once

        timings = {
            f"{name}_ms": await _time_ms(lambda url=url: get(url), 20)
            for name, url in (
                ("status", "/status"),
                ("queues", "/api/v1/queues"),
                ("jobs_newest", "/api/v1/jobs?limit=100"),
                ("jobs_queue_failed", "/api/v1/jobs?queue=q3&status=failed&limit=100"),
                ("jobs_task", "/api/v1/jobs?task=t7&limit=100"),
                ("jobs_rare_task", "/api/v1/jobs?task=rare&limit=100"),
                ("jobs_absent_task", "/api/v1/jobs?task=none&limit=100"),
                ("jobs_task_failed", "/api/v1/jobs?task=t5&status=failed&limit=100"),
                ("jobs_rare_partition", "/api/v1/jobs?partition_key=rare&limit=100"),
                ("jobs_absent_partition", "/api/v1/jobs?partition_key=none&limit=100"),
                ("jobs_args_one", '/api/v1/jobs?args={"n":4242}&limit=100'),
                ("jobs_args_common", '/api/v1/jobs?args={"source":"s7"}&limit=100'),
                ("jobs_args_none", '/api/v1/jobs?args={"n":-1}&limit=100'),
                # the dashboard's pages, each rendered whole
                ("ui_overview", "/ui"),
                ("ui_jobs", "/ui/jobs"),
                ("ui_jobs_queue_failed", "/ui/jobs?queue=q3&status=failed"),
                ("ui_jobs_rare_task", "/ui/jobs?task=rare"),
                ("ui_jobs_args_one", '/ui/jobs?args={"n":4242}'),
                ("ui_jobs_args_common", '/ui/jobs?args={"source":"s7"}'),
                ("ui_queued_job", f"/ui/jobs/{queued_job}"),
                ("ui_failed_job", f"/ui/jobs/{failed_job}"),
                ("ui_queue", "/ui/queues/q3"),
                ("ui_workers", "/ui/workers"),
                ("ui_cron", "/ui/cron"),
                ("ui_processes", "/ui/processes"),
            )
        }
        store = MaintenanceStore(GuardedPool(app.state.app_context.pool, 60))
        retention_of = Retention(30 * 86_400, 30 * 86_400, 30 * 86_400, 30 * 86_400, 86_400)
        started = time.perf_counter()
        deleted = await Pruner(store, retention_of, settings.prune_batch_size).prune()
        took = time.perf_counter() - started
    pruned = deleted["succeeded"] + deleted["failed"]
    if pruned != old:
        raise RuntimeError(f"pruned {pruned} jobs, expected {old}")
    return {
        "finished_jobs": finished,
        "queued_jobs": queued,
        **timings,
        "pruned_jobs": pruned,
        "prune_sec": took,
        "prune_jobs_per_sec": pruned / took,
    }


#: The filters `list_jobs` times, by name: keyword arguments of `Client.list`.
LIST_FILTERS: dict[str, dict[str, Any]] = {
    "newest": {},
    "queue": {"queue": "q3"},
    "failed": {"status": "failed"},
    "queue_succeeded": {"queue": "q3", "status": "succeeded"},
    "task": {"task": "t7"},
    "lock_key": {"lock_key": "done-4242"},
    "one_day": {"created_from": "day 10", "created_until": "day 11"},
    "finished_one_day": {"finished_from": "day 5", "finished_until": "day 6"},
    "finished_before": {"finished_until": "day 5"},
    "rare_queue_succeeded": {"queue": "rare", "status": "succeeded"},
}


@phase("list_jobs")
async def list_jobs(b: Bench) -> dict[str, Any]:
    """A page of 100 jobs, newest first, beside 1,000,000 finished ones (created over 30 days,
    1 % failed, 10 queues and a rare one, 10 tasks), for each filter of LIST_FILTERS, and the
    20th page of the unfiltered list (keyset: each page from the cursor of the one before).
    Medians of 20 calls each."""
    n = b.n(1_000_000)
    await b.sql(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, attempt, created_at,"
        " finished_at)"
        " SELECT gen_random_uuid(), CASE WHEN i % 10000 = 1 THEN 'rare' ELSE 'q' || (i % 10) END,"
        " 't' || (i % 10), 'done-' || i,"
        " CASE WHEN i % 100 = 0 THEN 'failed' ELSE 'succeeded' END::dl_status, 1, c, c"
        " FROM generate_series(1, $1::int) AS i,"
        " LATERAL (SELECT now() - make_interval(secs => 30 * 86400.0 * i / $1)) AS t(c)",
        n,
    )
    await b.sql("VACUUM ANALYZE dl_jobs")
    day = datetime.now(UTC) - timedelta(days=30)
    result: dict[str, Any] = {"finished_jobs": n}
    async with Runner(b.settings(), run_workers=False) as dl:
        for name, filters in LIST_FILTERS.items():
            given = {
                key: day + timedelta(days=int(value.split()[1]))
                if isinstance(value, str) and value.startswith("day ")
                else value
                for key, value in filters.items()
            }
            page = await dl.client.list(**given)
            assert page.jobs, f"{name}: no job matches"
            result[f"{name}_ms"] = await _time_ms(lambda g=given: dl.client.list(**g), 20)

        async def twentieth() -> None:
            cursor = None
            for _ in range(20):
                cursor = (await dl.client.list(cursor=cursor)).next_cursor

        result["page_20_of_newest_ms"] = await _time_ms(twentieth, 3) / 20
    return result


@phase("idle_footprint")
async def idle_footprint(b: Bench) -> dict[str, Any]:
    workers = json.dumps([{"queue": f"q{i}", "concurrency": 10} for i in range(10)])
    proc, port = _start_service(b, {"WORKERS_JSON": workers})
    try:
        await _wait_healthy(port)
        await asyncio.sleep(3)  # settle: pools filled, loops idle
        status = await asyncio.to_thread(Path(f"/proc/{proc.pid}/status").read_text)
        rss_kb = int(
            next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1]
        )
        connections = await b.sql(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = $1 AND application_name LIKE 'dataloader%'",
            DBNAME,
        )
    finally:
        proc.terminate()
        proc.wait(30)
    return {"slots": 100, "rss_mb": rss_kb / 1024, "connections": connections}


# --- durable processes ------------------------------------------------------------------------

PROCESS_QUEUE = "processes"


def process_registry(history: int = 100) -> TaskRegistry:
    """A no-op processor: each call appends one event and answers with the history's length."""
    registry = TaskRegistry()

    @registry.process("bench", queue=PROCESS_QUEUE, history=history)
    async def noop(task: ProcessTask, process: Process) -> ProcessResult:
        return ProcessResult(events=[task.kind.value], response=process.last_event_id)

    @registry.register("noop")
    async def plain(ctx: JobContext[dict[str, Any]]) -> None:
        return None

    return registry


def process_settings(b: Bench, slots: int) -> Settings:
    return b.settings(
        workers=[WorkerSpec(queue=PROCESS_QUEUE, concurrency=slots)], db_pool_size=slots + 8
    )


async def _round_trips(
    calls: int, callers: int, one: Callable[[int], Awaitable[object]]
) -> dict[str, float]:
    """`calls` round trips made by `callers` concurrent callers: per second, p50 and p99."""
    latencies: list[float] = []
    counter = iter(range(calls))

    async def caller() -> None:
        for i in counter:
            started = time.perf_counter()
            await one(i)
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    elapsed = time.perf_counter() - started
    return {
        "per_s": calls / elapsed,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
    }


@phase("process_calls")
async def process_calls(b: Bench) -> dict[str, Any]:
    """Call round trips through the Python client (32 concurrent callers, 200 processes, a
    no-op processor, 32 slots, all in one process), beside plain jobs' enqueue→wait round
    trips made the same way in the same run, alternating, medians of three rounds."""
    processes, callers, calls = 200, 32, b.n(10_000)
    async with Runner(process_settings(b, callers), process_registry()) as dl:
        client = dl.client
        await asyncio.gather(*(client.processes.start("bench", f"p{i}") for i in range(processes)))

        async def call(i: int) -> object:
            return await client.processes.call("bench", f"p{i % processes}", timeout=60)

        async def job_round_trip(i: int) -> object:
            new = NewJob(queue=PROCESS_QUEUE, task="noop", lock_key=f"j{i}")
            return await client.wait((await client.enqueue(new)).job_id, timeout=60)

        rounds = []
        for _ in range(1 if b.quick else 3):
            rounds.append(
                {
                    **_prefixed("call", await _round_trips(calls, callers, call)),
                    **_prefixed("job", await _round_trips(calls, callers, job_round_trip)),
                }
            )
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    return {"processes": processes, "callers": callers, "calls": calls} | medians


def _prefixed(prefix: str, figures: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}_{key}": value for key, value in figures.items()}


@phase("process_single")
async def process_single(b: Bench) -> dict[str, Any]:
    """Sequential calls to one process (each waits for the last one's response)."""
    calls = b.n(3000)
    async with Runner(process_settings(b, 4), process_registry()) as dl:
        await dl.client.processes.start("bench", "one")
        figures = await _round_trips(
            calls, 1, lambda i: dl.client.processes.call("bench", "one", timeout=60)
        )
    return {"calls": calls} | figures


@phase("process_timers")
async def process_timers(b: Bench) -> dict[str, Any]:
    """Timers of `n` processes due at the same second, written beforehand (processes and
    their timer jobs in SQL, as many starts would leave them): the rate at which the workers
    fire them, from their due time to the last one's end."""
    n = b.n(100_000)
    async with Runner(process_settings(b, 32), process_registry(), run_workers=False) as dl:
        pool = dl.context.pool
        due = await pool.fetchval("SELECT now() + interval '5 seconds'")
        await pool.execute(TIMERS_SQL, n, due)
    async with Runner(process_settings(b, 32), process_registry()) as dl:
        pool = dl.context.pool
        # the figures come from the database's clock: the poll only says when to read them,
        # by the claim's index (a count of the table would take a core's fifth from the run)
        while await pool.fetchval(  # noqa: ASYNC110
            "SELECT EXISTS (SELECT 1 FROM dl_jobs WHERE status IN ('queued', 'running')"
            " AND queue = $1)",
            PROCESS_QUEUE,
        ):
            await asyncio.sleep(0.5)
        last = await pool.fetchval(
            "SELECT max(finished_at) FROM dl_jobs WHERE task = 'process:bench'"
        )
        first_late = await pool.fetchval(
            "SELECT min(attempted_at) - $1 FROM dl_jobs WHERE task = 'process:bench'", due
        )
    took = (last - due).total_seconds()
    return {
        "timers": n,
        "timers_per_s": n / took,
        "first_fired_after_s": first_late.total_seconds(),
        "last_fired_after_s": took,
    }


#: `n` processes of namespace `bench`, each with a timeout timer due at `due` (as a step that
#: set it would have left them).
TIMERS_SQL = """
WITH procs AS (
    INSERT INTO dl_processes (namespace, process_id, queue, status, timer_kind, timer_at,
                              timer_task)
    SELECT 'bench', 'p' || i, 'processes', 'running', 'timeout', $2, gen_random_uuid()
    FROM generate_series(1, $1) AS i
    RETURNING process_ref, process_id, timer_task
)
INSERT INTO dl_jobs (job_id, queue, task, args, lock_key, priority, available_at, max_attempts,
                     parked)
SELECT timer_task, 'processes', 'process:bench',
       jsonb_build_object('process_ref', process_ref, 'process_id', process_id,
                          'kind', 'timeout', 'args', null, 'timer', true),
       'process:' || jsonb_build_array('bench', process_id)::text, 101, $2, 2, 'delayed'
FROM procs
"""


@phase("process_history")
async def process_history(b: Bench) -> dict[str, Any]:
    """A call to a process with 1,000,000 events beside one to a process with 10 (the
    processor is given the last 100): sequential calls to each, alternating, medians."""
    events, calls = b.n(1_000_000), b.n(2000)
    async with Runner(process_settings(b, 4), process_registry()) as dl:
        client = dl.client
        await client.processes.start("bench", "short")
        await client.processes.start("bench", "long")
        await dl.context.pool.execute(HISTORY_SQL, events - 1)
        for _ in range(9):
            await client.processes.call("bench", "short")
        rounds: dict[str, list[float]] = {"short": [], "long": []}
        for _ in range(5):
            for name in ("short", "long"):
                figures = await _round_trips(
                    calls // 5,
                    1,
                    lambda i, name=name: client.processes.call("bench", name, timeout=60),  # type: ignore[misc]
                )
                rounds[name].append(figures["p50_ms"])
    short, long = statistics.median(rounds["short"]), statistics.median(rounds["long"])
    return {
        "events": events,
        "short_p50_ms": short,
        "long_p50_ms": long,
        "long_over_short": long / short,
    }


#: `$1` more events for the process `long` (its last_event_id follows).
HISTORY_SQL = """
WITH p AS (
    UPDATE dl_processes SET last_event_id = last_event_id + $1
    WHERE namespace = 'bench' AND process_id = 'long' AND removed_at IS NULL
    RETURNING process_ref, last_event_id
)
INSERT INTO dl_process_events (process_ref, event_id, task_id, payload)
SELECT p.process_ref, p.last_event_id - $1 + i, gen_random_uuid(), '"call"'::jsonb
FROM p, generate_series(1, $1) AS i
"""


def admin_dsn(args: argparse.Namespace) -> str:
    if args.dsn:
        return str(args.dsn)
    server = get_server(ROOT / ".dataloader-bench" / "pgdata")
    dsn: str = server.get_uri("postgres")
    return dsn


async def server_facts(dsn: str) -> dict[str, str]:
    conn = await asyncpg.connect(dsn)
    try:
        names = (
            "server_version",
            "fsync",
            "synchronous_commit",
            "full_page_writes",
            "shared_buffers",
        )
        return {name: await conn.fetchval(f"SHOW {name}") for name in names}
    finally:
        await conn.close()


def show(results: dict[str, Any]) -> str:
    rows = [("phase", "result")]
    for name, value in results["phases"].items():
        shown = ", ".join(  # each round's figures are in the JSON only
            f"{k}={v:,.2f}" if isinstance(v, float) else f"{k}={v}"
            for k, v in value.items()
            if not isinstance(v, list)
        )
        rows.append((name, shown))
    width = max(len(r[0]) for r in rows)
    lines = [f"| {a.ljust(width)} | {c} |" for a, c in rows]
    lines.insert(1, f"|{'-' * (width + 2)}|{'-' * 40}|")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", help="admin DSN of a server (default: embedded PostgreSQL)")
    parser.add_argument("--only", help="comma-separated phases: " + ", ".join(PHASES))
    parser.add_argument("--quick", action="store_true", help="a tenth of the jobs (smoke test)")
    parser.add_argument("--out", type=Path, help="JSON file (default: benchmarks/results/…)")
    parser.add_argument(
        "--pooler",
        help="DSN of a transaction-pooling PgBouncer in front of the same server (any"
        " database: drain_pooled reaches dl_bench through it)",
    )
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(PHASES)
    unknown = set(names) - PHASES.keys()
    if unknown:
        parser.error(f"unknown phase(s): {', '.join(sorted(unknown))}")
    bench = Bench(admin_dsn(args), args.quick, args.pooler)
    results: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/run.py", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "postgres": await server_facts(bench.admin_dsn),
        "phases": {},
    }
    for name in names:
        print(f"… {name}", file=sys.stderr, flush=True)
        await bench.fresh_database()
        results["phases"][name] = await PHASES[name](bench)
    out = args.out or RESULTS / f"{results['started_at'].replace(':', '')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(show(results))
    print(f"\nJSON: {out}")
    if args.out is None and importlib.util.find_spec("matplotlib") is not None:
        from charts import draw_all  # benchmarks/charts.py, beside this file

        print("charts:", ", ".join(str(p.relative_to(ROOT)) for p in draw_all()))


if __name__ == "__main__":
    asyncio.run(main())
