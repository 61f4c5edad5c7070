"""A PostgreSQL failover under load: two replicas on a Patroni cluster (tests/engines/
patroni.py) with a synchronous standby, producers over HTTP and through the library, a queue
limit and a cron schedule, then a planned switchover and, once all runs again, the primary's
machine lost (Patroni and PostgreSQL killed).

Asserted: every trigger answered 2xx ends `succeeded`, its effect written once (the ledger's
checker: no overlap of a lock_key, no advisory lock left); the API answered only 2xx or 503
throughout; the library raised only `DatabaseUnavailable`; both replicas are whole afterwards
(presence, listener, maintenance leadership, jobs running on both). Measured: the time from
the kill to the first job finishing after it, and trigger latencies around each fault.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from dataloader import Client, DatabaseUnavailable, Settings

from ..engines.patroni import PatroniCluster
from ..integration_tests.helpers import wait_until
from ..integration_tests.procs import Launcher, ServiceProcess
from . import ledger
from .conftest import QUEUE, Scenario
from .pipeline import TASK

#: Attempts to spare: a run whose lock connection a fault cuts costs one.
MAX_ATTEMPTS = 50
#: The queue's limit of jobs running at once, below the two replicas' 8 slots.
MAX_RUNNING = 6
#: One cron slot every 2 seconds (six fields: seconds last).
CRON = [
    {
        "name": "tick",
        "schedule": "* * * * * */2",
        "task": TASK,
        "queue": QUEUE,
        "args": {"steps": 1},
    }
]


@pytest.fixture
async def cluster() -> AsyncIterator[PatroniCluster]:
    async with PatroniCluster() as started:
        yield started


@dataclass
class Answer:
    """One producer call: when it started (monotonic), how long it took, and what it gave."""

    at: float
    latency: float
    outcome: str  # an HTTP status, or the exception's class name
    job_id: uuid.UUID | None = None


@dataclass
class Producers:
    """Producers over HTTP (one per replica) and through the library, until `stop` is set."""

    replicas: list[ServiceProcess]
    dsn: str
    http: list[Answer] = field(default_factory=list)
    library: list[Answer] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def over_http(self, n: int, replica: ServiceProcess) -> None:
        async with httpx.AsyncClient(base_url=replica.base_url, timeout=60) as client:
            i = 0
            while not self.stop.is_set():
                body = {
                    "queue": QUEUE,
                    "task": TASK,
                    "lock_key": f"http{n}-{i // 3}",  # three jobs per key
                    "args": {"steps": 3, "step_sec": 0.03},
                    "max_attempts": MAX_ATTEMPTS,
                    "lease_ttl_sec": 2,
                }
                started = time.monotonic()
                try:
                    response = await client.post("/api/v1/jobs/trigger", json=body)
                    outcome = str(response.status_code)
                    job = response.json().get("job_id") if response.is_success else None
                except httpx.HTTPError as exc:
                    outcome, job = type(exc).__name__, None
                self.http.append(
                    Answer(started, time.monotonic() - started, outcome, job and uuid.UUID(job))
                )
                i += 1
                await asyncio.sleep(0.05)  # a producer's pace, not a synchronisation

    async def through_the_library(self) -> None:
        settings = Settings(_env_file=None, db_dsn=self.dsn)  # type: ignore[call-arg]
        async with Client.connect(self.dsn, settings=settings) as client:
            i = 0
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    result = await client.enqueue(
                        TASK,
                        {"steps": 3, "step_sec": 0.03},
                        lock_key=f"lib-{i // 3}",
                        queue=QUEUE,
                        max_attempts=MAX_ATTEMPTS,
                        lease_ttl=2,
                    )
                    answer = Answer(started, time.monotonic() - started, "ok", result.job_id)
                except Exception as exc:  # recorded: only DatabaseUnavailable may show
                    answer = Answer(started, time.monotonic() - started, type(exc).__name__)
                    if not isinstance(exc, DatabaseUnavailable):
                        answer.outcome += f": {exc}"
                self.library.append(answer)
                i += 1
                await asyncio.sleep(0.05)

    def acknowledged(self) -> set[uuid.UUID]:
        return {a.job_id for a in self.http + self.library if a.job_id is not None}


def percentiles(answers: list[Answer], since: float, until: float) -> dict[str, Any]:
    """p50/p99 (ms) of the successful calls started in [since, until), and the failed ones."""
    window = [a for a in answers if since <= a.at < until]
    ok = sorted(a.latency for a in window if a.outcome in ("200", "201", "ok"))
    figures: dict[str, Any] = {"calls": len(window), "failed": len(window) - len(ok)}
    if ok:
        figures["p50_ms"] = round(statistics.median(ok) * 1000, 1)
        figures["p99_ms"] = round(ok[min(len(ok) - 1, int(len(ok) * 0.99))] * 1000, 1)
        figures["max_ms"] = round(ok[-1] * 1000, 1)
    return figures


async def whole(replica: ServiceProcess, conn: asyncpg.Connection) -> bool:
    """`replica` answers /status, its presence is fresh, and its listener is connected."""
    response = await replica.client.get("/status")
    if response.status_code != 200:
        return False
    body = response.json()
    fresh = any(w["pid"] == replica.pid and w["seen_ago_sec"] < 6 for w in body["live_workers"])
    listening = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dataloader-listener'"
        " AND datname = current_database()"
    )
    return fresh and listening == 2


async def test_a_switchover_then_a_lost_primary_under_load_lose_no_acknowledged_job(
    cluster: PatroniCluster, launcher: Launcher
) -> None:
    conn = await asyncpg.connect(cluster.dsn)
    await ledger.install(conn)
    scenario = Scenario("failover", launcher, cluster.dsn, conn)
    try:
        replicas = await scenario.start(
            2,
            concurrency=4,
            DL_CRON=json.dumps(CRON),
            DL_DEFAULT_MAX_ATTEMPTS=str(MAX_ATTEMPTS),
        )
        limits = await replicas[0].client.put(
            f"/api/v1/queues/{QUEUE}/limits", json={"max_running": MAX_RUNNING}
        )
        assert limits.status_code == 200, limits.text
        producers = Producers(replicas, cluster.dsn)
        running = asyncio.gather(
            *(producers.over_http(n, replica) for n, replica in enumerate(replicas)),
            producers.through_the_library(),
        )
        marks: dict[str, float] = {"start": time.monotonic()}
        try:
            await asyncio.sleep(3)  # the load before any fault
            marks["switchover"] = time.monotonic()
            for replica in replicas:
                scenario.hit(replica)
            await cluster.switchover()
            await scenario.reconnect()
            await cluster.wait_until_replicated()
            for replica in replicas:
                await wait_until(lambda r=replica: whole(r, scenario.conn), 60, f"{replica.name} whole")
            marks["recovered"] = time.monotonic()
            await asyncio.sleep(3)  # the load between the faults

            marks["kill"] = time.monotonic()
            for replica in replicas:
                scenario.hit(replica)
            old = await cluster.kill_primary()
            assert cluster.killed_at is not None
            killed_at = cluster.killed_at
            await cluster.wait_for_new_leader(old)
            marks["new_leader"] = time.monotonic()
            await scenario.reconnect()
            for replica in replicas:
                await wait_until(lambda r=replica: whole(r, scenario.conn), 60, f"{replica.name} whole")
            marks["whole"] = time.monotonic()
            await asyncio.sleep(3)  # the load after
        finally:
            producers.stop.set()
            await running
        marks["end"] = time.monotonic()

        recovered_in = await scenario.settle(timeout=90)
        report = await ledger.check(
            scenario.conn,
            scenario.name,
            rounds=1,
            recovered_in_s=recovered_in,
            killed_at=scenario.killed_at,
            faults=scenario.faults,
        )
        acknowledged = producers.acknowledged()
        states = dict(
            await scenario.conn.fetch(
                "SELECT job_id, status::text FROM dl_jobs WHERE job_id = ANY($1::uuid[])",
                list(acknowledged),
            )
        )
        first_done = await scenario.conn.fetchval(
            "SELECT min(written_at) FROM fault_effects WHERE written_at > $1", killed_at
        )
        after_kill = await scenario.conn.fetch(
            "SELECT DISTINCT pid FROM fault_runs WHERE started_at > $1", killed_at
        )
        leaders = [
            (await replica.client.get("/status")).json()["maintenance"]["this_process_leads"]
            for replica in replicas
        ]
        cron_after_kill = await scenario.conn.fetchval(
            "SELECT count(*) FROM dl_jobs WHERE created_at > $1 AND args = '{\"steps\": 1}'",
            killed_at,
        )

        windows = {
            "before": (marks["start"], marks["switchover"]),
            "switchover": (marks["switchover"], marks["recovered"]),
            "between": (marks["recovered"], marks["kill"]),
            "failover": (marks["kill"], marks["whole"]),
            "after": (marks["whole"], marks["end"]),
        }
        figures = {
            "scenario": "failover",
            "jobs": report.jobs,
            "runs": report.runs,
            "acknowledged": len(acknowledged),
            "kill_to_new_leader_s": round(marks["new_leader"] - marks["kill"], 2),
            "kill_to_first_job_done_s": first_done
            and round((first_done - killed_at).total_seconds(), 2),
            "kill_to_replicas_whole_s": round(marks["whole"] - marks["kill"], 2),
            "http": {k: percentiles(producers.http, *w) for k, w in windows.items()},
            "library": {k: percentiles(producers.library, *w) for k, w in windows.items()},
            "http_outcomes": count(producers.http),
            "library_outcomes": count(producers.library),
        }
        print(json.dumps(figures, indent=1))
        target = os.environ.get("DL_FAULT_REPORT")
        if target:
            with Path(target).open("a", encoding="utf-8") as out:
                out.write(report.as_json() + "\n")
                out.write(json.dumps(figures) + "\n")

        assert not report.violations(), "\n".join(report.violations())
        assert set(count(producers.http)) <= {"200", "201", "503"}, count(producers.http)
        assert set(count(producers.library)) <= {"ok", "DatabaseUnavailable"}, count(
            producers.library
        )
        assert len(states) == len(acknowledged), "acknowledged triggers are missing"
        assert set(states.values()) == {"succeeded"}
        assert first_done is not None
        assert {row["pid"] for row in after_kill} >= {r.pid for r in replicas}
        assert sorted(leaders) == [False, True]  # maintenance is led again, by one
        assert cron_after_kill > 0  # and the schedule fires again
        assert all(replica.proc.poll() is None for replica in replicas)
    finally:
        await scenario.conn.close()


def count(answers: list[Answer]) -> dict[str, int]:
    found: dict[str, int] = {}
    for answer in answers:
        found[answer.outcome] = found.get(answer.outcome, 0) + 1
    return found
