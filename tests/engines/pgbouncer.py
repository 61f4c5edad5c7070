"""PgBouncer in front of a test's PostgreSQL: Debian's `pgbouncer` (1.18 on CI), started by
the test in `session` or `transaction` pool mode, on a free port, with its configuration and
log in a temporary directory, and stopped (no process left) when the test ends.

It forwards every database name to the same database of the server the test gives it (a
TCP or Unix-socket DSN), trusting the client as the test servers do. Outside CI a machine
without pgbouncer skips the tests that need it with a one-line reason; in CI (`CI=true`) a
missing pgbouncer fails them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from ..integration_tests.procs import free_port

PGBOUNCER = Path("/usr/sbin/pgbouncer")
#: The user pgbouncer runs as when the tests run as root (it refuses to run as root).
RUN_AS = "postgres"
#: Startup parameters clients send that pgbouncer would otherwise refuse (`asyncpg` sends only
#: what it is given in server_settings; psycopg and JDBC send these two).
IGNORED_STARTUP_PARAMETERS = "extra_float_digits,options"

PoolMode = Literal["session", "transaction"]


def require_pgbouncer() -> Path:
    """pgbouncer's path; skip (fail in CI) when it is missing."""
    if PGBOUNCER.exists():
        return PGBOUNCER
    missing = f"{PGBOUNCER} is missing (apt-get install pgbouncer)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"the PgBouncer tests need pgbouncer: {missing}")
    pytest.skip(missing)


@dataclass(frozen=True)
class Server:
    """Where pgbouncer finds the PostgreSQL server of a DSN."""

    host: str  # a host name or address, or a Unix socket's directory
    port: int
    user: str
    password: str | None

    @classmethod
    def of(cls, dsn: str) -> Server:
        parts = urlsplit(dsn)
        query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
        host = query.get("host") or unquote(parts.hostname or "") or "127.0.0.1"
        port = int(query.get("port") or parts.port or 5432)
        user = query.get("user") or unquote(parts.username or "") or "postgres"
        password = query.get("password") or (unquote(parts.password) if parts.password else None)
        return cls(host, port, user, password)

    def connect_string(self) -> str:
        """The `[databases]` entry's options (the database name is the client's own)."""
        line = f"host={self.host} port={self.port} user={self.user}"
        return line if self.password is None else f"{line} password={self.password}"


@dataclass(frozen=True)
class PgBouncer:
    """A running pgbouncer: `dsn(database)` reaches `database` of the server through it."""

    port: int
    mode: PoolMode
    user: str
    workdir: Path

    def dsn(self, database: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def through(self, server_dsn: str) -> str:
        """`server_dsn`'s database, reached through this pgbouncer."""
        return self.dsn(urlsplit(server_dsn).path.lstrip("/"))

    def log(self) -> str:
        path = self.workdir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _config(server: Server, port: int, mode: PoolMode, workdir: Path, pool_size: int) -> str:
    return f"""\
[databases]
* = {server.connect_string()}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {workdir}/userlist.txt
pool_mode = {mode}
default_pool_size = {pool_size}
max_client_conn = 1000
ignore_startup_parameters = {IGNORED_STARTUP_PARAMETERS}
logfile = {workdir}/pgbouncer.log
pidfile = {workdir}/pgbouncer.pid
admin_users = {server.user}
server_check_delay = 1
"""


def _as_run_user(server: Server) -> tuple[Callable[[], None] | None, int | None]:
    """(preexec_fn, uid) dropping to an unprivileged user when we are root (pgbouncer refuses
    to run as root): the owner of the server's Unix-socket directory (only it may enter the
    embedded server's), else RUN_AS."""
    if os.geteuid() != 0:
        return None, None
    uid = os.stat(server.host).st_uid if server.host.startswith("/") else 0
    user = pwd.getpwuid(uid) if uid != 0 else pwd.getpwnam(RUN_AS)

    def drop() -> None:
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    return drop, user.pw_uid


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT (pgbouncer's fast shutdown: SIGTERM would wait for its clients), then SIGKILL if
    it lingers; reaped either way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait(timeout=10)


def _start(
    server: Server, mode: PoolMode, pool_size: int
) -> tuple[PgBouncer, subprocess.Popen[bytes]]:
    """Write the configuration and start pgbouncer; returns once it listens."""
    binary = require_pgbouncer()
    workdir = Path(tempfile.mkdtemp(prefix="dl-pgbouncer-"))
    preexec, uid = _as_run_user(server)
    port = free_port()
    (workdir / "userlist.txt").write_text(f'"{server.user}" ""\n')
    config = workdir / "pgbouncer.ini"
    config.write_text(_config(server, port, mode, workdir, pool_size))
    if uid is not None:
        for path in (workdir, *workdir.iterdir()):
            os.chown(path, uid, -1)
    with (workdir / "stderr.log").open("wb") as stderr:
        proc = subprocess.Popen(
            [str(binary), str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            preexec_fn=preexec,
            cwd=workdir,
        )
    bouncer = PgBouncer(port, mode, server.user, workdir)
    deadline = time.monotonic() + 15
    while not _listening(port):  # it says nothing when it is ready: poll its port
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            stderr_text = (workdir / "stderr.log").read_text(errors="replace")
            log = bouncer.log()
            shutil.rmtree(workdir, ignore_errors=True)
            raise AssertionError(f"pgbouncer did not listen on {port}:\n{stderr_text}\n{log}")
        time.sleep(0.02)
    return bouncer, proc


@contextlib.asynccontextmanager
async def pgbouncer(
    server_dsn: str, mode: PoolMode, *, pool_size: int = 20
) -> AsyncIterator[PgBouncer]:
    """pgbouncer in `mode` in front of the server of `server_dsn`, `pool_size` server
    connections at most per database and user; stopped on exit (no process left)."""
    require_pgbouncer()  # skips (fails in CI) before anything starts
    bouncer, proc = await asyncio.to_thread(_start, Server.of(server_dsn), mode, pool_size)
    try:
        yield bouncer
    finally:
        await asyncio.to_thread(_stop, proc)
        shutil.rmtree(bouncer.workdir, ignore_errors=True)
