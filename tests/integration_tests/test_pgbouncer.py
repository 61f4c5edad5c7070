"""dataloader behind PgBouncer (Debian's pgbouncer, started by each test in front of the test's
database): session pooling works as a direct connection; transaction pooling works with
DL_DB_DIRECT_DSN for what needs a session (lock_key locks, LISTEN, migrations) and is refused
at start without it; a session reached through a pooler is never terminated."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from dataloader.config import Settings
from dataloader.runner import Runner
from dataloader.storage import db
from dataloader.storage.connections import own_session
from dataloader.storage.pooling import Pooling, probe
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext

from ..engines.pgbouncer import PgBouncer, PoolMode, pgbouncer
from .conftest import TEST_DEFAULTS
from .helpers import ADVISORY_LOCKS
from .procs import (
    DATALOADER_SCRIPT,
    PYTHON_M_DATALOADER,
    clean_env,
    free_port,
    one_line,
    run_cli,
)

TASK = "pgb.keyed"


@pytest.fixture
async def session_pooler(db_dsn: str) -> AsyncIterator[PgBouncer]:
    async with pgbouncer(db_dsn, "session") as bouncer:
        yield bouncer


@pytest.fixture
async def transaction_pooler(db_dsn: str) -> AsyncIterator[PgBouncer]:
    async with pgbouncer(db_dsn, "transaction") as bouncer:
        yield bouncer


#: (start, end) of every run of each lock_key, by the monotonic clock of this process.
Runs = dict[str, list[tuple[float, float]]]


def keyed_task(registry: TaskRegistry) -> Runs:
    """Register TASK: a run of 50 ms that notes when it ran, under its lock_key."""
    runs: Runs = defaultdict(list)

    @registry.register(TASK)
    async def keyed(ctx: JobContext[dict[str, Any]]) -> None:
        started = time.monotonic()
        await asyncio.sleep(0.05)  # the run itself: long enough for another to overlap it
        runs[str(ctx.job.lock_key)].append((started, time.monotonic()))

    return runs


def overlaps(runs: Runs) -> list[str]:
    """Pairs of runs of one key that overlapped in time."""
    found = []
    for key, spans in runs.items():
        ordered = sorted(spans)
        for (_, end), (start, _) in itertools.pairwise(ordered):
            if start < end:
                found.append(key)
    return found


def settings_for(dsn: str, **overrides: Any) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        db_dsn=dsn,
        **(TEST_DEFAULTS | {"workers": [{"queue": "default", "concurrency": 4}]} | overrides),
    )


async def run_keyed_jobs(
    settings: Settings, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """Two replicas in this process run 24 jobs on 4 lock_keys, each waited for (the end heard
    by LISTEN: the safety poll is minutes away); one of them leads maintenance; no lock is
    left once they stopped."""
    runs = keyed_task(registry)
    async with Runner(settings, registry) as first, Runner(settings, registry) as second:
        replicas = [first, second]
        jobs = [
            await replicas[i % 2].client.enqueue(TASK, {}, queue="default", lock_key=f"key-{i % 4}")
            for i in range(24)
        ]
        states = await asyncio.wait_for(
            asyncio.gather(*(first.client.wait(job.job_id) for job in jobs)), 30
        )
        assert {state.status for state in states} == {"succeeded"}
        assert all(state.attempt == 1 for state in states)

        leading = [
            asyncio.ensure_future(r.manager.maintenance.leadership.leading.wait())
            for r in replicas
            if r.manager is not None
        ]
        led, waiting = await asyncio.wait(leading, timeout=15, return_when=asyncio.FIRST_COMPLETED)
        for wait in waiting:
            wait.cancel()
        assert led, "no replica leads maintenance"
    assert sum(len(spans) for spans in runs.values()) == 24  # each job ran once
    assert overlaps(runs) == []
    assert await conn.fetchval(ADVISORY_LOCKS) == 0


async def test_the_probe_tells_direct_session_and_transaction_pooling(
    db_dsn: str, session_pooler: PgBouncer, transaction_pooler: PgBouncer
) -> None:
    assert await probe(db_dsn) is Pooling.none
    assert await probe(session_pooler.through(db_dsn)) is Pooling.session
    assert await probe(transaction_pooler.through(db_dsn)) is Pooling.transaction


async def test_the_probe_needs_no_activity_tracking(
    db_dsn: str, conn: asyncpg.Connection, session_pooler: PgBouncer
) -> None:
    """With `track_activities` off, what another session does is not shown: the probe then
    goes by process ids alone, and still never takes a direct or session-pooled connection
    for a transaction pooler's."""
    database = await conn.fetchval("SELECT current_database()")
    await conn.execute(f'ALTER DATABASE "{database}" SET track_activities = off')
    assert await probe(db_dsn) is Pooling.none
    assert await probe(session_pooler.through(db_dsn)) is Pooling.session


