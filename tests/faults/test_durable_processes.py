"""Faults under durable processes: a replica killed during a task (a zombie, repaired), the
database restarted during calls (none lost, none applied twice), and timers that came due
while every replica was down (each fires once, after a restart)."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from typing import Any

import asyncpg

from dataloader import Client, DatabaseUnavailable, ProcessStatus, Settings
from dataloader.core.processes import ZOMBIE_DETAIL

from ..integration_tests.helpers import wait_until
from ..integration_tests.procs import ServiceProcess
from .conftest import DEFAULT_TIMINGS, Scenario
from .processor import NAMESPACE, QUEUE
from .server import PrivateServer

#: The replicas serve the processes' queue, and load their processor beside the pipeline.
PROCESS_ENV: dict[str, str] = {
    "DL_PIPELINE_MODULES": "tests.faults.pipeline,tests.faults.processor",
    "WORKERS_JSON": json.dumps([{"queue": QUEUE, "concurrency": 4}]),
}


async def replicas(scenario: Scenario, count: int, **env: str) -> list[ServiceProcess]:
    return await scenario.start(count, **(PROCESS_ENV | env))


def client_of(dsn: str) -> Any:
    return Client.connect(dsn, settings=Settings(_env_file=None, db_dsn=dsn))  # type: ignore[call-arg]


async def runs_on(conn: asyncpg.Connection, task_id: uuid.UUID, replica: ServiceProcess) -> bool:
    worker = await conn.fetchval(
        "SELECT worker_id FROM dl_jobs WHERE job_id = $1 AND status = 'running'", task_id
    )
    return worker is not None and f"-{replica.pid}-" in worker


async def test_a_replica_killed_during_a_task_leaves_a_zombie_that_a_repair_mends(
    scenario: Scenario,
) -> None:
    [survivor] = await replicas(scenario, 1, **DEFAULT_TIMINGS)
    async with client_of(scenario.dsn) as dl:
        await dl.processes.start(NAMESPACE, "z", timeout=30)
        survivor.send(signal.SIGSTOP)  # the victim alone claims the call
        try:
            [victim] = await replicas(scenario, 1, **DEFAULT_TIMINGS)
            task_id = await dl.processes.submit(NAMESPACE, "z", "call", {"sleep": 600})
            await wait_until(lambda: runs_on(scenario.conn, task_id, victim), 30, "the call")
        finally:
            survivor.send(signal.SIGCONT)
        await scenario.kill(victim)

        async def in_error() -> bool:
            process = await dl.processes.get(NAMESPACE, "z")
            return process is not None and process.status is ProcessStatus.ERROR

        await wait_until(in_error, 60, "the zombie to be found")
        process = await dl.processes.get(NAMESPACE, "z")
        assert process is not None
        assert process.detail == ZOMBIE_DETAIL
        assert process.corrupted_by == task_id
        assert await dl.processes.repair(NAMESPACE, "z", {"fixed": True}, timeout=30) == {"seen": 1}
        repaired = await dl.processes.get(NAMESPACE, "z")
        assert repaired is not None
        assert repaired.status is ProcessStatus.RUNNING
        kinds = [e.payload["kind"] for e in await dl.processes.events(NAMESPACE, "z")]
        assert kinds == ["init", "repair"]  # the zombie call left no event


async def test_calls_across_a_database_restart_are_neither_lost_nor_applied_twice(
    private_server: PrivateServer, launcher: Any
) -> None:
    conn = await asyncpg.connect(private_server.dsn)
    scenario = Scenario("process_restart", launcher, private_server.dsn, conn)
    try:
        # leases and presence at their defaults: a restart slowed down by a busy machine must
        # not outlast a running task's lease (its task would be a zombie, as it should be)
        await replicas(scenario, 2, **DEFAULT_TIMINGS)
        async with client_of(private_server.dsn) as dl:
            for n in range(5):
                await dl.processes.start(NAMESPACE, f"r{n}", timeout=30)

            async def caller(n: int) -> None:
                for k in range(20):
                    key = f"r{n}-{k}"
                    while True:  # a caller that retries with its key until it has an answer
                        try:
                            await dl.processes.call(
                                NAMESPACE, f"r{n}", {"k": k}, idempotency_key=key, timeout=30
                            )
                            break
                        except CUT:
                            await asyncio.sleep(0.2)

            calls = asyncio.gather(*(caller(n) for n in range(5)))
            await asyncio.sleep(0.5)  # the fault's moment: calls are under way
            await private_server.restart("fast")
            await calls
            for n in range(5):
                events = await dl.processes.events(NAMESPACE, f"r{n}", limit=1000)
                assert [e.event_id for e in events] == list(range(1, 22))
                assert [e.payload["args"] for e in events[1:]] == [{"k": k} for k in range(20)]
    finally:
        await conn.close()


async def test_timers_due_while_every_replica_was_down_fire_once_after_a_restart(
    scenario: Scenario,
) -> None:
    first = await replicas(scenario, 2)
    async with client_of(scenario.dsn) as dl:
        for n in range(10):
            await dl.processes.start(NAMESPACE, f"t{n}", {"timer": 2}, timeout=30)
        for replica in first:
            await scenario.kill(replica)
        await asyncio.sleep(3)  # the fault: the timers come due while nobody runs them
        await replicas(scenario, 2)

        async def all_fired() -> bool:
            n: int = await scenario.conn.fetchval(
                "SELECT count(*) FROM dl_jobs WHERE task = 'process:faulty'"
                " AND args->>'kind' = 'timeout' AND status = 'succeeded'"
            )
            return n == 10

        await wait_until(all_fired, 60, "every timer to fire")
        for n in range(10):
            kinds = [e.payload["kind"] for e in await dl.processes.events(NAMESPACE, f"t{n}")]
            assert kinds == ["init", "timeout"]


#: What a call cut by the restart may raise.
CUT: tuple[type[BaseException], ...] = (
    DatabaseUnavailable,
    ConnectionError,
    OSError,
    asyncpg.PostgresError,
)
