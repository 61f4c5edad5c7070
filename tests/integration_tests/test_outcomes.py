"""Leases and outcomes under trouble: outcome writes retried with the lease kept alive, a
heartbeat no row lock or busy pipeline can stall, bounded refunds, fencing tokens that a
failover cannot hand out twice."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from dataloader.core.models import NewJob
from dataloader.core.retry import Linear
from dataloader.core.transitions import Ended, Outcome, after_attempt
from dataloader.storage.connections import GuardedPool
from dataloader.storage.db import create_pool
from dataloader.storage.protocol import WorkerProtocol
from dataloader.storage.repositories import JobRepository
from dataloader.tasks import TaskRegistry
from dataloader.workers.completer import MAX_WRITE_ERRORS
from dataloader.workers.job_context import JobContext
from dataloader.workers.reaper import Reaper

from .conftest import StartService
from .helpers import event_kinds, event_payloads, finish_claimed, pipeline_running, wait_until
from .test_lock_keys import gated

WORKER = "test-worker"

#: Every write of a success fails with an error of the statement (not of the connection).
REFUSE_SUCCESS = """
CREATE FUNCTION refuse_success() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'success refused for this test'; END $$;
CREATE TRIGGER refuse_success BEFORE UPDATE ON dl_jobs
FOR EACH ROW WHEN (NEW.status = 'succeeded') EXECUTE FUNCTION refuse_success();
"""

#: Every write of a success loses its connection (the session ends itself mid-statement).
CUT_SUCCESS = """
CREATE FUNCTION cut_success() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW; END $$;
CREATE TRIGGER cut_success BEFORE UPDATE ON dl_jobs
FOR EACH ROW WHEN (NEW.status = 'succeeded') EXECUTE FUNCTION cut_success();
"""


@dataclass
class Stores:
    """The client's and the worker's statements over one pool of the test's database."""

    repo: JobRepository
    protocol: WorkerProtocol


@pytest.fixture
async def stores(db_dsn: str) -> AsyncIterator[Stores]:
    pool = await create_pool(db_dsn, 2, "test")
    yield Stores(JobRepository(GuardedPool(pool)), WorkerProtocol(pool))
    await pool.close()


SUCCESS = Outcome(Ended.SUCCEEDED)


async def lease_expires_at(conn: asyncpg.Connection, job_id: str) -> Any:
    return await conn.fetchval(
        "SELECT lease_expires_at FROM dl_jobs WHERE job_id = $1::text::uuid", job_id
    )


