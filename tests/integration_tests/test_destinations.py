"""The tasks a process sends jobs of on its own — its cron schedules' and its stages'
(`then=`) — checked at its start (`workers.destinations`): refused when certainly wrong (a
queue other than the task's; a queue live processes, this one included, serve while none
knows the task), warned of in one log line and in /status where another process may still
bring the task."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from dataloader import ConfigError, JobContext
from dataloader.config import Settings
from dataloader.runner import Runner
from dataloader.tasks import TaskRegistry

from .conftest import StartService, wait_until
from .helpers import add_worker
from .procs import DATALOADER_SCRIPT, free_port, one_line, run_cli

WARNED = "no live process knows the tasks these send jobs of"


async def handler(ctx: JobContext[dict[str, Any]]) -> None: ...


def schedule(task: str, queue: str) -> str:
    return json.dumps([{"name": "nightly", "schedule": "0 3 * * *", "task": task, "queue": queue}])


@pytest.fixture
def tasks() -> TaskRegistry:
    registry = TaskRegistry()
    registry.task("etl.load", queue="etl")(handler)
    return registry


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    caplog.set_level(logging.WARNING, logger="dataloader.workers.destinations")
    return lambda: [r.getMessage() for r in caplog.records if WARNED in r.getMessage()]


async def test_a_schedule_on_another_queue_than_its_tasks_is_refused_at_start(
    make_settings: Callable[..., Settings], tasks: TaskRegistry
) -> None:
    settings = make_settings(cron=schedule("etl.load", "default"))
    with pytest.raises(
        ConfigError, match=r"schedule 'nightly': .*runs on queue 'etl', not 'default'"
    ):
        await Runner(settings, tasks).start()


async def test_a_schedule_of_a_task_nobody_knows_on_a_queue_served_is_refused_at_start(
    make_settings: Callable[..., Settings], tasks: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """This process serves `default` and no live process knows `etl.typo`: every slot's job
    would be claimed and fail."""
    settings = make_settings(cron=schedule("etl.typo", "default"))
    with pytest.raises(ConfigError, match=r"schedule 'nightly': task 'etl\.typo' is unknown"):
        await Runner(settings, tasks).start()
    assert await conn.fetchval("SELECT count(*) FROM dl_workers") == 0
    async with Runner(make_settings(cron=settings.cron, allow_unknown_tasks=True), tasks):
        pass  # opted out

    await add_worker(conn, "other", {"default": 1}, ["etl.typo"])  # it is somebody's task
    async with Runner(settings, tasks):
        pass


@pytest.mark.parametrize("command", [["serve"], ["worker"]])
async def test_the_commands_refuse_a_certain_mistake_in_one_line(
    db_dsn: str, tmp_path: Path, command: list[str]
) -> None:
    env = {
        "DL_DB_DSN": db_dsn,
        "DL_HTTP_PORT": str(free_port()),
        "DL_CRON": schedule("demo.nop", "default"),  # served by the command's own workers
    }
    result = await asyncio.to_thread(run_cli, [str(DATALOADER_SCRIPT), *command], env, tmp_path)
    assert result.returncode == 2, result.stdout
    line = one_line(result.stdout)
    assert "invalid configuration: schedule 'nightly': task 'demo.nop' is unknown" in line


async def test_a_schedule_of_a_task_another_process_may_bring_is_warned_of(
    start_service: StartService,
    tasks: TaskRegistry,
    conn: asyncpg.Connection,
    warnings: Callable[[], list[str]],
) -> None:
    """The leader need not host every task: a schedule of a queue nobody serves yet starts,
    with one log line, and /status warns while no live process knows its task."""
    service = await start_service(tasks=tasks, cron=schedule("etl.remote", "remote"))
    (line,) = warnings()
    assert "schedule 'nightly': task 'etl.remote'" in line

    async def recorded() -> bool:
        return bool(await conn.fetchval("SELECT count(*) FROM dl_cron"))

    await wait_until(recorded, what="the schedule recorded by the leader")
    warned = (
        "schedule 'nightly' enqueues task 'etl.remote' on queue 'remote', which no live"
        " process knows"
    )
    assert warned in (await service.client.get("/status")).json()["warnings"]
    await add_worker(conn, "other", {"remote": 1}, ["etl.remote"])
    assert warned not in (await service.client.get("/status")).json()["warnings"]


async def test_a_stage_of_a_task_nobody_knows_is_refused_at_start(
    make_settings: Callable[..., Settings], tasks: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """Its jobs go to the queue of the job that succeeded (`default`, served here), where
    nobody could run them: found at start, not at the first success."""
    tasks.task("etl.extract", queue="default", then="etl.transfrom")(handler)
    with pytest.raises(
        ConfigError, match=r"a stage \(then=\) of task 'etl\.extract': task 'etl\.transfrom'"
    ):
        await Runner(make_settings(), tasks).start()

    await add_worker(conn, "other", {"default": 1}, ["etl.transfrom"])
    async with Runner(make_settings(), tasks):
        pass


async def test_a_stage_another_process_may_bring_is_warned_of(
    make_settings: Callable[..., Settings],
    tasks: TaskRegistry,
    warnings: Callable[[], list[str]],
) -> None:
    """A parent without a queue of its own sends its stages to its job's queue: unknown
    before it runs, the stage's task may be another process's."""
    tasks.task("etl.extract", then="etl.transform")(handler)
    async with Runner(make_settings(), tasks):
        (line,) = warnings()
        assert "a stage (then=) of task 'etl.extract': task 'etl.transform'" in line
