"""A PostgreSQL failover under load: two replicas on a Patroni cluster (tests/engines/
patroni.py) with a synchronous standby; producers over HTTP and through the library, a caller
that waits for its jobs, callers of two durable processes, a queue limit and a cron schedule;
then a planned switchover and, once all runs again, the primary's machine lost (Patroni and
PostgreSQL killed).

Asserted: every trigger answered 2xx ends `succeeded`, its effect written once (the ledger's
checker: no overlap of a lock_key, no advisory lock left); the API answered only 2xx or 503
throughout; the library raised only `DatabaseUnavailable`; every process call was applied
once, in order; both replicas are whole afterwards (presence, listener, maintenance
leadership, cron, jobs running on both). Measured (printed, and in the fault report): the time
from the kill to the first job finishing after it, how long calls failed, and the latencies of
the calls before, around and after each fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
import pytest

from dataloader import Client, DatabaseUnavailable, Settings

from ..engines.patroni import PatroniCluster
from ..integration_tests.helpers import wait_until
from ..integration_tests.procs import Launcher, ServiceProcess
from . import ledger
from .conftest import QUEUE, Scenario, append_report
from .pipeline import TASK
from .processor import NAMESPACE
from .processor import QUEUE as PROCESS_QUEUE

#: Attempts to spare: a run whose lock connection a fault cuts costs one.
MAX_ATTEMPTS = 50
#: The queue's limit of jobs running at once, below the two replicas' 8 slots.
MAX_RUNNING = 6
#: Durable processes called throughout.
PROCESSES = ("p0", "p1")
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


def client_of(dsn: str) -> Any:
    return Client.connect(dsn, settings=Settings(_env_file=None, db_dsn=dsn))  # type: ignore[call-arg]


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
    #: Jobs enqueued and waited for (`Client.wait`): the wait's outcome, the job's end.
    waits: list[Answer] = field(default_factory=list)
    #: Calls of the durable processes, each retried with its key until it has an answer.
    calls: list[Answer] = field(default_factory=list)
    answered_calls: dict[str, int] = field(default_factory=dict)
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
        async with client_of(self.dsn) as client:
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
                    answer = Answer(started, time.monotonic() - started, name_of(exc))
                self.library.append(answer)
                i += 1
                await asyncio.sleep(0.05)

    async def waiting(self, client: Client) -> None:
        """Enqueue a job and wait for its end, again and again; a wait cut by an outage is
        waited again."""
        i = 0
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                result = await client.enqueue(
                    TASK, {"steps": 2}, lock_key=f"wait-{i}", queue=QUEUE, max_attempts=50
                )
            except DatabaseUnavailable:
                await asyncio.sleep(0.05)
                continue
            while True:
                try:
                    state = await client.wait(result.job_id, timeout=90)
                    outcome = state.status.value
                except Exception as exc:
                    outcome = type(exc).__name__
                self.waits.append(Answer(started, time.monotonic() - started, outcome))
                if outcome != "DatabaseUnavailable":
                    break
                await asyncio.sleep(0.05)
            i += 1

    async def calling(self, client: Client, process_id: str) -> None:
        """Call a durable process, each call retried with its idempotency key until it is
        answered; `answered_calls` counts them."""
        self.answered_calls[process_id] = 0
        k = 0
        while not self.stop.is_set():
            started = time.monotonic()
            while True:
                try:
                    await client.processes.call(
                        NAMESPACE, process_id, {"k": k}, idempotency_key=f"{process_id}-{k}"
                    )
                    self.calls.append(Answer(started, time.monotonic() - started, "ok"))
                    self.answered_calls[process_id] = k + 1
                    break
                except Exception as exc:
                    self.calls.append(Answer(started, time.monotonic() - started, name_of(exc)))
                    if self.stop.is_set() and not isinstance(exc, DatabaseUnavailable):
                        return  # not an outage: a failure the test reports
                    await asyncio.sleep(0.1)
            k += 1

    def acknowledged(self) -> set[uuid.UUID]:
        return {a.job_id for a in self.http + self.library if a.job_id is not None}


def name_of(exc: Exception) -> str:
    """DatabaseUnavailable by its name; anything else with its message too."""
    name = type(exc).__name__
    return name if isinstance(exc, DatabaseUnavailable) else f"{name}: {exc}"


def percentiles(answers: list[Answer], since: float, until: float) -> dict[str, Any]:
    """p50/p99 (ms) of the successful calls started in [since, until); the failed ones, and
    for how long calls failed."""
    window = [a for a in answers if since <= a.at < until]
    ok = sorted(a.latency for a in window if a.outcome in ("200", "201", "ok", "succeeded"))
    failed = [a for a in window if a.outcome not in ("200", "201", "ok", "succeeded")]
    figures: dict[str, Any] = {"calls": len(window), "failed": len(failed)}
    if failed:  # from the start of the first failed call to the end of the last
        figures["failing_s"] = round(
            max(a.at + a.latency for a in failed) - min(a.at for a in failed), 2
        )
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
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(lambda: scenario.conn.close())
        replicas = await scenario.start(
            2,
            concurrency=4,
            DL_CRON=json.dumps(CRON),
            DL_DEFAULT_MAX_ATTEMPTS=str(MAX_ATTEMPTS),
            DL_PIPELINE_MODULES="tests.faults.pipeline,tests.faults.processor",
            WORKERS_JSON=json.dumps(
                [{"queue": QUEUE, "concurrency": 4}, {"queue": PROCESS_QUEUE, "concurrency": 2}]
            ),
        )
        limits = await replicas[0].client.put(
            f"/api/v1/queues/{QUEUE}/limits", json={"max_running": MAX_RUNNING}
        )
        assert limits.status_code == 200, limits.text
        producers = Producers(replicas, cluster.dsn)
        library = await stack.enter_async_context(client_of(cluster.dsn))
        for process_id in PROCESSES:
            await library.processes.start(NAMESPACE, process_id, timeout=30)
        running = asyncio.gather(
            *(producers.over_http(n, replica) for n, replica in enumerate(replicas)),
            producers.through_the_library(),
            producers.waiting(library),
            *(producers.calling(library, process_id) for process_id in PROCESSES),
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
                await wait_until(
                    lambda r=replica: whole(r, scenario.conn), 60, f"{replica.name} whole"
                )
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
                await wait_until(
                    lambda r=replica: whole(r, scenario.conn), 60, f"{replica.name} whole"
                )
            marks["whole"] = time.monotonic()
            await asyncio.sleep(3)  # the load after
        finally:
            producers.stop.set()
            await running
        marks["end"] = time.monotonic()
        calls_applied = {p: await calls_of(library, p) for p in PROCESSES}
        await library.close()  # and with it the advisory lock its listener holds

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
        most_at_once = await ledger.most_running_at_once(scenario.conn)
        report.figures = figures = {
            "acknowledged": len(acknowledged),
            "most_running_at_once": most_at_once,
            "switchover_to_replicas_whole_s": round(marks["recovered"] - marks["switchover"], 2),
            "kill_to_new_leader_s": round(marks["new_leader"] - marks["kill"], 2),
            "kill_to_first_job_done_s": first_done
            and round((first_done - killed_at).total_seconds(), 2),
            "kill_to_replicas_whole_s": round(marks["whole"] - marks["kill"], 2),
            "http": {k: percentiles(producers.http, *w) for k, w in windows.items()},
            "library": {k: percentiles(producers.library, *w) for k, w in windows.items()},
            "waits": {k: percentiles(producers.waits, *w) for k, w in windows.items()},
            "process_calls": {k: percentiles(producers.calls, *w) for k, w in windows.items()},
            "http_outcomes": count(producers.http),
            "library_outcomes": count(producers.library),
            "wait_outcomes": count(producers.waits),
            "call_outcomes": count(producers.calls),
        }
        print(json.dumps({"jobs": report.jobs, "runs": report.runs, **figures}, indent=1))
        append_report(report)

        assert not report.violations(), "\n".join(report.violations())
        assert most_at_once <= MAX_RUNNING  # the queue's limit held throughout
        assert set(count(producers.http)) <= {"200", "201", "503"}, count(producers.http)
        assert set(count(producers.library)) <= {"ok", "DatabaseUnavailable"}, count(
            producers.library
        )
        assert set(count(producers.waits)) <= {"succeeded", "DatabaseUnavailable"}, count(
            producers.waits
        )
        assert set(count(producers.calls)) <= {"ok", "DatabaseUnavailable"}, count(producers.calls)
        for process_id, calls in calls_applied.items():  # each call applied once, in order
            assert calls == [{"k": k} for k in range(producers.answered_calls[process_id])]
        assert len(states) == len(acknowledged), "acknowledged triggers are missing"
        assert set(states.values()) == {"succeeded"}
        assert first_done is not None
        assert {row["pid"] for row in after_kill} >= {r.pid for r in replicas}
        assert sorted(leaders) == [False, True]  # maintenance is led again, by one
        assert cron_after_kill > 0  # and the schedule fires again
        assert all(replica.proc.poll() is None for replica in replicas)


async def calls_of(client: Client, process_id: str) -> list[Any]:
    """The args of every call the process applied, in its order (its events after `init`)."""
    applied: list[Any] = []
    after = 0
    while events := await client.processes.events(NAMESPACE, process_id, after=after, limit=1000):
        applied += [e.payload["args"] for e in events if e.payload["kind"] == "call"]
        after = events[-1].event_id
    return applied


def count(answers: list[Answer]) -> dict[str, int]:
    found: dict[str, int] = {}
    for answer in answers:
        found[answer.outcome] = found.get(answer.outcome, 0) + 1
    return found
