"""A claiming write whose answer is lost: the server commits it, the connection dies before the
answer arrives. The worker knows every token such a write could give, looks its jobs up once the
database answers again, and runs them at once, on the attempt the write counted: neither left
running under a token nobody knows until the lease ends, nor reaped at the cost of an attempt
(a job of `max_attempts=1` would end `lost` without ever running).

The worker's connections go through a proxy. The test holds a lock that every claim of a job
waits for (a trigger of the test's own), cuts the answer of every connection with a request in
flight, and lets go: the write commits, and its answer is swallowed with the connection.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from dataloader import NewJob
from dataloader.config import Settings
from dataloader.storage.repositories import enqueue_many
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext

from ..faults.proxy import FreezingProxy, upstream_of
from .conftest import TEST_DEFAULTS, StartService
from .helpers import pipeline_running, wait_until

#: Far beyond the time the tests allow for a job to run: a job that runs within it was not
#: waiting for its lease to end.
LEASE_SEC = 120
PROMPTLY_SEC = 20


@pytest.fixture
async def proxy(db_dsn: str) -> AsyncIterator[FreezingProxy]:
    proxy = FreezingProxy(upstream_of(db_dsn))
    await proxy.start()
    yield proxy
    await proxy.close()


@pytest.fixture
def make_settings(db_dsn: str, proxy: FreezingProxy) -> Callable[..., Settings]:
    """The services of these tests reach the database through the proxy."""
    proxied = proxy.dsn(urlsplit(db_dsn).path.lstrip("/"))

    def build(**overrides: Any) -> Settings:
        return Settings(_env_file=None, db_dsn=proxied, **(TEST_DEFAULTS | overrides))  # type: ignore[call-arg]

    return build


#: Every claim of a job (queued to running), by a claim or a hand-off, waits for this
#: advisory lock while the test holds it.
CLAIMS_WAIT = """
CREATE FUNCTION test_claim_waits() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(4242);
    RETURN NEW;
END $$;
CREATE TRIGGER test_claim_waits BEFORE UPDATE ON dl_jobs FOR EACH ROW
WHEN (OLD.status = 'queued' AND NEW.status = 'running') EXECUTE FUNCTION test_claim_waits();
"""


@pytest.fixture
async def claims_wait(conn: asyncpg.Connection) -> None:
    """Claims wait while `conn` holds advisory lock 4242."""
    await conn.execute(CLAIMS_WAIT)
    await conn.execute("SELECT pg_advisory_lock(4242)")


#: Sessions waiting for a lock of the kind (`advisory`, or a table's name).
WAITING = """
SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
WHERE NOT l.granted AND (l.locktype = $1 OR l.relation = to_regclass($1))
  AND l.pid <> ALL($2::int[]) AND a.query LIKE $3
"""


async def cut_when_waiting(
    conn: asyncpg.Connection,
    proxy: FreezingProxy,
    lock: str,
    *,
    apart_from: int = 0,
    query_like: str = "%",
) -> None:
    """Once a session (not `apart_from`; running a statement `LIKE query_like`) waits for a
    lock of the kind, cut the answers of the statements in flight."""

    async def waiting() -> bool:
        return bool(await conn.fetchval(WAITING, lock, [apart_from], query_like))

    await wait_until(waiting, what=f"a session waiting for a lock ({lock})")
    assert proxy.cut_answers() >= 1


async def lose_the_answer_of_a_claim(conn: asyncpg.Connection, proxy: FreezingProxy) -> None:
    """Once a statement claiming a job waits for `conn`'s lock, cut the answers of the
    statements in flight, then let them go on (and commit)."""
    await cut_when_waiting(conn, proxy, "advisory")
    await conn.execute("SELECT pg_advisory_unlock(4242)")


async def assert_ran_once_promptly(conn: asyncpg.Connection, job_id: uuid.UUID) -> None:
    """The job succeeded on its first and only attempt, picked once, long before its lease."""

    async def ended() -> str | None:
        status: str | None = await conn.fetchval(
            "SELECT status::text FROM dl_jobs WHERE job_id = $1 AND status <> 'running'"
            " AND status <> 'queued'",
            job_id,
        )
        return status

    assert await wait_until(ended, timeout=PROMPTLY_SEC, what="the job to end") == "succeeded"
    row = await conn.fetchrow("SELECT attempt, max_attempts FROM dl_jobs WHERE job_id = $1", job_id)
    assert row is not None
    assert (row["attempt"], row["max_attempts"]) == (1, 1)
    picked = await conn.fetchval(
        "SELECT count(*) FROM dl_job_events WHERE job_id = $1 AND kind = 'picked'", job_id
    )
    assert picked == 1


def job(task: str, lock_key: str, **fields: Any) -> NewJob:
    return NewJob(
        queue="default",
        task=task,
        lock_key=lock_key,
        max_attempts=1,
        lease_ttl_sec=LEASE_SEC,
        **fields,
    )


@pytest.mark.usefixtures("claims_wait")
@pytest.mark.parametrize("jobs", [1, 3])
async def test_a_claim_whose_answer_was_lost_runs_its_jobs_at_once(
    start_service: StartService,
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    proxy: FreezingProxy,
    jobs: int,
) -> None:
    """One job, or several claimed by one statement."""

    @registry.register("t.quick")
    async def quick(ctx: JobContext[dict[str, Any]]) -> None:
        return None

    await start_service()
    enqueued = await enqueue_many(conn, [job("t.quick", f"k{i}") for i in range(jobs)])
    await lose_the_answer_of_a_claim(conn, proxy)
    for each in enqueued:
        await assert_ran_once_promptly(conn, each.job_id)
    picked_by = await conn.fetchval(
        "SELECT count(DISTINCT ts) FROM dl_job_events WHERE kind = 'picked'"
    )
    assert picked_by == 1  # by the one claim whose answer was lost


@pytest.mark.usefixtures("claims_wait")
async def test_a_look_up_whose_answer_is_lost_too_is_made_again(
    start_service: StartService,
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    db_dsn: str,
    proxy: FreezingProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The jobs of a lost claim are known to nobody else: their look-up is made until the
    database answers it."""

    @registry.register("t.quick")
    async def quick(ctx: JobContext[dict[str, Any]]) -> None:
        return None

    await start_service()
    [enqueued] = await enqueue_many(conn, [job("t.quick", "a")])
    await cut_when_waiting(conn, proxy, "advisory")
    # the jobs table is held from the claim's commit on: the look-up waits for it
    holder = await asyncpg.connect(db_dsn)
    try:
        await holder.execute("BEGIN")
        held = asyncio.create_task(holder.execute("LOCK TABLE dl_jobs IN ACCESS EXCLUSIVE MODE"))
        await wait_until(
            lambda: conn.fetchval(WAITING, "dl_jobs", [0], "%"), what="the table lock to wait"
        )
        await conn.execute("SELECT pg_advisory_unlock(4242)")
        await held
        # the look-up's own wait (a maintenance statement may wait for the table too)
        await cut_when_waiting(
            conn,
            proxy,
            "dl_jobs",
            apart_from=holder.get_server_pid(),
            query_like="%AS s(suffix)%",
        )
        await holder.execute("COMMIT")
    finally:
        await holder.close()
    await assert_ran_once_promptly(conn, enqueued.job_id)
    assert "looking up the jobs of a lost answer failed" in caplog.text