@pytest.mark.parametrize("mode", ["session", "transaction"])
async def test_the_probe_tells_the_pool_mode_of_a_busy_pooler(db_dsn: str, mode: PoolMode) -> None:
    """Other clients running statement after statement through the pooler meanwhile (other
    replicas under load) take the probe's server connection as soon as it is free: under
    transaction pooling that too is seen, never taken for session pooling."""
    async with pgbouncer(db_dsn, mode) as pooler:
        pooled = pooler.through(db_dsn)
        stop = asyncio.Event()

        async def busy() -> None:
            conn = await asyncpg.connect(pooled, statement_cache_size=0)
            try:
                while not stop.is_set():
                    await conn.fetchval("SELECT 1")
            finally:
                await conn.close()

        others = [asyncio.create_task(busy()) for _ in range(8)]
        try:
            found = [await probe(pooled) for _ in range(10)]
        finally:
            stop.set()
            await asyncio.gather(*others)
    assert found == [Pooling(mode)] * 10


async def test_session_pooling_works_as_a_direct_connection(
    db_dsn: str, session_pooler: PgBouncer, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    settings = settings_for(session_pooler.through(db_dsn))
    await run_keyed_jobs(settings, registry, conn)


async def test_transaction_pooling_with_a_direct_dsn_for_the_session_bound_needs(
    db_dsn: str, transaction_pooler: PgBouncer, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    pooled = transaction_pooler.through(db_dsn)
    settings = settings_for(pooled, db_direct_dsn=db_dsn)
    async with Runner(settings, registry, run_workers=True) as runner:
        routes = runner.context.routes
        assert (routes.pooling, routes.dsn, routes.session_dsn) == (
            Pooling.transaction,
            pooled,
            db_dsn,
        )
        manager = runner.manager
        assert manager is not None
        await asyncio.wait_for(manager.listener.connected.wait(), 15)
        # the lock holder and the listener are server sessions of their own: the pids their
        # connections announced are real backends' (a pooler's are made up)
        direct = await conn.fetch(
            "SELECT application_name FROM pg_stat_activity WHERE pid = ANY($1::int[])",
            [manager.runtime.locks.backend_pid, manager.listener.backend_pid],
        )
        assert sorted(r["application_name"] for r in direct) == [
            "dataloader-listener",
            "dataloader-locks",
        ]
    await run_keyed_jobs(settings, registry, conn)


def start_fails(env: dict[str, str | None], cwd: Path) -> str:
    """Start the service; assert it stops with code 2 and one line; the line."""
    result = run_cli([*PYTHON_M_DATALOADER], {"DL_HTTP_PORT": str(free_port()), **env}, cwd=cwd)
    assert result.returncode == 2, result.stdout
    assert "Traceback" not in result.stdout
    return one_line(result.stdout)


async def test_transaction_pooling_without_a_direct_dsn_is_refused_at_start(
    db_dsn: str, transaction_pooler: PgBouncer, tmp_path: Path
) -> None:
    line = await asyncio.to_thread(
        start_fails, {"DL_DB_DSN": transaction_pooler.through(db_dsn)}, tmp_path
    )
    assert "goes through a transaction pooler" in line
    assert "DL_DB_DSN" in line
    assert "DL_DB_DIRECT_DSN" in line


async def test_a_direct_dsn_through_a_transaction_pooler_too_is_refused(
    db_dsn: str, transaction_pooler: PgBouncer, tmp_path: Path
) -> None:
    pooled = transaction_pooler.through(db_dsn)
    line = await asyncio.to_thread(
        start_fails, {"DL_DB_DSN": pooled, "DL_DB_DIRECT_DSN": pooled}, tmp_path
    )
    assert line.startswith("dataloader: invalid configuration: DL_DB_DIRECT_DSN")
    assert "transaction pooler too" in line


async def test_a_client_through_a_transaction_pooler_waits_on_a_direct_connection(
    db_dsn: str, transaction_pooler: PgBouncer, registry: TaskRegistry
) -> None:
    from dataloader.client import Client
    from dataloader.exceptions import ConfigError

    pooled = transaction_pooler.through(db_dsn)
    settings = settings_for(db_dsn)
    with pytest.raises(ConfigError, match="direct_dsn"):
        async with Client.connect(pooled, settings=settings):
            pass
    runs = keyed_task(registry)
    async with (
        Client.connect(pooled, settings=settings, direct_dsn=db_dsn) as client,
        Runner(settings_for(db_dsn), registry),
    ):
        assert client.pooling is Pooling.transaction
        job = await client.enqueue(TASK, {}, queue="default", lock_key="k")
        assert (await asyncio.wait_for(client.wait(job.job_id), 30)).status == "succeeded"
    assert len(runs["k"]) == 1


async def test_a_session_reached_through_a_pooler_is_never_ours_to_end(
    db_dsn: str, session_pooler: PgBouncer, transaction_pooler: PgBouncer
) -> None:
    """A connection given up on (no answer in time) has its server session ended from the
    next one, so that its locks cannot outlive it. Through a pooler that server connection
    is the pooler's, lent to other clients once ours is gone: it is never to be ended."""
    direct = await db.connect(db_dsn, "dataloader-test")
    try:
        session = await own_session(direct)
        assert session is not None
        assert session[0] == direct.get_server_pid()
    finally:
        await direct.close()
    for pooler in (session_pooler, transaction_pooler):
        conn = await db.connect(pooler.through(db_dsn), "dataloader-test", statement_cache=False)
        try:
            assert await own_session(conn) is None
        finally:
            await conn.close()


async def test_the_operators_commands_through_a_transaction_pooler(
    db_dsn: str, transaction_pooler: PgBouncer, tmp_path: Path
) -> None:
    """`dataloader enqueue --wait` waits on a direct connection (the end heard by LISTEN) and
    reads and writes through the pooler; without DL_DB_DIRECT_DSN it is refused in one line."""
    pooled = transaction_pooler.through(db_dsn)
    command = [str(DATALOADER_SCRIPT), "enqueue", "demo.noop", "--queue", "default", "--wait"]
    refused = await asyncio.to_thread(run_cli, command, {"DL_DB_DSN": pooled}, tmp_path)
    assert refused.returncode == 2, refused.stdout
    assert "DL_DB_DIRECT_DSN" in one_line(refused.stdout)
    worker = {
        "DL_DB_DSN": pooled,
        "DL_DB_DIRECT_DSN": db_dsn,
        "DL_HTTP_PORT": str(free_port()),
        "DL_POLL_INTERVAL_SEC": "300",  # the job starts on its notification
    }
    service = await asyncio.to_thread(
        subprocess.Popen,
        [*PYTHON_M_DATALOADER],
        env=clean_env(worker),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        done = await asyncio.to_thread(
            run_cli, command, {"DL_DB_DSN": pooled, "DL_DB_DIRECT_DSN": db_dsn}, tmp_path
        )
        assert done.returncode == 0, done.stdout
        assert "succeeded" in done.stdout
    finally:
        service.kill()
        await asyncio.to_thread(service.wait, 10)
