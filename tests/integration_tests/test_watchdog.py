"""A handler that holds the workers' event loop (a blocking call in an `async def` handler) keeps
its job: the watchdog thread keeps the process's presence and the job's lease meanwhile, so
another process's reaper finds nothing to take back, and the hold is named in a WARNING and in
/status."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from dataloader.config import Settings
from dataloader.runner import Runner
from dataloader.storage import db
from dataloader.storage.protocol import WorkerProtocol
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext
from dataloader.workers.reaper import Reaper
from dataloader.workers.watchdog import Watchdog

from .helpers import wait_until

#: How long the handler holds the loop: three presence periods and a lease, and more.
HELD_SEC = 4.0


def sweep_while_held(dsn: str, seconds: float, taken: list[dict[str, int]]) -> None:
    """Another process's reaper, sweeping every 0.1 s for `seconds` on a thread of its own (the
    handler's loop is held), recording what it took back."""

    async def sweep() -> None:
        pool = db.new_pool(dsn, 1, "another-reaper")
        await pool
        try:
            reaper = Reaper(WorkerProtocol(pool), "another-process")
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                if swept := await reaper.run_once():
                    taken.append(swept)
                await asyncio.sleep(0.1)
        finally:
            await pool.close()

    asyncio.run(sweep())


async def test_a_handler_holding_the_loop_keeps_its_job_and_is_named(
    make_settings: Callable[..., Settings],
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    db_dsn: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "dataloader.workers.watchdog")
    settings = make_settings(
        workers=[{"queue": "default", "concurrency": 1}],
        presence_period_sec=0.5,  # found gone after 1.5 s without a refresh
    )
    taken: list[dict[str, int]] = []
    attempts: list[int] = []

    @registry.register("t.blocking")
    async def blocking(ctx: JobContext[dict[str, Any]]) -> str:
        attempts.append(ctx.attempt)
        # a blocking call, as a database driver's: nothing else runs on this loop meanwhile
        reaper = threading.Thread(target=sweep_while_held, args=(db_dsn, HELD_SEC, taken))
        reaper.start()
        reaper.join()
        return "done"

    async with Runner(settings, registry) as runner:
        job_id = (
            await runner.client.enqueue("t.blocking", lock_key="k", queue="default", lease_ttl=2)
        ).job_id
        job = await runner.client.wait(job_id, timeout=30)
        assert runner.manager is not None
        assert taken == []  # the other process's reaper found the process alive throughout
        assert (job.status, job.attempt, attempts) == ("succeeded", 1, [1])
        hold = runner.manager.watchdog.last_hold
        client = runner.client

        async def warned() -> list[str]:
            warnings = (await client.status()).warnings
            return [w for w in warnings if "held for" in w and "'t.blocking'" in w]

        # recorded by the watchdog thread once the loop answers
        await wait_until(warned, what="the held loop in /status")

    kinds = await conn.fetch("SELECT kind FROM dl_job_events WHERE job_id = $1", job_id)
    assert "requeue" not in {row["kind"] for row in kinds}
    # named: how long, which task and job, and what to do instead
    assert hold is not None
    assert hold.seconds >= HELD_SEC - 0.5
    [line] = [r.getMessage() for r in caplog.records if r.name == "dataloader.workers.watchdog"]
    assert "'t.blocking'" in line
    assert str(job_id) in line
    assert "asyncio.to_thread" in line


async def test_a_loop_that_answers_in_time_is_named_nowhere(
    make_settings: Callable[..., Settings],
    registry: TaskRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "dataloader.workers.watchdog")
    settings = make_settings(workers=[{"queue": "default", "concurrency": 1}])

    @registry.register("t.short")
    async def short(ctx: JobContext[dict[str, Any]]) -> None:
        time.sleep(0.3)  # noqa: ASYNC251 (held, but for less than DL_LOOP_HELD_WARN_SEC)

    async with Runner(settings, registry) as runner:
        job_id = (await runner.client.enqueue("t.short", lock_key="k", queue="default")).job_id
        assert (await runner.client.wait(job_id, timeout=30)).status == "succeeded"
        assert runner.manager is not None
        assert runner.manager.watchdog.last_hold is None
        status = await runner.client.status()
    assert not [r for r in caplog.records if r.name == "dataloader.workers.watchdog"]
    assert not [w for w in status.warnings if "held for" in w]


async def test_a_watchdog_thread_that_fails_is_logged_recorded_and_started_again(
    make_settings: Callable[..., Settings],
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The watchdog is a loop of the process like the others: its thread failing (here, once,
    as when its connection is refused) is logged with its cause, recorded for /status and
    followed by a new thread, which is then recorded as running."""
    caplog.set_level(logging.ERROR, "dataloader.workers.supervisor")
    watch = Watchdog._watch
    starts = 0

    async def fails_first(self: Watchdog) -> None:
        nonlocal starts
        starts += 1
        if starts == 1:
            raise ConnectionRefusedError("the watchdog's connection was refused")
        await watch(self)

    monkeypatch.setattr(Watchdog, "_watch", fails_first)
    settings = make_settings(workers=[{"queue": "default", "concurrency": 1}])
    async with Runner(settings, registry) as runner:
        assert runner.manager is not None
        watchdog = runner.manager.watchdog

        async def run_of_watchdog() -> asyncpg.Record | None:
            return await conn.fetchrow(
                "SELECT ok, error FROM dl_maintenance_runs WHERE task = 'watchdog' AND holder = $1",
                runner.manager.worker_id if runner.manager else None,
            )

        failed = await wait_until(run_of_watchdog, what="the failure recorded")
        assert (failed["ok"], failed["error"]) == (
            False,
            "ConnectionRefusedError: the watchdog's connection was refused",
        )

        async def running_again() -> bool:
            run = await run_of_watchdog()
            return run is not None and run["ok"] and watchdog.watching()

        await wait_until(running_again, what="a new watchdog thread, recorded as running")
        assert starts == 2
    [line] = [r for r in caplog.records if "watchdog failed" in r.getMessage()]
    assert line.exc_info is not None
    assert not watchdog.watching()  # the process stopped its thread with it