@pytest.mark.usefixtures("claims_wait")
async def test_a_hand_off_whose_answer_was_lost_runs_its_job_at_once(
    start_service: StartService,
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    proxy: FreezingProxy,
) -> None:
    gate = asyncio.Event()

    @registry.register("t.gated")
    async def gated(ctx: JobContext[dict[str, Any]]) -> None:
        await gate.wait()

    @registry.register("t.quick")
    async def quick(ctx: JobContext[dict[str, Any]]) -> None:
        return None

    # four slots: one is free for the next job even while a claim holds the others
    service = await start_service(workers=[{"queue": "default", "concurrency": 4}])
    await conn.execute("SELECT pg_advisory_unlock(4242)")  # the first job is claimed at once
    first, second = await enqueue_many(conn, [job("t.gated", "k"), job("t.quick", "k")])
    await wait_until(pipeline_running(service.manager, str(first.job_id)), what="the first job")

    # parked behind the first, as a claim that found its key running parks it (whether one has
    # yet depends on the claim loop's timing): then no claim walks the second job, and none can
    # hold its row as the first one's end looks for the next job of its key (that look skips a
    # locked row, and a claim would then take the job, not the hand-off)
    await conn.execute("UPDATE dl_jobs SET parked = 'lock_key' WHERE job_id = $1", second.job_id)
    await conn.execute("SELECT pg_advisory_lock(4242)")
    gate.set()
    await lose_the_answer_of_a_claim(conn, proxy)
    await assert_ran_once_promptly(conn, second.job_id)
    # the second job was handed off by the write of the first one's end (one transaction)
    handed = await conn.fetchval(
        "SELECT (SELECT ts FROM dl_job_events WHERE job_id = $1 AND kind = 'picked')"
        " = (SELECT finished_at FROM dl_jobs WHERE job_id = $2)",
        second.job_id,
        first.job_id,
    )
    assert handed
    ended = await conn.fetchval("SELECT status::text FROM dl_jobs WHERE job_id = $1", first.job_id)
    assert ended == "succeeded"


@pytest.mark.usefixtures("claims_wait")
async def test_a_stop_does_not_wait_for_the_database_to_look_up_a_lost_hand_off(
    start_service: StartService,
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    proxy: FreezingProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the database unreachable, a stopping process gives up the look-up (as it gives up
    an outcome's write once its lease has run out): those jobs wait for their lease."""
    gate = asyncio.Event()

    @registry.register("t.gated")
    async def gated(ctx: JobContext[dict[str, Any]]) -> None:
        await gate.wait()

    service = await start_service(workers=[{"queue": "default", "concurrency": 4}])
    await conn.execute("SELECT pg_advisory_unlock(4242)")
    first, _ = await enqueue_many(
        conn, [replace(job("t.gated", "k"), lease_ttl_sec=2), job("t.gated", "k")]
    )
    await wait_until(pipeline_running(service.manager, str(first.job_id)), what="the first job")
    await conn.execute("SELECT pg_advisory_lock(4242)")
    gate.set()
    await cut_when_waiting(conn, proxy, "advisory")
    proxy.refuse()  # the write commits all the same (the server reads no more of its client)
    await conn.execute("SELECT pg_advisory_unlock(4242)")

    async def looking_up() -> bool:
        return "looking up the jobs of a lost answer failed" in caplog.text

    await wait_until(looking_up, what="a look-up to fail")
    await asyncio.wait_for(service.manager.stop(timeout=1), timeout=PROMPTLY_SEC)
    assert "the jobs of a lost answer are left to the reaper" in caplog.text
