"""The real service as a subprocess (`python -m dataloader`), for tests of what only a process
shows: start-up on a fresh or hand-made database, exit codes, signals, a process killed outright.

The child gets a clean environment (no `DL_*`/`WORKERS_JSON` of the caller), short timings, a
free port, and a temporary working directory (so no `.env` of the repository is read); its
stdout and stderr go to one log file that a failing assertion can show.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO

import httpx

from .helpers import JobsApi

#: Short timings so that leases, heartbeats and the reaper act within a test's patience.
FAST_TIMINGS: dict[str, str] = {
    "DL_HEARTBEAT_SEC": "0.2",
    "DL_REAPER_PERIOD_SEC": "0.2",
    "DL_LEADER_LEASE_SEC": "1",
    "DL_DEFAULT_LEASE_TTL_SEC": "2",
    "DL_RETRY_BASE_SEC": "0",
    "DL_POLL_INTERVAL_SEC": "1",
    "DL_CLAIM_BACKOFF_SEC": "0.3",
}

#: The `dataloader` console script of the interpreter running the tests.
DATALOADER_SCRIPT = Path(sys.executable).parent / "dataloader"

#: The service as the README starts it.
PYTHON_M_DATALOADER = (sys.executable, "-m", "dataloader")


#: Ports handed to services, below the ephemeral range that outgoing connections take theirs
#: from (so none can take a port between the test choosing it and the service binding it),
#: in a band of their own per test process (pytest-xdist worker `gwN`), taken in turn from a
#: random start (two runs on one machine rarely meet).
PORT_RANGE = (20000, 32000)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
PORT_BAND_SIZE = (PORT_RANGE[1] - PORT_RANGE[0]) // max(_WORKERS, 1)
_next_port = [random.randrange(PORT_BAND_SIZE)]


def free_port() -> int:
    """A TCP port nobody listens on right now, not handed out before by this test process."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    band = PORT_RANGE[0] + PORT_BAND_SIZE * int(worker.removeprefix("gw") or 0)
    for _ in range(PORT_BAND_SIZE):
        offset = _next_port[0]
        _next_port[0] = (offset + 1) % PORT_BAND_SIZE
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", band + offset))
            except OSError:
                continue  # someone else's
            return band + offset
    raise RuntimeError(f"no free port in {band}..{band + PORT_BAND_SIZE - 1}")


def clean_env(overrides: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """os.environ without dataloader's variables, plus `overrides` (None removes a variable)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("DL_") and name != "WORKERS_JSON"
    }
    env["PYTHONUNBUFFERED"] = "1"
    for name, value in (overrides or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def run_cli(
    args: Sequence[str], env: Mapping[str, str | None], cwd: Path, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion with a clean environment; stderr is merged into stdout."""
    return subprocess.run(
        list(args),
        env=clean_env(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )


def one_line(output: str) -> str:
    """The only non-blank line of `output` (fails showing them all otherwise)."""
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{output}"
    return lines[0]


class ServiceProcess(JobsApi):
    """One `python -m dataloader` child process (or `command`) and an HTTP client for it."""

    def __init__(
        self,
        name: str,
        dsn: str,
        workdir: Path,
        env: Mapping[str, str | None],
        command: Sequence[str] = PYTHON_M_DATALOADER,
    ) -> None:
        self.name = name
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.log_path = workdir / f"{name}.log"
        self.env = clean_env(
            {"DL_DB_DSN": dsn, "DL_HTTP_PORT": str(self.port), **FAST_TIMINGS, **env}
        )
        self._log: IO[bytes] = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            list(command),
            env=self.env,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.client = httpx.AsyncClient(base_url=self.base_url, timeout=10)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def logs(self) -> str:
        """Everything the process wrote so far (stdout and stderr)."""
        self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def _fail(self, message: str) -> AssertionError:
        return AssertionError(f"{self.name}: {message}{self.describe_failure()}")

    async def wait_healthy(self, within: float = 60) -> float:
        """Poll GET /health until it answers 200; returns the seconds it took."""
        started = time.monotonic()
        deadline = started + within
        while True:
            code = self.proc.poll()
            if code is not None:
                raise self._fail(f"exited with code {code} before becoming healthy")
            try:
                response = await self.client.get("/health", timeout=1)
                if response.status_code == 200:
                    return time.monotonic() - started
            except httpx.TransportError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise self._fail(f"/health did not answer within {within}s")
            await asyncio.sleep(0.05)

    def terminate(self) -> None:
        """SIGTERM: the graceful stop of a container."""
        self.proc.terminate()

    def send(self, signum: int) -> None:
        """Deliver any signal (SIGINT: Ctrl+C in a terminal)."""
        self.proc.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL: the process dies at once, leaving its jobs and connections behind."""
        self.proc.kill()

    async def wait(self, within: float = 30) -> int:
        """Wait for the process to exit; returns its exit code (negative: killed by signal)."""
        deadline = time.monotonic() + within
        while (code := self.proc.poll()) is None:
            if time.monotonic() > deadline:
                raise self._fail(f"still running after {within}s")
            await asyncio.sleep(0.02)
        return code

    def describe_failure(self) -> str:
        described = f"\n--- log of {self.name} ---\n{self.logs()}"
        if self.proc.poll() is None:  # why a signal did not stop it: blocked, ignored, caught
            described += f"\n--- its signals ---\n{signal_masks(self.proc.pid)}"
        return described

    # --- teardown -----------------------------------------------------------------------------

    def close(self) -> None:
        """Kill the process if it still runs, reap it and release the log file."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        finally:
            self._log.close()


class Launcher:
    """Starts service processes; `aclose` kills whatever is left."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[ServiceProcess] = []

    def start(
        self,
        dsn: str,
        name: str | None = None,
        command: Sequence[str] = PYTHON_M_DATALOADER,
        **env: str | None,
    ) -> ServiceProcess:
        """Start `python -m dataloader` (or another `command`) on `dsn`; keyword arguments are
        extra variables."""
        name = name or f"service{len(self.started) + 1}"
        service = ServiceProcess(name, dsn, self.workdir, env, command)
        self.started.append(service)
        return service

    async def aclose(self) -> None:
        """Kill every process still running and close the HTTP clients."""
        try:
            for service in self.started:
                service.close()
        finally:
            for service in self.started:
                await service.client.aclose()


@asynccontextmanager
async def launched(workdir: Path) -> AsyncIterator[Launcher]:
    """A Launcher whose processes are killed on exit, whatever the test did."""
    launcher = Launcher(workdir)
    try:
        yield launcher
    finally:
        await launcher.aclose()


def signal_masks(pid: int) -> str:
    """The signals process `pid` blocks, ignores and catches (Linux's /proc, as hex masks)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return f"unknown ({exc})"
    return "\n".join(line for line in status if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
