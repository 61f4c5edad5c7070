"""Fault scenarios: real service processes, a real PostgreSQL, the ledger, the checker.

Every scenario starts `python -m dataloader` replicas that run `tests.faults.pipeline`, feeds
them jobs (several per lock_key, so the per-key lock is exercised), hits them with faults,
waits until every job is final, and asserts the checker found nothing. With
`DL_FAULT_REPORT=<file>` each scenario appends its report (one JSON line) to that file;
`DL_FAULT_ROUNDS=<n>` multiplies the rounds of the scenarios that repeat (a longer run).
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from dataloader import NewJob
from dataloader.config import Settings
from dataloader.storage.repositories import enqueue_many

from ..integration_tests.helpers import wait_until
from ..integration_tests.procs import Launcher, ServiceProcess, launched
from . import ledger
from .pipeline import TASK
from .server import PrivateServer

REPO_ROOT = Path(__file__).resolve().parents[2]
QUEUE = "faults"

#: Short leases and beats so that a fault is noticed within seconds.
FAULT_ENV: dict[str, str] = {
    "DL_PIPELINE_MODULES": "tests.faults.pipeline",
    "DL_DEFAULT_LEASE_TTL_SEC": "2",
    "DL_HEARTBEAT_SEC": "0.3",
    "DL_REAPER_PERIOD_SEC": "0.3",
    "DL_CLAIM_BACKOFF_SEC": "0.2",
    "DL_POLL_INTERVAL_SEC": "0.5",
    "DL_SHUTDOWN_TIMEOUT_SEC": "2",
    # 4 + listener + lock holder + the pipeline's ledger pool (≤ 4) per replica: two scenarios
    # of three replicas at once stay well within a server's default 100 connections
    "DL_DB_POOL_SIZE": "4",
}


#: The settings that time a dead process's recovery, at their defaults (FAULT_ENV and the
#: launcher shorten them): a scenario that measures that recovery runs with these.
DEFAULT_TIMINGS: dict[str, str] = {
    f"DL_{name.upper()}": str(Settings.model_fields[name].default)
    for name in (
        "heartbeat_sec",
        "reaper_period_sec",
        "leader_lease_sec",
        "default_lease_ttl_sec",
        "poll_interval_sec",
        "claim_backoff_sec",
        "retry_base_sec",
        "presence_period_sec",
    )
}


def rounds(default: int) -> int:
    """Rounds of a repeating scenario (`DL_FAULT_ROUNDS` times more on demand)."""
    return default * max(1, int(os.environ.get("DL_FAULT_ROUNDS", "1")))


class Scenario:
    """One scenario's replicas, jobs, faults and final check."""

    def __init__(self, name: str, launcher: Launcher, dsn: str, conn: asyncpg.Connection) -> None:
        self.name = name
        self.launcher = launcher
        self.dsn = dsn
        self.conn = conn
        self.killed_at: dict[int, dt.datetime] = {}
        #: (pid, when) of every fault that hit a process.
        self.faults: list[tuple[int, dt.datetime]] = []
        self.last_fault = time.monotonic()
        self.jobs_added = 0

    async def start(self, count: int = 1, concurrency: int = 4, **env: str) -> list[ServiceProcess]:
        """Start `count` replicas serving the fault queue; returns them once healthy."""
        path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        workers = f'[{{"queue": "{QUEUE}", "concurrency": {concurrency}}}]'
        replicas = [
            self.launcher.start(
                self.dsn, **(FAULT_ENV | {"PYTHONPATH": path, "WORKERS_JSON": workers} | env)
            )
            for _ in range(count)
        ]
        for replica in replicas:
            await replica.wait_healthy()
        return replicas

    async def enqueue(
        self, jobs: int, per_key: int = 3, steps: int = 3, step_sec: float = 0.01, **extra: Any
    ) -> None:
        """Add `jobs` jobs, `per_key` of them sharing each lock_key."""
        first = self.jobs_added
        self.jobs_added += jobs
        await enqueue_many(
            self.conn,
            [
                NewJob(
                    queue=QUEUE,
                    task=TASK,
                    lock_key=f"{self.name}-key-{i // per_key}",
                    args={"steps": steps, "step_sec": step_sec},
                    max_attempts=extra.get("max_attempts", 50),
                    lease_ttl_sec=extra.get("lease_ttl_sec", 2),
                )
                for i in range(first, first + jobs)
            ],
        )

    async def kill(self, replica: ServiceProcess, signum: int = signal.SIGKILL) -> None:
        """Kill a replica outright, noting when: the last moment it could have done anything
        (its runs' ends; the runs' own times come from this host's clock too)."""
        self.killed_at[replica.pid] = dt.datetime.now(dt.UTC)
        replica.send(signum)
        await replica.wait()
        self.hit(replica)

    async def leads(self, replica: ServiceProcess) -> bool:
        """Whether `replica` holds the maintenance lease (its worker id names its pid)."""
        holder = await self.conn.fetchval(
            "SELECT holder FROM dl_leases WHERE name = 'maintenance' AND expires_at > now()"
        )
        return holder is not None and f"-{replica.pid}-" in holder

    async def claim_all_on(
        self, replica: ServiceProcess, others: list[ServiceProcess], jobs: int, **enqueue: Any
    ) -> list[uuid.UUID]:
        """Enqueue `jobs` jobs and have `replica` alone start them all (the others are frozen,
        SIGSTOP, for the moment it takes); their ids."""
        for other in others:
            other.send(signal.SIGSTOP)
        try:
            await self.enqueue(jobs, **enqueue)

            async def all_started() -> bool:
                n: int = await self.conn.fetchval(
                    "SELECT count(*) FROM fault_runs WHERE pid = $1 AND ended_at IS NULL",
                    replica.pid,
                )
                return n == jobs

            await wait_until(all_started, what=f"{replica.name} to start every job")
        finally:
            for other in others:
                other.send(signal.SIGCONT)
        rows = await self.conn.fetch("SELECT job_id FROM fault_runs WHERE pid = $1", replica.pid)
        return [row["job_id"] for row in rows]

    async def restarted_elsewhere(
        self, jobs: list[uuid.UUID], replica: ServiceProcess
    ) -> dt.datetime:
        """When the last of `jobs` started running again on `replica`."""

        async def all_restarted() -> dt.datetime | None:
            at: list[dt.datetime] = [
                r["at"]
                for r in await self.conn.fetch(
                    "SELECT min(started_at) AS at FROM fault_runs"
                    " WHERE pid = $1 AND job_id = ANY($2::uuid[]) GROUP BY job_id",
                    replica.pid,
                    jobs,
                )
            ]
            return max(at) if len(at) == len(jobs) else None

        return await wait_until(all_restarted, 60, f"the jobs to run again on {replica.name}")

    async def reconnect(self) -> None:
        """A new connection for the test itself (after its server restarted)."""
        await self.conn.close(timeout=1)
        self.conn = await asyncpg.connect(self.dsn)

    def hit(self, replica: ServiceProcess) -> None:
        """Note that a fault hit this replica (its claims may end without a run)."""
        self.faults.append((replica.pid, dt.datetime.now(dt.UTC)))
        self.fault_now()

    def fault_now(self) -> None:
        """Note that a fault began now (recovery is timed from the last one)."""
        self.last_fault = time.monotonic()

    async def settle(self, timeout: float = 60) -> float:
        """Wait until every job is final; returns the seconds since the last fault."""

        async def settled() -> bool:
            return await ledger.unsettled(self.conn) == 0

        await wait_until(settled, timeout, f"every job of {self.name} to finish")
        return time.monotonic() - self.last_fault

    async def check(
        self, rounds: int, recovered_in_s: float, final: frozenset[str] = ledger.SUCCEEDED
    ) -> ledger.Report:
        """Run the checker; fail on any violation; record the report if asked to."""
        report = await ledger.check(
            self.conn,
            self.name,
            rounds=rounds,
            recovered_in_s=recovered_in_s,
            killed_at=self.killed_at,
            faults=self.faults,
            final=final,
        )
        append_report(report)
        assert not report.violations(), "\n".join(report.violations())
        assert report.jobs == self.jobs_added
        return report


def append_report(report: ledger.Report) -> None:
    """One JSON line in the file `DL_FAULT_REPORT` names, if it names one."""
    target = os.environ.get("DL_FAULT_REPORT")
    if target:
        with Path(target).open("a", encoding="utf-8") as out:
            out.write(report.as_json() + "\n")


@pytest.fixture
async def conn(db_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(db_dsn)
    await ledger.install(conn)
    yield conn
    await conn.close()


@pytest.fixture
async def launcher(tmp_path: Path) -> AsyncIterator[Launcher]:
    async with launched(tmp_path) as started:
        yield started


@pytest.fixture
async def private_server() -> AsyncIterator[PrivateServer]:
    """A server of the test's own (it may be restarted), with the ledger installed."""
    server = PrivateServer()
    try:
        await server.start()
        conn = await asyncpg.connect(server.dsn)
        try:
            await ledger.install(conn)
        finally:
            await conn.close()
        yield server
    finally:
        server.stop()


@pytest.fixture
def scenario(
    request: pytest.FixtureRequest, launcher: Launcher, db_dsn: str, conn: asyncpg.Connection
) -> Scenario:
    return Scenario(request.node.name.removeprefix("test_"), launcher, db_dsn, conn)
