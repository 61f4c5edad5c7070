"""`dataloader worker`: the workers without the HTTP API, as a real process. It runs the jobs
others enqueue, opens no port, stops on SIGTERM/SIGINT like the service (grace period, a second
signal cuts it short, unfinished jobs handed back), drains and exits with `--drain`, and fails
its start in one line for every mistake of configuration."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import psutil
import pytest

from dataloader import Client, Settings

from ..conftest import _drop_db, with_database
from .helpers import ADVISORY_LOCKS, wait_until
from .procs import (
    DATALOADER_SCRIPT,
    FAST_TIMINGS,
    PYTHON_M_DATALOADER,
    Launcher,
    ServiceProcess,
    one_line,
    run_cli,
)
from .test_cli import PASSWORD, with_credentials

WORKER = [*PYTHON_M_DATALOADER, "worker"]
DRAIN = [*WORKER, "--drain"]


@pytest.fixture
async def client(db_dsn: str) -> AsyncIterator[Client]:
    """A producer in the test's process: the worker process runs what it enqueues."""
    settings = Settings(_env_file=None, db_dsn=db_dsn)  # type: ignore[call-arg]
    async with Client.connect(db_dsn, settings=settings) as producer:
        yield producer


@pytest.fixture
def target_db(admin_dsn: str) -> Iterator[str]:
    """A second, empty database on the test server: the one tasks load into."""
    name = f"dl_target_{uuid.uuid4().hex[:12]}"
    _create_db_plain(admin_dsn, name)
    yield with_database(admin_dsn, name)
    _drop_db(admin_dsn, name)


def _create_db_plain(admin_dsn: str, name: str) -> None:
    async def create() -> None:
        conn = await asyncpg.connect(admin_dsn)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())


def start_worker(launcher: Launcher, db_dsn: str, **env: str | None) -> ServiceProcess:
    return launcher.start(db_dsn, command=WORKER, **env)


async def wait_serving(worker: ServiceProcess, conn: asyncpg.Connection) -> None:
    """Until the worker process is registered as a live worker (its workers have started)."""

    async def registered() -> bool:
        if worker.proc.poll() is not None:
            raise AssertionError(f"the worker exited early{worker.describe_failure()}")
        found = await conn.fetchval("SELECT count(*) FROM dl_workers WHERE pid = $1", worker.pid)
        return bool(found)

    await wait_until(registered, timeout=30, what="the worker to register")


async def job_row(conn: asyncpg.Connection, job_id: Any) -> asyncpg.Record:
    row = await conn.fetchrow("SELECT * FROM dl_jobs WHERE job_id = $1", job_id)
    assert row is not None
    return row


async def last_event(conn: asyncpg.Connection, job_id: Any) -> tuple[str, dict[str, Any]]:
    row = await conn.fetchrow(
        "SELECT kind, payload::text AS payload FROM dl_job_events WHERE job_id = $1"
        " ORDER BY event_id DESC LIMIT 1",
        job_id,
    )
    assert row is not None
    return row["kind"], json.loads(row["payload"]) if row["payload"] else {}


async def insert_job(
    conn: asyncpg.Connection,
    task: str,
    args: dict[str, Any] | None = None,
    *,
    queue: str = "default",
    available_at: str = "now()",
) -> uuid.UUID:
    """A job written the way any producer may write one: plain SQL."""
    job_id: uuid.UUID = await conn.fetchval(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, args, available_at) VALUES"
        f" (gen_random_uuid(), $1, $2, $3, $4::jsonb, {available_at}) RETURNING job_id",
        queue,
        task,
        f"k-{uuid.uuid4().hex}",
        json.dumps(args or {}),
    )
    return job_id


def listening_ports(pid: int) -> list[int]:
    """TCP ports the process listens on."""
    return [
        c.laddr.port
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]


# --- the command line ---------------------------------------------------------------------------


def test_help_lists_the_worker_command_and_explains_it(tmp_path: Path) -> None:
    top = run_cli([str(DATALOADER_SCRIPT), "--help"], {"COLUMNS": "120"}, cwd=tmp_path)
    assert top.returncode == 0, top.stdout
    assert "worker " in top.stdout
    assert "without the HTTP API" in top.stdout

    result = run_cli([str(DATALOADER_SCRIPT), "worker", "--help"], {"COLUMNS": "120"}, tmp_path)
    assert result.returncode == 0, result.stdout
    assert "Usage: dataloader worker [OPTIONS]" in result.stdout
    for mentioned in (
        "--drain",
        "DL_DB_DSN",
        "WORKERS_JSON",
        "DL_PIPELINE_MODULES",
        "DL_SHUTDOWN_TIMEOUT_SEC",
        "SIGTERM",
        "embedded",
    ):
        assert mentioned in result.stdout, mentioned