async def test_a_success_whose_write_fails_is_retried_with_its_lease_alive(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """The job succeeded, then writing that lost its connection again and again for longer than
    its lease: the lease is kept alive meanwhile (the reaper would make a last attempt `lost`),
    and the write lands once the database takes it."""
    gate = gated(registry, "t.gated")
    service = await start_service(reaper_period_sec=0.1)
    job_id = await service.trigger(task="t.gated", max_attempts=1, lease_ttl_sec=3)
    await wait_until(pipeline_running(service.manager, job_id), what="the job to run")
    await conn.execute(CUT_SUCCESS)
    first_lease = await lease_expires_at(conn, job_id)
    gate.set()
    completer = service.manager.completer

    async def refused_past_the_first_lease() -> bool:
        lease = await lease_expires_at(conn, job_id)
        return completer.failed_writes >= 3 and lease > first_lease + dt.timedelta(seconds=4)

    await wait_until(refused_past_the_first_lease, what="refusals outlasting the first lease")
    assert (await service.status(job_id))["status"] == "running"  # not reaped
    await conn.execute("DROP TRIGGER cut_success ON dl_jobs")
    body = await service.wait_status(job_id, "succeeded")
    assert body["attempt"] == 1
    assert await event_kinds(conn, job_id) == ["queued", "picked", "heartbeat", "done"]


async def test_a_locked_row_does_not_stall_the_other_leases(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """Someone holds one running job's row (a pipeline fencing its own writes, an operator)
    longer than a statement may wait: the heartbeat skips that row and extends the others."""
    gate = gated(registry, "t.gated")
    service = await start_service(db_timeout_sec=0.5)
    held = await service.trigger(task="t.gated", lease_ttl_sec=10)
    free = await service.trigger(task="t.gated", lease_ttl_sec=10)
    for job_id in (held, free):
        await wait_until(pipeline_running(service.manager, job_id), what="the jobs to run")
    async with conn.transaction():
        await conn.execute("SELECT 1 FROM dl_jobs WHERE job_id = $1::text::uuid FOR SHARE", held)
        locked_at = await conn.fetchval("SELECT clock_timestamp()")

        async def free_extended_past_the_timeout() -> bool:
            beat = await asyncio.wait_for(_heartbeat_at(service.settings.db_dsn, free), 5)
            return beat > locked_at + dt.timedelta(seconds=1.5)  # three statement timeouts later

        await wait_until(free_extended_past_the_timeout, what="the other lease to be extended")
    gate.set()
    for job_id in (held, free):
        body = await service.wait_status(job_id, "succeeded")
        assert body["attempt"] == 1  # neither was stopped


async def test_a_hurried_stop_still_writes_a_hand_back_whose_row_was_held(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """A second stop signal gives up writes that fail, not one whose row another session held
    for a moment (the job's own heartbeat or progress write): the job is handed back, not left
    running for the reaper."""
    gated(registry, "t.gated")
    service = await start_service()
    manager = service.manager
    job_id = await service.trigger(task="t.gated", lease_ttl_sec=60)
    await wait_until(pipeline_running(manager, job_id), what="the job to run")
    async with conn.transaction():
        await conn.execute("SELECT 1 FROM dl_jobs WHERE job_id = $1::text::uuid FOR SHARE", job_id)
        manager.hurry()
        stopping = asyncio.create_task(manager.stop(timeout=60))

        async def found_busy() -> bool:
            return manager.completer.busy_writes > 0

        await wait_until(found_busy, what="the hand-back to find its row held")
    await asyncio.wait_for(stopping, 30)
    row = await conn.fetchrow(
        "SELECT status, attempt FROM dl_jobs WHERE job_id = $1::text::uuid", job_id
    )
    assert (row["status"], row["attempt"]) == ("queued", 0)
    assert (await event_kinds(conn, job_id))[-1] == "requeue"


async def _heartbeat_at(dsn: str | None, job_id: str) -> Any:
    assert dsn is not None
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(
            "SELECT heartbeat_at FROM dl_jobs WHERE job_id = $1::text::uuid", job_id
        )
    finally:
        await conn.close()


async def test_pipelines_holding_every_pool_connection_do_not_starve_the_leases(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """Pipelines are given the queue's pool (`ctx.app.pool`); holding all of its connections
    must not keep the heartbeat (or the outcome writes) from theirs."""
    release = asyncio.Event()

    @registry.register("t.hog")
    async def hog(ctx: JobContext[dict[str, Any]]) -> None:
        async with ctx.app.pool.acquire():
            await release.wait()

    service = await start_service(db_pool_size=2, db_timeout_sec=0.5)
    jobs = [await service.trigger(task="t.hog", lease_ttl_sec=2) for _ in range(2)]
    for job_id in jobs:
        await wait_until(pipeline_running(service.manager, job_id), what="the hogs to run")
    first_lease = await lease_expires_at(conn, jobs[0])

    async def extended_past_the_first_lease() -> bool:
        return await lease_expires_at(conn, jobs[0]) > first_lease + dt.timedelta(seconds=2)

    await wait_until(extended_past_the_first_lease, what="the leases to be extended")
    release.set()
    for job_id in jobs:
        body = await service.wait_status(job_id, "succeeded")
        assert body["attempt"] == 1


async def test_refunded_hand_backs_are_bounded(conn: asyncpg.Connection, stores: Stores) -> None:
    """A job that keeps being handed back (say it brings its process down at every run) is
    refunded a bounded number of times; then each hand-back consumes an attempt, and on the
    last one the job is `lost` rather than looping forever."""
    repo, protocol = stores.repo, stores.protocol
    job = await repo.enqueue(NewJob(queue="q", task="t", lock_key="k", args={}, max_attempts=1))
    kinds = []
    for _ in range(4):
        (claim,) = await protocol.claim("q", 1, WORKER)
        handback = Outcome(Ended.HANDED_BACK, "worker shutting down", refund=True)
        written = await finish_claimed(protocol, claim, handback, WORKER)
        assert written is not None
        kinds.append(written.journal)
    assert kinds == ["requeue", "requeue", "requeue", "lost"]
    payloads = await event_payloads(conn, str(job.job_id), "requeue")
    assert [p["refunded"] for p in payloads] == [True, True, True]
    state = await repo.get(job.job_id)
    assert state is not None
    assert (state.status, state.attempt) == ("lost", 1)


async def test_a_claim_lost_in_a_failover_cannot_pass_for_the_next_one(
    conn: asyncpg.Connection, stores: Stores
) -> None:
    """After a failover to an asynchronous standby that never received a claim, the new primary
    claims the job again from the same row: the same attempt and claim_seq come out, but not
    the same claim_token, so the lost claim's process (still running) writes nothing."""
    repo, protocol = stores.repo, stores.protocol
    job = await repo.enqueue(NewJob(queue="q", task="t", lock_key="k", args={}))
    before = await conn.fetchrow("SELECT * FROM dl_jobs WHERE job_id = $1", job.job_id)
    (lost,) = await protocol.claim("q", 1, WORKER)
    # The failover: the row is back as the standby last saw it, before that claim.
    await conn.execute(
        "UPDATE dl_jobs SET status = 'queued', attempt = $2, claim_seq = $3,"
        " claim_token = $4, started_at = NULL, heartbeat_at = NULL,"
        " lease_expires_at = NULL WHERE job_id = $1",
        job.job_id,
        before["attempt"],
        before["claim_seq"],
        before["claim_token"],
    )
    (new,) = await protocol.claim("q", 1, "new-primary-worker")
    assert (new.attempt, new.claim_seq) == (lost.attempt, lost.claim_seq)
    assert new.claim_token != lost.claim_token
    assert await finish_claimed(protocol, lost, SUCCESS, WORKER) is None
    assert await protocol.set_progress(job.job_id, lost.claim_token, '{"zombie": 1}') is None
    assert await protocol.heartbeat([(job.job_id, lost.claim_token, False)], WORKER) == {}
    state = await repo.get(job.job_id)
    assert state is not None
    assert (state.status, state.progress) == ("running", {})


async def test_a_claim_by_an_earlier_version_clears_the_token_of_the_claim_before(
    conn: asyncpg.Connection, stores: Stores
) -> None:
    """During a rolling upgrade a process of the earlier version claims by incrementing
    claim_seq alone; the token of the claim before it must not stay valid, or a process of this
    version still holding that claim (its lease reaped meanwhile) would pass the new fence."""
    repo, protocol = stores.repo, stores.protocol
    job = await repo.enqueue(NewJob(queue="q", task="t", lock_key="k", args={}))
    (zombie,) = await protocol.claim("q", 1, WORKER)
    await conn.execute("UPDATE dl_jobs SET lease_expires_at = now() - interval '1 second'")
    assert await Reaper(protocol, "reaper").run_once() == {"queued": 1}
    # the earlier version's claim: no claim_token in its SET list
    await conn.execute(
        "UPDATE dl_jobs SET status = 'running', attempt = attempt + 1,"
        " claim_seq = claim_seq + 1, lease_expires_at = now() + interval '1 hour'"
        " WHERE job_id = $1",
        job.job_id,
    )
    assert await conn.fetchval("SELECT claim_token FROM dl_jobs") is None
    assert await protocol.heartbeat([(job.job_id, zombie.claim_token, False)], WORKER) == {}
    assert await finish_claimed(protocol, zombie, SUCCESS, WORKER) is None
    state = await repo.get(job.job_id)
    assert state is not None
    assert (state.status, state.attempt) == ("running", 2)


async def test_a_success_whose_row_is_held_elsewhere_does_not_hold_up_the_others(
    conn: asyncpg.Connection, stores: Stores
) -> None:
    """A row locked by someone else (an operator, a pipeline's fence) is skipped by the batched
    completion and reported busy, still ours; the rest of the batch is written at once."""
    repo, protocol = stores.repo, stores.protocol
    for key in ("a", "b"):
        await repo.enqueue(NewJob(queue="q", task="t", lock_key=key, args={}))
    held, free = await protocol.claim("q", 2, WORKER)
    outcomes = [
        (claim, claim.facts(), after_attempt(SUCCESS, claim.facts(), Linear()))
        for claim in (held, free)
    ]
    async with conn.transaction():
        await conn.execute("SELECT 1 FROM dl_jobs WHERE job_id = $1 FOR SHARE", held.job_id)
        written = await asyncio.wait_for(protocol.finish(outcomes, WORKER), timeout=5)
    assert {job_id: w.state for job_id, w in written.items()} == {
        held.job_id: "busy",
        free.job_id: "written",
    }
    again = await protocol.finish(outcomes[:1], WORKER)
    assert again[held.job_id].state == "written"


async def test_an_outcome_that_can_never_be_written_is_given_up_to_the_reaper(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """A write that fails for another reason than a lost connection, again and again, is given
    up after a few tries: its lease is no longer kept alive, so the job does not stay running
    (its lock_key blocked) for ever; the reaper decides."""
    service = await start_service(reaper_period_sec=0.1)
    await conn.execute(REFUSE_SUCCESS)
    job_id = await service.trigger(task="demo.noop", max_attempts=1, lease_ttl_sec=1)
    body = await service.wait_status(job_id, "lost")
    assert body["error"] == "lease expired on the last attempt"
    assert service.manager.completer.failed_writes >= MAX_WRITE_ERRORS


async def test_a_pipeline_winding_down_after_its_lock_is_lost_keeps_its_lease(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """The lock connection is lost: the pipeline is cancelled, and its clean-up takes longer
    than the lease. The lease is kept alive until it ends, so the row stays `running` and no
    claim, here or on another replica, takes the job or its key meanwhile."""
    cleaning_up, cleanup_done = asyncio.Event(), asyncio.Event()

    @registry.register("t.slow_cleanup")
    async def slow_cleanup(ctx: JobContext[dict[str, Any]]) -> None:
        if cleaning_up.is_set():
            return
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cleaning_up.set()
            await cleanup_done.wait()
            raise

    service = await start_service(reaper_period_sec=0.1)
    job_id = await service.trigger(task="t.slow_cleanup", lease_ttl_sec=3)
    await wait_until(pipeline_running(service.manager, job_id), what="the job to run")
    await conn.execute("SELECT pg_terminate_backend($1)", service.manager.runtime.locks.backend_pid)
    await asyncio.wait_for(cleaning_up.wait(), timeout=10)
    first_lease = await lease_expires_at(conn, job_id)

    async def extended_past_the_first_lease() -> bool:
        lease = await lease_expires_at(conn, job_id)
        return lease is not None and lease > first_lease + dt.timedelta(seconds=4)

    await wait_until(extended_past_the_first_lease, what="the lease to be kept alive")
    cleanup_done.set()
    await service.wait_status(job_id, "succeeded")
    # handed back once by its worker (lock lost), never requeued by the reaper
    (reason,) = [p["reason"] for p in await event_payloads(conn, job_id, "requeue")]
    assert "lock" in reason, reason
