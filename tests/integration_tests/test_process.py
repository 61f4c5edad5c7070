"""The service as a real process (`python -m dataloader`, the `dataloader` console script):
start-up on empty and hand-made databases, a replica killed mid-job, SIGTERM, configuration
errors at start, pipeline modules from the environment."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from dataloader.storage.migrate import load_migrations

from .helpers import ADVISORY_LOCKS, schema_definitions, wait_until
from .procs import DATALOADER_SCRIPT, Launcher, ServiceProcess, free_port, one_line, run_cli

LATEST = max(m.version for m in load_migrations())
SPEC_DDL = next(m for m in load_migrations() if m.version == 1).sql
SPEC_INDEXES = {"ix_dl_jobs_claim", "ix_dl_jobs_running_lease", "ix_dl_jobs_status_queue"}
SPEC_TRIGGERS = {"dl_jobs_notify_ins", "dl_jobs_notify_upd"}


async def job_row(conn: asyncpg.Connection, job_id: str) -> asyncpg.Record:
    row = await conn.fetchrow("SELECT * FROM dl_jobs WHERE job_id = $1", job_id)
    assert row is not None
    return row


async def events_of(conn: asyncpg.Connection, job_id: str) -> list[tuple[str, dict[str, Any]]]:
    rows = await conn.fetch(
        "SELECT kind, payload::text AS payload FROM dl_job_events WHERE job_id = $1"
        " ORDER BY event_id",
        job_id,
    )
    return [(r["kind"], json.loads(r["payload"]) if r["payload"] else {}) for r in rows]


# --- start-up ----------------------------------------------------------------------------------


async def test_starts_on_an_empty_database_creates_the_schema_and_runs_a_job(
    launcher: Launcher, empty_db_dsn: str
) -> None:
    service = launcher.start(empty_db_dsn)
    await service.wait_healthy()

    conn = await asyncpg.connect(empty_db_dsn)
    try:
        rows = await conn.fetch("SELECT version, adopted FROM dl_schema_migrations ORDER BY 1")
        assert [(r["version"], r["adopted"]) for r in rows] == [
            (m.version, False) for m in load_migrations()
        ]
    finally:
        await conn.close()

    job_id = await service.trigger(task="demo.sleep", args={"seconds": 3, "chunks": 6})
    seen: list[int] = []  # progress["done"] observed while the job ran
    deadline = time.monotonic() + 20
    while (body := await service.status(job_id))["status"] != "succeeded":
        assert body["status"] in ("queued", "running"), body
        if body["status"] == "running" and "done" in body["progress"]:
            seen.append(body["progress"]["done"])
        assert time.monotonic() < deadline, f"job still {body['status']}\n{service.logs()}"
        await asyncio.sleep(0.02)

    assert body["progress"] == {"done": 6, "total": 6}
    assert body["attempt"] == 1
    assert seen == sorted(seen), seen
    assert len(set(seen)) >= 2, f"progress was not seen growing: {seen}"


async def test_adopts_a_database_prepared_with_the_spec_ddl(
    launcher: Launcher, empty_db_dsn: str
) -> None:
    conn = await asyncpg.connect(empty_db_dsn)
    try:
        await conn.execute(SPEC_DDL)
        job_id = await conn.fetchval(
            "INSERT INTO dl_jobs (job_id, queue, task, lock_key, args, producer)"
            " VALUES (gen_random_uuid(), 'default', 'demo.noop', 'by-hand', '{\"x\": 1}',"
            " 'psql') RETURNING job_id"
        )
        before = await schema_definitions(conn)
        created_at = await conn.fetchval("SELECT created_at FROM dl_jobs WHERE job_id = $1", job_id)

        service = launcher.start(empty_db_dsn)
        await service.wait_healthy()
        body = await service.wait_status(str(job_id), "succeeded")
        assert body["attempt"] == 1

        rows = await conn.fetch("SELECT version, adopted FROM dl_schema_migrations ORDER BY 1")
        assert [(r["version"], r["adopted"]) for r in rows] == [
            (m.version, m.version == 1) for m in load_migrations()
        ]
        row = await job_row(conn, str(job_id))
        assert (row["task"], row["lock_key"], row["producer"]) == ("demo.noop", "by-hand", "psql")
        assert json.loads(row["args"]) == {"x": 1}
        assert row["created_at"] == created_at

        after = await schema_definitions(conn)
        assert {f"index {name}" for name in SPEC_INDEXES} <= before.keys()
        assert {f"trigger {name}" for name in SPEC_TRIGGERS} <= before.keys()
        assert {key: after.get(key) for key in before} == before  # nothing changed or dropped
    finally:
        await conn.close()


# --- failures of a replica -----------------------------------------------------------------------


async def test_a_killed_replicas_job_is_requeued_and_finished_by_another(
    launcher: Launcher, db_dsn: str, conn: asyncpg.Connection
) -> None:
    first = launcher.start(db_dsn, "A", DL_DEFAULT_LEASE_TTL_SEC="2")
    await first.wait_healthy()
    job_id = await first.trigger(task="demo.sleep", args={"seconds": 3, "chunks": 6})
    await first.wait_status(job_id, "running")

    first.kill()
    assert await first.wait() == -signal.SIGKILL
    row = await job_row(conn, job_id)
    assert (row["status"], row["attempt"]) == ("running", 1)  # nobody finished it
    lease_expired_at = row["lease_expires_at"]

    second = launcher.start(db_dsn, "B", DL_DEFAULT_LEASE_TTL_SEC="2")
    await second.wait_healthy()
    body = await second.wait_status(job_id, "succeeded", timeout=30)
    assert body["attempt"] == 2

    events = await events_of(conn, job_id)
    kinds = [kind for kind, _ in events]
    assert kinds.count("requeue") == 1, kinds
    requeue = next(payload for kind, payload in events if kind == "requeue")
    assert requeue["reason"] == "lease expired"
    assert f"-{second.pid}-" in requeue["reaper"]  # B's reaper took it back...
    requeued_at = await conn.fetchval(
        "SELECT ts FROM dl_job_events WHERE job_id = $1 AND kind = 'requeue'", job_id
    )
    assert requeued_at > lease_expired_at  # ...once A's lease had expired
    picked = [payload for kind, payload in events if kind == "picked"]
    assert [p["attempt"] for p in picked] == [1, 2]
    assert f"-{first.pid}-" in picked[0]["worker"]
    assert f"-{second.pid}-" in picked[1]["worker"]
    assert kinds[-1] == "done"


async def long_job_running(
    launcher: Launcher, db_dsn: str, conn: asyncpg.Connection, shutdown_timeout_sec: int
) -> tuple[ServiceProcess, str]:
    """A service process running a ten-minute job that holds its advisory lock."""
    service = launcher.start(db_dsn, DL_SHUTDOWN_TIMEOUT_SEC=str(shutdown_timeout_sec))
    await service.wait_healthy()
    job_id = await service.trigger(task="demo.sleep", args={"seconds": 600, "chunks": 600})
    await service.wait_status(job_id, "running")

    async def lock_held() -> bool:
        return await conn.fetchval(ADVISORY_LOCKS) == 1

    await wait_until(lock_held, timeout=10, what="the job's advisory lock")
    return service, job_id


async def test_sigterm_hands_a_long_job_back_with_the_attempt_refunded(
    launcher: Launcher, db_dsn: str, conn: asyncpg.Connection
) -> None:
    service, job_id = await long_job_running(launcher, db_dsn, conn, shutdown_timeout_sec=1)

    started = time.monotonic()
    service.terminate()

    async def requeued() -> bool:
        return (await job_row(conn, job_id))["status"] == "queued"

    await wait_until(requeued, timeout=20, what="the job to be handed back")
    # the lock is released before the hand-back is written, whether or not the process is gone
    assert await conn.fetchval(ADVISORY_LOCKS) == 0

    code = await service.wait(within=20)
    assert code == 0, service.logs()
    assert time.monotonic() - started < 20
    assert "Traceback" not in service.logs()

    row = await job_row(conn, job_id)
    assert row["status"] == "queued"
    assert row["attempt"] == 0  # refunded: the run was cut short by the shutdown, not the job
    assert row["lease_expires_at"] is None
    assert row["finished_at"] is None
    events = await events_of(conn, job_id)
    assert events[-1][0] == "requeue", events
    assert "shut" in events[-1][1]["reason"].lower(), events[-1]
    assert await conn.fetchval(ADVISORY_LOCKS) == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_stop_signal_lets_a_short_job_finish_and_exits_0(
    launcher: Launcher, db_dsn: str, conn: asyncpg.Connection, signum: int
) -> None:
    service = launcher.start(db_dsn, DL_SHUTDOWN_TIMEOUT_SEC="10")
    await service.wait_healthy()
    job_id = await service.trigger(task="demo.sleep", args={"seconds": 3, "chunks": 6})
    await service.wait_status(job_id, "running")

    signalled_at = await conn.fetchval("SELECT clock_timestamp()")
    service.send(signum)
    assert await service.wait(within=20) == 0, service.logs()
    assert "Aborted" not in service.logs()

    row = await job_row(conn, job_id)
    assert (row["status"], row["attempt"]) == ("succeeded", 1)
    assert json.loads(row["progress"]) == {"done": 6, "total": 6}
    assert row["finished_at"] > signalled_at  # it was still running when the signal came
    kinds = [kind for kind, _ in await events_of(conn, job_id)]
    assert "requeue" not in kinds
    assert kinds[-1] == "done"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_second_stop_signal_cuts_the_grace_short_and_still_hands_the_job_back(
    launcher: Launcher, db_dsn: str, conn: asyncpg.Connection, signum: int
) -> None:
    service, job_id = await long_job_running(launcher, db_dsn, conn, shutdown_timeout_sec=120)
    # A request whose body never comes keeps the HTTP server draining its connections after the
    # first signal: the second one lands before the application's own shutdown has begun.
    answers, upload = await asyncio.open_connection("127.0.0.1", service.port)
    upload.write(
        b"POST /api/v1/jobs/trigger HTTP/1.1\r\nHost: dataloader\r\nExpect: 100-continue\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    try:
        # the application asked for the body: the request is in flight
        assert await answers.readline() == b"HTTP/1.1 100 Continue\r\n"

        async def draining() -> bool:
            return "Waiting for connections to close" in service.logs()

        service.send(signum)
        await wait_until(draining, what="the HTTP server to drain its connections")
        started = time.monotonic()
        service.send(signum)
        assert await service.wait(within=30) == 0, service.logs()
        assert time.monotonic() - started < 30  # not the 120 s grace period
    finally:
        upload.close()
    logs = service.logs()
    assert "second stop signal" in logs
    assert "Aborted" not in logs

    row = await job_row(conn, job_id)
    assert row["status"] == "queued", logs
    assert row["attempt"] == 0  # refunded: the shutdown cut the run short, not the job
    assert row["lease_expires_at"] is None
    assert await conn.fetchval(ADVISORY_LOCKS) == 0
    kind, payload = (await events_of(conn, job_id))[-1]
    assert (kind, payload["reason"]) == ("requeue", "worker shutting down")


# --- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("WORKERS_JSON", '[{"queue": "default", '),
        ("WORKERS_JSON", '[{"queue": "default", "concurrency": 0}]'),
        ("DL_PIPELINE_MODULES", "no_such_module_xyz"),
        ("DL_HEARTBEAT_SEC", "abc"),
    ],
    ids=["workers-json-malformed", "workers-json-concurrency-0", "unknown-module", "heartbeat"],
)
def test_bad_configuration_stops_the_start_with_one_line(
    db_dsn: str, tmp_path: Path, variable: str, value: str
) -> None:
    result = run_cli(
        [sys.executable, "-m", "dataloader"],
        {"DL_DB_DSN": db_dsn, "DL_HTTP_PORT": str(free_port()), variable: value},
        cwd=tmp_path,
    )
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stdout
    assert variable in one_line(result.stdout)


def test_unreachable_database_stops_the_start_without_leaking_the_password(
    tmp_path: Path,
) -> None:
    result = run_cli(
        [sys.executable, "-m", "dataloader"],
        {
            "DL_DB_DSN": "postgresql://u:secretpw@127.0.0.1:1/db",
            "DL_HTTP_PORT": str(free_port()),
        },
        cwd=tmp_path,
    )
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stdout
    line = one_line(result.stdout)
    assert "127.0.0.1" in line
    assert "secretpw" not in result.stdout


# --- the console script and pipeline modules ------------------------------------------------------


async def test_migrate_command_on_an_empty_database_is_idempotent(
    empty_db_dsn: str, tmp_path: Path
) -> None:
    assert DATALOADER_SCRIPT.exists(), DATALOADER_SCRIPT
    env = {"DL_DB_DSN": empty_db_dsn}
    versions = [m.version for m in load_migrations()]

    first = await asyncio.to_thread(run_cli, [str(DATALOADER_SCRIPT), "migrate"], env, tmp_path)
    assert first.returncode == 0, first.stdout
    assert f"schema at version {LATEST} (applied: {versions}" in first.stdout

    second = await asyncio.to_thread(run_cli, [str(DATALOADER_SCRIPT), "migrate"], env, tmp_path)
    assert second.returncode == 0, second.stdout
    assert f"schema at version {LATEST} (applied: none" in second.stdout

    conn = await asyncpg.connect(empty_db_dsn)
    try:
        recorded = await conn.fetch("SELECT version FROM dl_schema_migrations ORDER BY 1")
        assert [r["version"] for r in recorded] == versions
        assert await conn.fetchval("SELECT to_regclass('dl_jobs') IS NOT NULL")
    finally:
        await conn.close()


HELLO_MODULE = """
from dataloader import JobContext, pipeline


@pipeline("t.hello")
async def hello(ctx: JobContext[dict]) -> None:
    await ctx.set_progress(greeting=f"hello {ctx.args['name']}")
"""


async def test_pipeline_modules_are_imported_from_the_environment(
    launcher: Launcher, db_dsn: str, tmp_path: Path
) -> None:
    modules = tmp_path / "mods"  # not the working directory: only PYTHONPATH finds it
    modules.mkdir()
    (modules / "hello_pipelines.py").write_text(HELLO_MODULE, encoding="utf-8")
    path = os.pathsep.join(filter(None, [str(modules), os.environ.get("PYTHONPATH")]))

    service = launcher.start(db_dsn, DL_PIPELINE_MODULES="hello_pipelines", PYTHONPATH=path)
    await service.wait_healthy()
    job_id = await service.trigger(task="t.hello", args={"name": "world"})
    body = await service.wait_status(job_id, "succeeded", "failed")
    assert body["status"] == "succeeded", body
    assert body["progress"] == {"greeting": "hello world"}