# --- running jobs -------------------------------------------------------------------------------


async def test_the_worker_runs_an_enqueued_job_and_opens_no_port(
    launcher: Launcher, db_dsn: str, conn: asyncpg.Connection, client: Client
) -> None:
    # An address open to other machines without tokens stops `serve`; a worker serves no HTTP.
    worker = start_worker(launcher, db_dsn, DL_HTTP_HOST="0.0.0.0")
    await wait_serving(worker, conn)

    job = await client.enqueue(
        "demo.sleep", {"seconds": 0.2, "chunks": 2}, queue="default", lock_key="day:1"
    )
    state = await client.wait(job.job_id, timeout=20)
    assert state.status == "succeeded", worker.logs()
    assert state.progress == {"done": 2, "total": 2}
    assert state.worker_id is not None
    assert f"-{worker.pid}-" in state.worker_id  # run by the worker process

    assert listening_ports(worker.pid) == []  # not DL_HTTP_PORT, nor any other

    worker.terminate()
    assert await worker.wait(within=20) == 0, worker.logs()
    assert "Traceback" not in worker.logs()
    assert await conn.fetchval("SELECT count(*) FROM dl_workers") == 0  # deregistered


async def test_the_worker_uses_dl_target_dsn_for_tasks_and_never_logs_its_password(
    launcher: Launcher,
    db_dsn: str,
    target_db: str,
    conn: asyncpg.Connection,
    client: Client,
    tmp_path: Path,
) -> None:
    modules = tmp_path / "mods"
    modules.mkdir()
    (modules / "target_tasks.py").write_text(TARGET_MODULE, encoding="utf-8")
    path = os.pathsep.join(filter(None, [str(modules), os.environ.get("PYTHONPATH")]))
    target = await asyncpg.connect(target_db)
    try:
        await target.execute("CREATE TABLE loaded (day text PRIMARY KEY)")
        worker = start_worker(
            launcher,
            db_dsn,
            DL_TARGET_DSN=with_credentials(target_db, "postgres", PASSWORD),
            DL_PIPELINE_MODULES="target_tasks",
            PYTHONPATH=path,
        )
        await wait_serving(worker, conn)
        job = await client.enqueue(
            "t.load", {"day": "2026-01-01"}, queue="default", lock_key="day:1"
        )
        state = await client.wait(job.job_id, timeout=20)
        assert state.status == "succeeded", worker.logs()
        assert state.result == {"database": urlsplit(target_db).path.lstrip("/")}
        assert await target.fetchval("SELECT day FROM loaded") == "2026-01-01"
        assert await conn.fetchval("SELECT to_regclass('loaded')") is None  # not the queue's
    finally:
        await target.close()
    worker.terminate()
    assert await worker.wait(within=20) == 0, worker.logs()
    logs = worker.logs()
    assert PASSWORD not in logs
    line = next(json.loads(x) for x in logs.splitlines() if "target_dsn" in x)
    assert "postgres:***@" in line["target_dsn"]
    assert line["target_database"] == state.result["database"]


TARGET_MODULE = """
from sqlalchemy import text

from dataloader import JobContext, task


@task("t.load")
async def load(ctx: JobContext[dict]) -> dict:
    async with ctx.sessionmaker() as session, session.begin():
        await session.execute(text("INSERT INTO loaded (day) VALUES (:day)"), ctx.args)
    async with ctx.engine.connect() as connection:
        database = await connection.scalar(text("SELECT current_database()"))
    return {"database": database}
"""


# --- stopping -----------------------------------------------------------------------------------


async def long_job_running(
    launcher: Launcher, db_dsn: str, conn: asyncpg.Connection, shutdown_timeout_sec: int
) -> tuple[ServiceProcess, uuid.UUID]:
    """A worker process running a ten-minute job that holds its advisory lock."""
    worker = start_worker(launcher, db_dsn, DL_SHUTDOWN_TIMEOUT_SEC=str(shutdown_timeout_sec))
    job_id = await insert_job(conn, "demo.sleep", {"seconds": 600, "chunks": 600})

    async def running_with_its_lock() -> bool:
        status = (await job_row(conn, job_id))["status"]
        return status == "running" and await conn.fetchval(ADVISORY_LOCKS) == 1

    await wait_until(running_with_its_lock, timeout=30, what="the job to run")
    return worker, job_id


