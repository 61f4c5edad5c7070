"""Queues on two PostgreSQL clusters (`DL_CLUSTERS`): two throwaway servers of the test's own.

Each group's jobs run on its cluster and live in its database only; the client reads across
both; refusals at start name the setting; one cluster stopped leaves the other's queues
running and the API answering (503 only for the stopped cluster's queues), and once it is
back its queues run again by themselves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from dataloader.api import create_app
from dataloader.api.v1.exceptions import RETRY_AFTER_SEC
from dataloader.base import JobStatus
from dataloader.client import Client
from dataloader.clusters import ClusterClient
from dataloader.config import Settings
from dataloader.context import run_migrations
from dataloader.core.processes import Process, ProcessResult, ProcessTask
from dataloader.exceptions import ConfigError, DatabaseUnavailable, InvalidJob
from dataloader.runner import Runner
from dataloader.tasks import TaskRegistry

from ..integration_tests.helpers import wait_until
from ..integration_tests.operators import Cli
from ..integration_tests.procs import PYTHON_M_DATALOADER, run_cli
from .conftest import REPO_ROOT
from .server import PrivateServer

TIMINGS: dict[str, Any] = {
    "heartbeat_sec": 0.2,
    "default_lease_ttl_sec": 5,
    "reaper_period_sec": 0.3,
    "leader_lease_sec": 1,
    "claim_backoff_sec": 0.2,
    "retry_base_sec": 0,
    "poll_interval_sec": 1,
    "shutdown_timeout_sec": 3,
    "db_pool_size": 4,
    "db_timeout_sec": 2,
}


@pytest.fixture
async def servers() -> AsyncIterator[tuple[PrivateServer, PrivateServer]]:
    """Two clusters: the default one and the one holding the `eu.*` queues."""
    main, eu = PrivateServer(), PrivateServer()
    try:
        await main.start()  # one after the other: the embedded server's start takes a lock
        await eu.start()
        yield main, eu
    finally:
        main.stop()
        eu.stop()


def settings_of(main: PrivateServer, eu: PrivateServer, **overrides: Any) -> Settings:
    given: dict[str, Any] = {
        "clusters": {"eu": {"dsn": eu.dsn, "queues": ["eu.*"]}},
        "workers": [{"queue": "etl", "concurrency": 2}, {"queue": "eu.load", "concurrency": 2}],
    }
    return Settings(_env_file=None, db_dsn=main.dsn, **(TIMINGS | given | overrides))  # type: ignore[call-arg]


def tasks() -> TaskRegistry:
    registry = TaskRegistry()

    @registry.task("etl.count", queue="etl")
    async def count(ctx: Any) -> dict[str, str]:
        return {"ran": "etl"}

    @registry.task("eu.count", queue="eu.load")
    async def eu_count(ctx: Any) -> dict[str, str]:
        return {"ran": "eu"}

    return registry


async def rows(dsn: str, job_id: uuid.UUID) -> int:
    """How many rows of dl_jobs the database of `dsn` holds for `job_id`."""
    conn = await asyncpg.connect(dsn)
    try:
        found: int = await conn.fetchval("SELECT count(*) FROM dl_jobs WHERE job_id = $1", job_id)
    finally:
        await conn.close()
    return found


async def test_each_groups_jobs_run_on_its_cluster_and_live_in_its_database_only(
    servers: tuple[PrivateServer, PrivateServer],
) -> None:
    main, eu = servers
    async with Runner(settings_of(main, eu), tasks()) as dl:
        client = dl.client
        assert isinstance(client, ClusterClient)
        here = await client.enqueue("etl.count", {})
        there = await client.enqueue("eu.count", {})
        done_here = await client.wait(here.job_id, timeout=30)
        done_there = await client.wait(there.job_id, timeout=30)
        assert (done_here.status, done_here.result, done_here.cluster) == (
            JobStatus.SUCCEEDED,
            {"ran": "etl"},
            "default",
        )
        assert (done_there.status, done_there.result, done_there.cluster) == (
            JobStatus.SUCCEEDED,
            {"ran": "eu"},
            "eu",
        )
        assert (await rows(main.dsn, here.job_id), await rows(eu.dsn, here.job_id)) == (1, 0)
        assert (await rows(main.dsn, there.job_id), await rows(eu.dsn, there.job_id)) == (0, 1)

        # a list without a queue merges both clusters newest first, a page at a time
        first = await client.list(limit=1)
        assert [(j.job_id, j.cluster) for j in first.jobs] == [(there.job_id, "eu")]
        assert first.next_cursor is not None
        second = await client.list(limit=1, cursor=first.next_cursor)
        assert [(j.job_id, j.cluster) for j in second.jobs] == [(here.job_id, "default")]
        assert second.next_cursor is None
        whole = await client.list()
        assert [j.job_id for j in whole.jobs] == [there.job_id, here.job_id]
        # pages of 3 over 10 jobs of both clusters: each job once, in the one order
        for n in range(4):
            await client.enqueue("eu.count" if n % 2 else "etl.count", {})
            await client.enqueue("etl.count" if n % 2 else "eu.count", {})
        seen, cursor = [], None
        while True:
            page = await client.list(limit=3, cursor=cursor)
            seen += page.jobs
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert len(seen) == 10
        assert {j.cluster for j in seen} == {"default", "eu"}
        keys = [(j.created_at, j.job_id) for j in seen]
        assert keys == sorted(set(keys), reverse=True)
        await client.enqueue_many([client.job("eu.count", {})])  # one cluster: accepted
        assert len((await client.list(queue="eu.load", limit=100)).jobs) == 6
        routed = await client.list(queue="eu.load")
        assert [(j.job_id, j.cluster) for j in routed.jobs][-1] == (there.job_id, "eu")
        assert {j.cluster for j in routed.jobs} == {"eu"}

        # reads by id find the one cluster holding the job; queue operations are routed
        assert (await client.get(there.job_id)).cluster == "eu"  # type: ignore[union-attr]
        assert (await client.events(there.job_id))[0].kind == "queued"
        paused = await client.pause("eu.load")
        assert paused.paused
        assert (await client.stats("eu.load"))["eu.load"].paused
        assert not (await client.stats("etl"))["etl"].paused
        await client.resume("eu.load")

        # a batch spanning clusters is refused before anything is written
        batch = [client.job("etl.count", {}), client.job("eu.count", {})]
        with pytest.raises(InvalidJob, match=r"spans clusters \['default', 'eu'\]"):
            await client.enqueue_many(batch)
        assert len((await client.list()).jobs) == 11


async def test_what_would_split_a_cluster_is_refused_at_start(
    servers: tuple[PrivateServer, PrivateServer],
) -> None:
    main, eu = servers
    registry = tasks()

    @registry.task("etl.then", queue="etl", then=("eu.count",))
    async def then(ctx: Any) -> None: ...

    with pytest.raises(ConfigError, match=r"^DL_CLUSTERS: task 'eu.count', a stage \(then=\)"):
        await Runner(settings_of(main, eu), registry).start()

    # one database named twice, by two DSNs
    twice = settings_of(
        main, eu, clusters={"eu": {"dsn": main.dsn + "&sslmode=disable", "queues": ["eu.*"]}}
    )
    with pytest.raises(ConfigError, match="clusters 'default' and 'eu' reach one database"):
        await Runner(twice, tasks()).start()

    # a cluster that answers but cannot be used stops the start, naming it
    missing = settings_of(
        main,
        eu,
        clusters={"eu": {"dsn": eu.dsn.replace("/faults?", "/nosuchdb?"), "queues": ["eu.*"]}},
    )
    runner = Runner(missing, tasks())
    with pytest.raises(DatabaseUnavailable, match=r"^DL_CLUSTERS, cluster 'eu' \(postgresql://"):
        await runner.start()
    assert runner.clusters is None


async def test_a_cluster_down_at_start_is_joined_once_it_answers(
    servers: tuple[PrivateServer, PrivateServer], caplog: pytest.LogCaptureFixture
) -> None:
    """The other clusters start and run; the missing one's queues answer DatabaseUnavailable
    until it is up (why it is not joined yet logged once, not at every try), then its context
    opens (migrated) and its workers run its jobs."""
    caplog.set_level(logging.WARNING, "dataloader.clusters")
    main, eu = servers
    await eu.shut_down()
    async with Runner(settings_of(main, eu), tasks()) as dl:
        client = dl.client
        assert isinstance(client, ClusterClient)
        here = await client.enqueue("etl.count", {})
        assert (await client.wait(here.job_id, timeout=30)).status == JobStatus.SUCCEEDED
        with pytest.raises(DatabaseUnavailable, match="cluster 'eu'"):
            await client.enqueue("eu.count", {})
        assert isinstance((await client.statuses())["eu"], DatabaseUnavailable)
        assert "cluster 'eu'" in " ".join((await client.status()).warnings)

        def not_joined() -> list[str]:
            return [r.getMessage() for r in caplog.records if "not joined yet" in r.getMessage()]

        async def said_why() -> bool:
            return bool(not_joined())

        await wait_until(said_why, 30, "the reason the eu cluster is not joined, logged")
        await eu.start_again()

        async def enqueued() -> uuid.UUID | None:
            try:
                return (await client.enqueue("eu.count", {})).job_id
            except DatabaseUnavailable:
                return None

        job_id = await wait_until(enqueued, 30, "the eu cluster to be joined")
        done = await client.wait(job_id, timeout=30)
        assert (done.status, done.cluster) == (JobStatus.SUCCEEDED, "eu")
        assert await rows(eu.dsn, job_id) == 1
        assert "eu" in dl.clusters.managers  # type: ignore[union-attr]
    (why,) = not_joined()  # the same reason at every try: said once
    assert "cluster 'eu'" in why


async def test_one_cluster_down_stops_only_its_queues_and_they_run_again_once_it_is_back(
    servers: tuple[PrivateServer, PrivateServer],
) -> None:
    main, eu = servers
    app = create_app(settings_of(main, eu), tasks())
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://dataloader.test"
        ) as http,
    ):

        async def trigger(queue: str, task: str) -> httpx.Response:
            body = {"queue": queue, "task": task, "lock_key": "k", "args": {}}
            return await http.post("/api/v1/jobs/trigger", json=body)

        async def succeeded(job_id: str) -> bool:
            response = await http.get(f"/api/v1/jobs/{job_id}/status")
            return response.status_code == 200 and response.json()["status"] == "succeeded"

        for queue, task in (("etl", "etl.count"), ("eu.load", "eu.count")):
            job_id = (await trigger(queue, task)).json()["job_id"]
            await wait_until(lambda j=job_id: succeeded(j), 30, f"the {queue} job to run")
        status = await http.get("/status")
        assert status.status_code == 200, status.text
        body = status.json()
        assert body["clusters"]["eu"]["status"] == "ok"
        assert body["clusters"]["default"]["status"] == "ok"
        assert body["queues"]["eu.load"]["cluster"] == "eu"
        assert body["queues"]["etl"]["cluster"] == "default"
        assert {w["cluster"] for w in body["workers"]} == {"default", "eu"}

        # the dashboard reads through the same client: every cluster, a cluster column
        overview = await http.get("/ui", follow_redirects=True)
        assert overview.status_code == 200
        assert '<th scope="col">cluster</th>' in overview.text
        assert "<td>eu</td>" in overview.text
        assert "<td>default</td>" in overview.text
        jobs_page = await http.get("/ui/jobs")
        assert jobs_page.status_code == 200
        assert "<td>eu</td>" in jobs_page.text
        assert "<td>default</td>" in jobs_page.text
        assert (await http.get("/ui/queues/eu.load")).status_code == 200

        await eu.shut_down()
        try:
            # the default cluster's queue runs on and the API answers for it
            response = await trigger("etl", "etl.count")
            assert response.status_code == 200, response.text
            job_id = response.json()["job_id"]
            await wait_until(lambda: succeeded(job_id), 30, "the etl job to run")
            listed = await http.get("/api/v1/jobs", params={"queue": "etl"})
            assert listed.status_code == 200
            assert {row["cluster"] for row in listed.json()["jobs"]} == {"default"}
            # the stopped cluster's queues answer 503, saying when to try again
            for response in (
                await trigger("eu.load", "eu.count"),
                await http.get("/api/v1/jobs", params={"queue": "eu.load"}),
                await http.get("/status"),
            ):
                assert response.status_code == 503, response.text
                assert response.headers["retry-after"] == str(RETRY_AFTER_SEC)
            body = (await http.get("/status")).json()
            assert body["clusters"]["default"]["status"] == "ok"
            assert body["clusters"]["eu"]["status"] == "degraded"
            assert body["queues"]["etl"]["cluster"] == "default"
            # the dashboard's overview still answers, and says which cluster is missing
            overview = await http.get("/ui")
            assert overview.status_code == 200
            assert "cluster &#39;eu&#39; does not answer" in overview.text
        finally:
            await eu.start_again()

        async def accepted() -> str | None:
            response = await trigger("eu.load", "eu.count")
            assert response.status_code in (200, 503), response.text
            return str(response.json()["job_id"]) if response.status_code == 200 else None

        job_id = await wait_until(accepted, 30, "a trigger on eu.load once its cluster is back")
        await wait_until(lambda: succeeded(job_id), 30, "the eu job to run on its own")
        assert await rows(eu.dsn, uuid.UUID(job_id)) == 1
        status = await http.get("/status")
        assert status.status_code == 200, status.text


async def test_a_queue_moves_to_another_cluster_as_documented(
    servers: tuple[PrivateServer, PrivateServer],
) -> None:
    """docs/scale-out.md, "Moving a group of queues to another cluster", step by step: no job
    is lost, each runs once in one database, and a lock_key's jobs run in order, the old
    cluster's before the new one's."""
    main, eu = servers
    old = settings_of(main, eu, clusters={}, workers=[{"queue": "etl.eu", "concurrency": 2}])
    new = settings_of(
        main,
        eu,
        clusters={"eu": {"dsn": eu.dsn, "queues": ["etl.eu"]}},
        workers=[{"queue": "etl.eu", "concurrency": 2}],
    )
    ran: list[int] = []
    gate = asyncio.Event()
    registry = TaskRegistry()

    @registry.task("etl.step", queue="etl.eu")
    async def step(ctx: Any) -> None:
        if ctx.args.get("gated"):
            await gate.wait()
        ran.append(ctx.args["n"])

    async with Runner(old, registry) as old_deployment:
        first = [
            await old_deployment.client.enqueue("etl.step", {"n": n, "gated": True}, lock_key="d")
            for n in range(3)
        ]
        # 1. the new cluster gets the schema
        await run_migrations(eu.dsn)
        # 2. the queue is paused on the new cluster, before anything is sent there
        async with ClusterClient.connect_all(new) as admin:
            await admin.pause("etl.eu")
        # 3. the routing switches: new jobs go to the new cluster, and wait there
        async with Runner(new, registry) as new_deployment:
            second = [
                await new_deployment.client.enqueue("etl.step", {"n": n}, lock_key="d")
                for n in range(3, 6)
            ]
            for job in second:
                state = await new_deployment.client.get(job.job_id)
                assert state is not None
                assert (state.cluster, state.status) == ("eu", JobStatus.QUEUED)
            # 4. the old cluster drains (its worker, with the old routing, runs on)
            gate.set()
            async with Client.connect(main.dsn) as on_old:

                async def drained() -> bool:
                    s = (await on_old.stats("etl.eu"))["etl.eu"]
                    return s.ready + s.waiting + s.delayed + s.running == 0

                await wait_until(drained, 30, "the old cluster to drain")
            # 5. the old worker stops; the queue resumes on the new cluster
            await old_deployment.stop()
            await new_deployment.client.resume("etl.eu")
            for job in second:
                done = await new_deployment.client.wait(job.job_id, timeout=30)
                assert done.status == JobStatus.SUCCEEDED
            for job in first:
                done = await new_deployment.client.wait(job.job_id, timeout=30)
                assert (done.status, done.cluster) == (JobStatus.SUCCEEDED, "default")
    assert ran == [0, 1, 2, 3, 4, 5]
    for job in first:
        assert (await rows(main.dsn, job.job_id), await rows(eu.dsn, job.job_id)) == (1, 0)
    for job in second:
        assert (await rows(main.dsn, job.job_id), await rows(eu.dsn, job.job_id)) == (0, 1)


async def test_a_namespaces_processes_live_and_run_in_its_cluster(
    servers: tuple[PrivateServer, PrivateServer],
) -> None:
    main, eu = servers
    registry = TaskRegistry()

    @registry.process("orders", queue="eu.orders")
    async def orders(task: ProcessTask, process: Process) -> ProcessResult:
        return ProcessResult(events=[{"kind": task.kind.value}], response={"on": "eu"})

    settings = settings_of(
        main,
        eu,
        clusters={"eu": {"dsn": eu.dsn, "queues": ["eu.*"], "namespaces": ["orders"]}},
        workers=[{"queue": "eu.orders", "concurrency": 2}],
    )
    async with Runner(settings, registry) as dl:
        processes = dl.client.processes
        assert await processes.start("orders", "o-1", {"total": 10}, timeout=30) == {"on": "eu"}
        assert await processes.call("orders", "o-1", {"paid": 10}, timeout=30) == {"on": "eu"}
        found = await processes.get("orders", "o-1")
        assert found is not None
        assert [e.payload for e in await processes.events("orders", "o-1")] == [
            {"kind": "init"},
            {"kind": "call"},
        ]
        assert [p.process_id for p in (await processes.list()).processes] == ["o-1"]
        assert sum((await processes.counts()).values()) == 1
        # a process of the namespace started on a queue of another cluster is refused
        with pytest.raises(InvalidJob, match="its namespace is in cluster 'eu'"):
            await processes.start("orders", "o-2", queue="etl")
    for dsn, expected in ((main.dsn, 0), (eu.dsn, 1)):
        conn = await asyncpg.connect(dsn)
        try:
            assert await conn.fetchval("SELECT count(*) FROM dl_processes") == expected
        finally:
            await conn.close()


async def test_the_worker_command_names_a_cluster_it_cannot_use_in_one_line(
    servers: tuple[PrivateServer, PrivateServer], tmp_path: Path
) -> None:
    main, eu = servers
    env = {
        "DL_DB_DSN": main.dsn,
        "DL_CLUSTERS": json.dumps(
            {"eu": {"dsn": eu.dsn.replace("/faults?", "/nosuchdb?"), "queues": ["eu.*"]}}
        ),
        "WORKERS_JSON": '[{"queue": "eu.load", "concurrency": 1}]',
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    result = await asyncio.to_thread(run_cli, [*PYTHON_M_DATALOADER, "worker"], env, tmp_path)
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stdout
    last = result.stdout.strip().splitlines()[-1]  # after the default cluster's migrations
    assert last.startswith("dataloader: DL_CLUSTERS, cluster 'eu' (postgresql://"), last
    assert "nosuchdb" in last


async def test_the_cli_reads_every_cluster(
    servers: tuple[PrivateServer, PrivateServer], tmp_path: Path
) -> None:
    main, eu = servers
    settings = settings_of(main, eu)
    for dsn in (main.dsn, eu.dsn):
        await run_migrations(dsn)
    async with ClusterClient.connect_all(settings) as client:
        here = await client.enqueue("etl.count", queue="etl")
        there = await client.enqueue("eu.count", queue="eu.load")
    cli = Cli(main.dsn, tmp_path)
    env: dict[str, str | None] = {
        "DL_CLUSTERS": json.dumps(settings_of(main, eu).model_dump()["clusters"])
    }
    listed = await cli("jobs", "--json", env=env)
    assert listed.returncode == 0, listed
    jobs = json.loads(listed.stdout)["jobs"]
    assert [(j["job_id"], j["cluster"]) for j in jobs] == [
        (str(there.job_id), "eu"),
        (str(here.job_id), "default"),
    ]
    one = await cli("jobs", "--queue", "eu.load", "--json", env=env)
    assert [j["job_id"] for j in json.loads(one.stdout)["jobs"]] == [str(there.job_id)]
