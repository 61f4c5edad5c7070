"""A primary and its streaming standby, of one test module's own: PostgreSQL 15 from Debian's
packages (`postgresql-15`), each cluster in a temporary directory, on free TCP ports of
127.0.0.1 (trust authentication, as `initdb --auth=trust` sets it up). The standby is made by
`pg_basebackup -R` and streams from the primary; `pause_replay`/`resume_replay` hold its view
of the primary still, `stop_standby`/`start_standby` take it away and back.

PostgreSQL refuses to run as root: when the tests run as root every server command runs as
the `postgres` user (which the package creates), in directories it owns. Missing binaries skip
the tests with a one-line reason, or fail them when CI=true. `stop()` stops both servers and
deletes their files; the `standby_pair` fixture calls it however the tests end.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..integration_tests.procs import free_port

#: The server binaries of the same major version for both clusters (a standby must match).
BIN = Path("/usr/lib/postgresql/15/bin")
#: The system user servers run as when the tests run as root.
SYSTEM_USER = "postgres"
#: How long a server may take to start, stop or catch up.
PATIENCE_SEC = 60.0


def missing() -> str | None:
    """Why the pair cannot be built here (None: it can)."""
    for tool in ("initdb", "pg_ctl", "pg_basebackup", "psql"):
        if not (BIN / tool).exists():
            return f"PostgreSQL 15's {tool} is missing ({BIN}; apt-get install postgresql-15)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            return f"running as root, and there is no {SYSTEM_USER!r} user to run PostgreSQL as"
    return None


def require_binaries() -> None:
    """Skip the calling test when the pair cannot be built (fail it when CI=true)."""
    reason = missing()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the streaming standby tests need PostgreSQL 15: {reason}")
        pytest.skip(reason)


class StandbyPair:
    """A primary and a streaming standby of it (see the module's docstring)."""

    def __init__(self) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="dl-standby-"))
        self.primary_dir = self.home / "primary"
        self.standby_dir = self.home / "standby"
        self.primary_port = free_port()
        self.standby_port = free_port()
        self._as_root = os.geteuid() == 0

    # the servers ---------------------------------------------------------------------------

    def start(self) -> None:
        """Build and start the primary, then the standby from its base backup, and wait
        until the standby streams."""
        if self._as_root:
            user = pwd.getpwnam(SYSTEM_USER)
            os.chown(self.home, user.pw_uid, user.pw_gid)
        self._run(
            "initdb", "-D", str(self.primary_dir), "-U", "postgres", "--auth=trust", "--no-sync"
        )
        self._configure(
            self.primary_dir,
            port=self.primary_port,
            listen_addresses="'127.0.0.1'",
            unix_socket_directories=f"'{self.home}'",
            fsync="off",  # throwaway clusters: a test's speed, not durability
            full_page_writes="off",
            shared_buffers="'32MB'",
            max_connections="50",
            hot_standby_feedback="on",  # a standby's reads are not cancelled by vacuum
        )
        self._pg_ctl(self.primary_dir, "start")
        self._run(
            "pg_basebackup",
            "-h", "127.0.0.1", "-p", str(self.primary_port), "-U", "postgres",
            "-D", str(self.standby_dir), "-R", "-X", "stream", "-c", "fast", "--no-sync",
        )  # fmt: skip
        self._configure(self.standby_dir, port=self.standby_port)
        self.start_standby()

    def start_standby(self) -> None:
        """Start the standby (again) and wait until it streams from the primary."""
        self._pg_ctl(self.standby_dir, "start")
        self.wait_streaming()

    def stop_standby(self) -> None:
        """Stop the standby at once (`-m immediate`: as a crash would)."""
        self._pg_ctl(self.standby_dir, "stop", "-m", "immediate")

    def stop(self) -> None:
        """Stop both servers (whichever runs) and delete their files."""
        for data in (self.standby_dir, self.primary_dir):
            if (data / "postmaster.pid").exists():
                with contextlib.suppress(subprocess.SubprocessError):
                    self._pg_ctl(data, "stop", "-m", "immediate")
        shutil.rmtree(self.home, ignore_errors=True)

    # what tests connect to and do ------------------------------------------------------------

    def primary_dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.primary_port}/{database}"

    def standby_dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.standby_port}/{database}"

    def primary_sql(self, sql: str, database: str = "postgres") -> str:
        """Run `sql` on the primary; its output (unaligned, tuples only)."""
        return self._psql(self.primary_port, database, sql)

    def standby_sql(self, sql: str, database: str = "postgres") -> str:
        """Run `sql` on the standby; its output (unaligned, tuples only)."""
        return self._psql(self.standby_port, database, sql)

    def pause_replay(self) -> None:
        """Hold the standby's view of the primary where it is (it still receives WAL)."""
        self.standby_sql("SELECT pg_wal_replay_pause()")
        self._until(
            lambda: self.standby_sql("SELECT pg_get_wal_replay_pause_state()") == "paused",
            "the standby's replay to pause",
        )

    def resume_replay(self) -> None:
        self.standby_sql("SELECT pg_wal_replay_resume()")

    def wait_streaming(self) -> None:
        """Return once the standby accepts connections and streams from the primary."""
        self._until(self._streaming, "the standby to stream from the primary")

    def wait_caught_up(self) -> None:
        """Return once the standby has replayed everything the primary had written now."""
        target = self.primary_sql("SELECT pg_current_wal_lsn()")
        self._until(
            lambda: self.standby_sql(
                f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"
            ) == "t",
            "the standby to replay the primary's last writes",
        )  # fmt: skip

    # plumbing ------------------------------------------------------------------------------

    def _streaming(self) -> bool:
        try:
            return (
                self.standby_sql("SELECT count(*) FROM pg_stat_wal_receiver WHERE status ="
                                 " 'streaming'") == "1"
            )  # fmt: skip
        except subprocess.CalledProcessError:  # not accepting connections yet
            return False

    def _until(self, probe: Any, what: str) -> None:
        deadline = time.monotonic() + PATIENCE_SEC
        while not probe():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {PATIENCE_SEC}s waiting for {what}")
            time.sleep(0.05)

    def _configure(self, data: Path, **settings: Any) -> None:
        lines = "".join(f"{name} = {value}\n" for name, value in settings.items())
        with (data / "postgresql.auto.conf").open("a", encoding="utf-8") as conf:
            conf.write(lines)

    def _pg_ctl(self, data: Path, action: str, *options: str) -> None:
        log = self.home / f"{data.name}.log"
        self._run("pg_ctl", "-D", str(data), "-l", str(log), "-w", "-t", "60", *options, action)

    def _psql(self, port: int, database: str, sql: str) -> str:
        done = subprocess.run(
            [str(BIN / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
             "-d", database, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql],
            capture_output=True, text=True, check=True, timeout=PATIENCE_SEC,
        )  # fmt: skip
        return done.stdout.strip()

    def _run(self, tool: str, *args: str) -> None:
        """Run a server tool, as the `postgres` user when we are root; its output is shown
        when it fails."""
        done = subprocess.run(
            [str(BIN / tool), *args],
            user=SYSTEM_USER if self._as_root else None,
            cwd=self.home,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=PATIENCE_SEC,
        )
        if done.returncode != 0:
            raise AssertionError(f"{tool} {' '.join(args)} failed:\n{done.stdout}")


@pytest.fixture(scope="module")
def standby_pair() -> Iterator[StandbyPair]:
    """A primary and its streaming standby for the module's tests, stopped afterwards."""
    require_binaries()
    pair = StandbyPair()
    try:
        pair.start()
        yield pair
    finally:
        pair.stop()