async def assert_handed_back(conn: asyncpg.Connection, job_id: uuid.UUID) -> None:
    row = await job_row(conn, job_id)
    assert row["status"] == "queued"
    assert row["attempt"] == 0  # refunded: the shutdown cut the run short, not the job
    assert row["lease_expires_at"] is None
    assert await conn.fetchval(ADVISORY_LOCKS) == 0
    kind, payload = await last_event(conn, job_id)
    assert (kind, payload["reason"]) == ("requeue", "worker shutting down")
    assert await conn.fetchval("SELECT count(*) FROM dl_workers") == 0


async def test_sigterm_stops_the_worker_and_hands_a_running_job_back(
    launcher: Launcher, db_dsn: str, conn: asyncpg.Connection
) -> None:
    worker, job_id = await long_job_running(launcher, db_dsn, conn, shutdown_timeout_sec=1)
    started = time.monotonic()
    worker.terminate()
    assert await worker.wait(within=30) == 0, worker.logs()
    assert time.monotonic() - started < 20
    logs = worker.logs()
    assert "Traceback" not in logs
    assert "handing 1 unfinished job(s) back" in logs
    await assert_handed_back(conn, job_id)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_stop_signal_lets_a_short_job_finish_and_exits_0(
    launcher: Launcher, db_dsn: str, conn: asyncpg.Connection, signum: int
) -> None:
    worker = start_worker(launcher, db_dsn, DL_SHUTDOWN_TIMEOUT_SEC="20")
    job_id = await insert_job(conn, "demo.sleep", {"seconds": 3, "chunks": 6})

    async def running() -> bool:
        return (await job_row(conn, job_id))["status"] == "running"

    await wait_until(running, timeout=30, what="the job to run")
    signalled_at = await conn.fetchval("SELECT clock_timestamp()")
    worker.send(signum)
    assert await worker.wait(within=30) == 0, worker.logs()
    assert "Aborted" not in worker.logs()
    assert "Traceback" not in worker.logs()

    row = await job_row(conn, job_id)
    assert (row["status"], row["attempt"]) == ("succeeded", 1)
    assert row["finished_at"] > signalled_at  # it was still running when the signal came
    assert await conn.fetchval(ADVISORY_LOCKS) == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_second_stop_signal_cuts_the_grace_short_and_still_hands_the_job_back(
    launcher: Launcher, db_dsn: str, conn: asyncpg.Connection, signum: int
) -> None:
    worker, job_id = await long_job_running(launcher, db_dsn, conn, shutdown_timeout_sec=120)

    async def in_grace_period() -> bool:
        return "waiting up to 120s for 1 running job(s)" in worker.logs()

    worker.send(signum)
    await wait_until(in_grace_period, what="the worker to wait for its job")
    started = time.monotonic()
    worker.send(signum)
    assert await worker.wait(within=30) == 0, worker.logs()
    assert time.monotonic() - started < 30  # not the 120 s grace period
    logs = worker.logs()
    assert "second stop signal" in logs
    assert "Aborted" not in logs
    assert "Traceback" not in logs
    await assert_handed_back(conn, job_id)


# --- draining -----------------------------------------------------------------------------------


