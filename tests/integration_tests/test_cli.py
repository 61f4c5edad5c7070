"""The command line as a user meets it: `python -m dataloader` and the `dataloader` script are
one program; the start-up fails early and in one line for every mistake a user can make."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import tempfile
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import asyncpg
import pytest

from ..conftest import with_database
from ..faults.server import PrivateServer
from .helpers import wait_until
from .procs import (
    DATALOADER_SCRIPT,
    PYTHON_M_DATALOADER,
    Launcher,
    free_port,
    one_line,
    run_cli,
)

#: The two spellings of the program.
PROGRAMS = {
    "python -m dataloader": list(PYTHON_M_DATALOADER),
    "dataloader": [str(DATALOADER_SCRIPT)],
}


@pytest.mark.parametrize("program", PROGRAMS)
def test_version_prints_the_package_version(program: str, tmp_path: Path) -> None:
    result = run_cli([*PROGRAMS[program], "--version"], {}, cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip() == f"dataloader {version('dataloader')}"


@pytest.mark.parametrize("program", PROGRAMS)
def test_help_names_the_program_and_its_commands(program: str, tmp_path: Path) -> None:
    result = run_cli([*PROGRAMS[program], "--help"], {"COLUMNS": "100"}, cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    assert f"Usage: {program} [OPTIONS] COMMAND [ARGS]..." in result.stdout
    for command in ("serve", "migrate"):
        assert command in result.stdout


@pytest.mark.parametrize(
    "command",
    [
        [*PROGRAMS["python -m dataloader"]],
        [*PROGRAMS["python -m dataloader"], "serve"],
        [*PROGRAMS["dataloader"]],
        [*PROGRAMS["dataloader"], "serve"],
    ],
    ids=["python-m", "python-m-serve", "script", "script-serve"],
)
async def test_every_spelling_of_serve_starts_the_service(
    launcher: Launcher, db_dsn: str, command: list[str]
) -> None:
    service = launcher.start(db_dsn, command=command)
    await service.wait_healthy()
    job_id = await service.trigger(task="demo.noop")
    assert (await service.wait_status(job_id, "succeeded"))["attempt"] == 1


async def test_python_m_migrate_is_the_migrate_command(empty_db_dsn: str, tmp_path: Path) -> None:
    env = {"DL_DB_DSN": empty_db_dsn}
    result = await asyncio.to_thread(
        run_cli, [*PROGRAMS["python -m dataloader"], "migrate"], env, tmp_path
    )
    assert result.returncode == 0, result.stdout
    assert "schema at version" in result.stdout


async def test_a_taken_http_port_stops_the_start_before_any_worker(
    db_dsn: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id = await conn.fetchval(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key) VALUES"
        " (gen_random_uuid(), 'default', 'demo.noop', 'k') RETURNING job_id"
    )
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = await asyncio.to_thread(
            run_cli,
            [*PROGRAMS["python -m dataloader"]],
            {"DL_DB_DSN": db_dsn, "DL_HTTP_PORT": str(port)},
            tmp_path,
        )
    assert result.returncode == 1, result.stdout
    line = one_line(result.stdout)
    assert "DL_HTTP_PORT" in line
    assert f"127.0.0.1:{port}" in line
    assert "in use" in line
    row = await conn.fetchrow("SELECT status, attempt FROM dl_jobs WHERE job_id = $1", job_id)
    assert (row["status"], row["attempt"]) == ("queued", 0)  # no worker ever ran
    assert await conn.fetchval("SELECT count(*) FROM dl_job_events WHERE kind = 'picked'") == 0


@pytest.mark.parametrize("command", [["serve"], ["worker"]])
@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        # args the task refuses: every slot's job would be refused
        ("@daily", ["DL_CRON: the schedule 'nightly': demo.sleep refuses its args", "seconds"]),
        # a date that never comes: croniter reads it, then finds no slot
        ("0 0 30 2 *", ["DL_CRON", "the cron schedule '0 0 30 2 *' never fires"]),
    ],
)
async def test_a_schedule_that_cannot_run_stops_the_start_in_one_line(
    db_dsn: str, tmp_path: Path, command: list[str], schedule: str, expected: list[str]
) -> None:
    program = [str(DATALOADER_SCRIPT), *command]
    cron = [{"name": "nightly", "schedule": schedule, "task": "demo.sleep", "queue": "default"}]
    result = await asyncio.to_thread(
        run_cli,
        program,
        {"DL_DB_DSN": db_dsn, "DL_HTTP_PORT": str(free_port()), "DL_CRON": json.dumps(cron)},
        tmp_path,
    )
    assert result.returncode == 2, result.stdout
    line = one_line(result.stdout)
    for text in expected:
        assert text in line


async def test_processes_that_ask_for_it_share_the_http_port(
    launcher: Launcher, db_dsn: str
) -> None:
    """DL_HTTP_REUSE_PORT: a second process listens on the first one's port (the kernel spreads
    connections over both) and serves it alone once the first has stopped."""
    first = launcher.start(db_dsn, DL_HTTP_REUSE_PORT="true")
    await first.wait_healthy()
    second = launcher.start(db_dsn, DL_HTTP_REUSE_PORT="true", DL_HTTP_PORT=str(first.port))

    async def second_serving() -> bool:
        if second.proc.poll() is not None:
            raise AssertionError(f"the second process exited:\n{second.logs()}")
        return "Application startup complete" in second.logs()

    await wait_until(second_serving, what="the second process to serve")
    first.terminate()
    assert await first.wait() == 0
    job_id = await first.trigger(task="demo.noop")  # the port, answered by the second process
    assert (await first.wait_status(job_id, "succeeded"))["attempt"] == 1


# --- the database at start-up ---------------------------------------------------------------------

#: A password that must never appear in the output.
PASSWORD = "secretpw-2f9c"


def with_credentials(dsn: str, user: str, password: str) -> str:
    """`dsn` with another user and password (TCP and Unix-socket DSNs alike)."""
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


def start_fails(dsn: str, cwd: Path, *, migrate: bool = True) -> str:
    """Start the service on `dsn`; assert it stops with code 1 and one masked line; the line."""
    result = run_cli(
        [*PROGRAMS["python -m dataloader"]],
        {
            "DL_DB_DSN": dsn,
            "DL_HTTP_PORT": str(free_port()),
            "DL_AUTO_MIGRATE": str(migrate).lower(),
        },
        cwd=cwd,
    )
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stdout
    assert PASSWORD not in result.stdout
    line = one_line(result.stdout)
    assert "DL_DB_DSN" in line
    return line


@pytest.mark.parametrize("migrate", [True, False], ids=["migrating", "not-migrating"])
async def test_an_unknown_database_stops_the_start_in_one_line(
    admin_dsn: str, tmp_path: Path, migrate: bool
) -> None:
    dsn = with_credentials(with_database(admin_dsn, "dl_no_such_database"), "postgres", PASSWORD)
    line = await asyncio.to_thread(start_fails, dsn, tmp_path, migrate=migrate)
    assert 'database "dl_no_such_database" does not exist' in line


async def test_an_unknown_role_stops_the_start_in_one_line(db_dsn: str, tmp_path: Path) -> None:
    dsn = with_credentials(db_dsn, "dl_no_such_role", PASSWORD)
    line = await asyncio.to_thread(start_fails, dsn, tmp_path)
    assert 'role "dl_no_such_role" does not exist' in line


async def test_a_wrong_password_stops_the_start_in_one_line(tmp_path: Path) -> None:
    server = PrivateServer()
    try:
        await server.start()
        await server.require_passwords(user="dl_owner", password="the-right-one")
        dsn = with_credentials(server.dsn, "dl_owner", PASSWORD)
        line = await asyncio.to_thread(start_fails, dsn, tmp_path)
        assert 'password authentication failed for user "dl_owner"' in line
    finally:
        server.stop()


async def test_a_user_who_may_not_create_the_schema_stops_the_start_in_one_line(
    admin_dsn: str, empty_db_dsn: str, tmp_path: Path
) -> None:
    role = f"dl_no_create_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(empty_db_dsn)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'unused-here'")
        # the default of PostgreSQL 15 and later, also on older servers
        await admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        dsn = with_credentials(empty_db_dsn, role, PASSWORD)
        line = await asyncio.to_thread(start_fails, dsn, tmp_path)
        assert "permission denied for schema public" in line
        assert "dataloader migrate" in line  # what to do about it
        assert await admin.fetchval("SELECT to_regclass('dl_jobs')") is None
    finally:
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


async def test_a_read_only_database_stops_the_start_in_one_line(
    empty_db_dsn: str, tmp_path: Path
) -> None:
    admin = await asyncpg.connect(empty_db_dsn)
    try:  # as a hot standby is: every transaction read-only
        database = await admin.fetchval("SELECT current_database()")
        await admin.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    finally:
        await admin.close()
    line = await asyncio.to_thread(start_fails, empty_db_dsn, tmp_path)
    assert "read-only" in line
    assert "primary" in line  # what to do about it


class OldServerProxy:
    """Forwards connections to the test server, announcing it as PostgreSQL `version` (the
    `server_version` parameter of the start-up answer rewritten), as an old server would."""

    def __init__(self, dsn: str, version: str) -> None:
        parts = urlsplit(dsn)
        self._upstream = parts
        self._version = version.encode()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> OldServerProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    def dsn(self) -> str:
        user = self._upstream.username or "postgres"
        return f"postgresql://{user}:{PASSWORD}@127.0.0.1:{self.port}{self._upstream.path}?sslmode=disable"

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        query = dict(parse_qsl(self._upstream.query))
        port = self._upstream.port or int(query.get("port", 5432))
        socket_dir = query.get("host")
        if socket_dir:  # the embedded server: a Unix socket
            return await asyncio.open_unix_connection(f"{socket_dir}/.s.PGSQL.{port}")
        return await asyncio.open_connection(self._upstream.hostname, port)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await self._open_upstream()
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            await asyncio.gather(
                self._forward(client_r, server_w), self._rewrite(server_r, client_w)
            )
        client_w.close()
        server_w.close()

    async def _rewrite(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        name = b"server_version\0"
        while True:  # messages: a type byte, a length counting itself, the body
            head = await reader.readexactly(5)
            body = await reader.readexactly(int.from_bytes(head[1:], "big") - 4)
            if head[:1] == b"S" and body.startswith(name):
                body = name + self._version + b"\0"
                head = head[:1] + (len(body) + 4).to_bytes(4, "big")
            writer.write(head + body)
            if head[:1] == b"Z":  # ready for query: the start-up answer is over
                break
        await self._forward(reader, writer)

    @staticmethod
    async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()


@pytest.mark.parametrize("migrate", [True, False], ids=["migrating", "not-migrating"])
async def test_a_server_older_than_13_stops_the_start_in_one_line(
    db_dsn: str, tmp_path: Path, migrate: bool
) -> None:
    async with OldServerProxy(db_dsn, "12.22") as proxy:
        conn = await asyncpg.connect(proxy.dsn())  # the proxy works, and lies
        try:
            assert conn.get_server_version().major == 12
        finally:
            await conn.close()
        line = await asyncio.to_thread(start_fails, proxy.dsn(), tmp_path, migrate=migrate)
    assert "PostgreSQL 12.22" in line
    assert "13 or later" in line


# --- what the start-up tells ----------------------------------------------------------------------


def database_line(logs: str) -> dict[str, Any]:
    """The one log line of the start-up that says which PostgreSQL serves the queue."""
    found = [
        line
        for line in map(json.loads, filter(None, logs.splitlines()))
        if "server_version" in line
    ]
    assert len(found) == 1, logs
    return found[0]


async def test_the_start_names_the_embedded_servers_version_and_a_dsn_to_reach_it(
    launcher: Launcher,
) -> None:
    # not under tmp_path: run as root, the server runs as another user, who may not enter the
    # directory pytest keeps private to root
    data_dir = Path(tempfile.mkdtemp(prefix="dl-embedded-"))
    service = launcher.start("unused", DL_DB_DSN=None, DL_DATA_DIR=str(data_dir))
    try:
        await service.wait_healthy(within=120)  # a first start runs initdb
        line = database_line(service.logs())
        assert line["embedded"] is True
        assert f"PostgreSQL {line['server_version']}" in line["message"]
        assert line["dsn"] in line["message"]
        conn = await asyncpg.connect(line["dsn"])  # as logged: no password to fill in
        try:
            assert await conn.fetchval("SHOW server_version") == line["server_version"]
            assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 0  # the queue's own
        finally:
            await conn.close()
        service.terminate()  # gracefully: the embedded server stops with its last user
        assert await service.wait(within=60) == 0, service.logs()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


async def test_the_start_names_the_server_of_dl_db_dsn_with_the_password_masked(
    launcher: Launcher, db_dsn: str
) -> None:
    service = launcher.start(with_credentials(db_dsn, "postgres", PASSWORD))
    await service.wait_healthy()
    line = database_line(service.logs())
    assert line["embedded"] is False
    assert PASSWORD not in service.logs()
    conn = await asyncpg.connect(db_dsn)
    try:
        assert await conn.fetchval("SHOW server_version") == line["server_version"]
    finally:
        await conn.close()