async def test_drain_runs_every_ready_job_then_exits_0(
    db_dsn: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    quick = [await insert_job(conn, "demo.noop", {"i": i}) for i in range(20)]
    flaky = await insert_job(conn, "demo.fail", {"fail_times": 1})  # retried at once
    later = await insert_job(conn, "demo.noop", available_at="now() + interval '1 hour'")
    elsewhere = await insert_job(conn, "demo.noop", queue="not-served")

    env = {"DL_DB_DSN": db_dsn, **FAST_TIMINGS, "DL_POLL_INTERVAL_SEC": "300"}
    result = await asyncio.to_thread(run_cli, DRAIN, env, tmp_path, 60)
    assert result.returncode == 0, result.stdout
    assert "queues drained" in result.stdout

    statuses = await conn.fetch(
        "SELECT status::text, count(*) FROM dl_jobs WHERE job_id = ANY($1) GROUP BY 1", quick
    )
    assert [tuple(r) for r in statuses] == [("succeeded", 20)]
    assert ((await job_row(conn, flaky))["status"], (await job_row(conn, flaky))["attempt"]) == (
        "succeeded",
        2,
    )
    for waiting in (later, elsewhere):  # not ready, or not this worker's: left for later
        row = await job_row(conn, waiting)
        assert (row["status"], row["attempt"]) == ("queued", 0)
    assert await conn.fetchval(ADVISORY_LOCKS) == 0
    assert await conn.fetchval("SELECT count(*) FROM dl_workers") == 0


@pytest.mark.parametrize(
    "workers",
    [
        '[{"queue": "default", "concurrency": 2}]',
        '[{"queues": ["default", "other"], "concurrency": 2}]',
    ],
    ids=["own-slots", "shared-slots"],
)
async def test_drain_waits_for_the_jobs_a_rate_holds_back(
    db_dsn: str, client: Client, conn: asyncpg.Connection, tmp_path: Path, workers: str
) -> None:
    """At one start a second, 5 jobs take 4 seconds at least: the queue is not drained while
    its limit holds some back."""
    await client.set_limits("default", max_per_second=1)
    jobs = [await insert_job(conn, "demo.noop", {"i": i}) for i in range(5)]

    env = {"DL_DB_DSN": db_dsn, **FAST_TIMINGS, "DL_POLL_INTERVAL_SEC": "300"}
    result = await asyncio.to_thread(run_cli, DRAIN, {**env, "WORKERS_JSON": workers}, tmp_path, 60)
    assert result.returncode == 0, result.stdout
    statuses = await conn.fetch(
        "SELECT status::text, count(*) FROM dl_jobs WHERE job_id = ANY($1) GROUP BY 1", jobs
    )
    assert [tuple(r) for r in statuses] == [("succeeded", 5)]


async def test_drain_stopped_by_a_signal_exits_1_and_hands_the_job_back(
    launcher: Launcher, db_dsn: str, conn: asyncpg.Connection
) -> None:
    worker = launcher.start(db_dsn, command=DRAIN, DL_SHUTDOWN_TIMEOUT_SEC="0")
    job_id = await insert_job(conn, "demo.sleep", {"seconds": 600, "chunks": 600})

    async def running() -> bool:
        return (await job_row(conn, job_id))["status"] == "running"

    await wait_until(running, timeout=30, what="the job to run")
    worker.terminate()
    assert await worker.wait(within=30) == 1, worker.logs()
    assert "before the queues were drained" in worker.logs()
    assert "Traceback" not in worker.logs()
    await assert_handed_back(conn, job_id)


async def test_drain_on_the_embedded_server_when_dl_db_dsn_is_unset(launcher: Launcher) -> None:
    # not under tmp_path: run as root, the server runs as another user, who may not enter the
    # directory pytest keeps private to root
    data_dir = Path(tempfile.mkdtemp(prefix="dl-embedded-"))
    try:
        worker = launcher.start("unused", command=DRAIN, DL_DB_DSN=None, DL_DATA_DIR=str(data_dir))
        assert await worker.wait(within=120) == 0, worker.logs()  # a first start runs initdb
        lines = [json.loads(x) for x in worker.logs().splitlines() if x.startswith("{")]
        database = next(line for line in lines if "server_version" in line)
        assert database["embedded"] is True
        messages = [line["message"] for line in lines]
        assert "workers started" in messages
        assert messages[-1] == "workers stopped"
        assert messages.index("workers started") < messages.index("queues drained")
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


# --- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "code"),
    [
        ("WORKERS_JSON", '[{"queue": "default", ', 2),
        ("WORKERS_JSON", "[]", 2),
        ("DL_PIPELINE_MODULES", "no_such_module_xyz", 2),
        ("DL_SHUTDOWN_TIMEOUT_SEC", "soon", 2),
        ("DL_TARGET_DSN", f"mysql://u:{PASSWORD}@db.example/etl", 2),
        ("DL_TARGET_DSN", "no-such-database", 1),
        ("DL_DB_DSN", f"postgresql://u:{PASSWORD}@127.0.0.1:1/db", 1),
    ],
    ids=[
        "workers-json-malformed",
        "workers-json-empty",
        "unknown-module",
        "shutdown-timeout",
        "target-dsn-scheme",
        "target-dsn-unknown-database",
        "db-dsn-unreachable",
    ],
)
async def test_a_bad_configuration_stops_the_worker_in_one_line_before_any_job_runs(
    db_dsn: str,
    admin_dsn: str,
    conn: asyncpg.Connection,
    tmp_path: Path,
    variable: str,
    value: str,
    code: int,
) -> None:
    if value == "no-such-database":
        value = with_credentials(with_database(admin_dsn, "dl_no_such_db"), "postgres", PASSWORD)
    job_id = await insert_job(conn, "demo.noop")
    env = {"DL_DB_DSN": db_dsn, variable: value}
    result = await asyncio.to_thread(run_cli, WORKER, env, tmp_path)
    assert result.returncode == code, result.stdout
    assert "Traceback" not in result.stdout
    assert PASSWORD not in result.stdout
    line = one_line(result.stdout)
    assert variable in line
    row = await job_row(conn, job_id)
    assert (row["status"], row["attempt"]) == ("queued", 0)  # no worker ever ran
    assert await conn.fetchval("SELECT count(*) FROM dl_workers") == 0
