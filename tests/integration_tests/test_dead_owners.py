"""A process whose presence lapsed is gone: the reaper takes its running jobs back without
waiting for their leases. A live process's jobs are never taken, however late its last
refresh within its three periods; and a process that cannot refresh stops its jobs first."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import asyncpg

from dataloader.config import Settings
from dataloader.core.transitions import on_expired
from dataloader.runner import Runner
from dataloader.storage.protocol import WorkerProtocol
from dataloader.tasks import TaskRegistry
from dataloader.workers.fencing import GONE_AFTER_PERIODS, PresenceFence, presence_window
from dataloader.workers.reaper import Reaper

from .conftest import StartService
from .helpers import block_first_run, pipeline_running, wait_until


async def add_owner(conn: asyncpg.Connection, worker_id: str, seen_ago_sec: float) -> None:
    """A process row refreshed `seen_ago_sec` ago, with a period of 1 s (gone after 3 s)."""
    await conn.execute(
        "INSERT INTO dl_workers (worker_id, host, pid, version, queues, period_sec, seen_at)"
        " VALUES ($1, 'h', 1, '0', '{\"q\": 1}', 1, now() - make_interval(secs => $2))",
        worker_id,
        seen_ago_sec,
    )


async def running_job(conn: asyncpg.Connection, worker_id: str) -> uuid.UUID:
    """A job `worker_id` runs, with a lease a minute long still to run."""
    job_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, attempt, worker_id,"
        " claim_token, started_at, lease_expires_at)"
        " VALUES ($1::uuid, 'q', 'demo.noop', $1::uuid::text, 'running', 1, $2,"
        " gen_random_uuid(), now(), now() + interval '60 seconds')",
        job_id,
        worker_id,
    )
    return job_id


async def status_of(conn: asyncpg.Connection, job_id: uuid.UUID) -> str:
    status: str = await conn.fetchval("SELECT status::text FROM dl_jobs WHERE job_id = $1", job_id)
    return status


async def test_the_jobs_of_a_gone_owner_are_taken_back_and_a_late_but_live_ones_are_not(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    await add_owner(conn, "gone", seen_ago_sec=3.5)
    await add_owner(conn, "slow", seen_ago_sec=2.5)  # late, yet within its three periods
    gone, slow = await running_job(conn, "gone"), await running_job(conn, "slow")
    # deregistered at a clean stop while its last jobs wind down: its leases alone count
    winding_down = await running_job(conn, "deregistered")
    service = await start_service(run_workers=False)
    reaper = Reaper(WorkerProtocol(service.context.pool), "r")
    assert await reaper.run_once() == {"queued": 1}
    assert await status_of(conn, gone) == "queued"
    assert await status_of(conn, slow) == "running"
    assert await status_of(conn, winding_down) == "running"
    # the retry follows the rules of an expired lease: the attempt counted, journaled
    event = await conn.fetchrow(
        "SELECT payload->>'attempt' AS attempt, payload->>'reason' AS reason"
        " FROM dl_job_events WHERE job_id = $1 AND kind = 'requeue'",
        gone,
    )
    assert (event["attempt"], event["reason"]) == ("1", "lease expired")
    assert await conn.fetchval("SELECT worker_id FROM dl_jobs WHERE job_id = $1", slow) == "slow"


async def test_after_an_outage_it_saw_the_reaper_leaves_the_others_time_to_come_back(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """A failover or a restart lapses every process's presence, the live ones' too: the
    reaper's process, having seen the database away, judges them only once they have had
    three periods to refresh (and to hand back the jobs they stopped, refunded)."""
    await add_owner(conn, "away", seen_ago_sec=20)  # as every process is after an outage
    job_id = await running_job(conn, "away")
    service = await start_service(run_workers=False)
    fence = PresenceFence(1.0)
    reaper = Reaper(WorkerProtocol(service.context.pool), "r", presence=fence)
    fence.failed()  # this process's own refresh could not reach the database
    assert await reaper.sweep() == {"waiting_after_outage": 1, "put_back": 0}
    assert reaper.due_in == 1.0
    fence.refreshed(time.monotonic())  # back
    assert await reaper.sweep() == {"waiting_after_outage": 1, "put_back": 0}
    assert await status_of(conn, job_id) == "running"
    assert reaper.due_in is not None
    assert 2.5 < reaper.due_in <= GONE_AFTER_PERIODS * 1.0  # the next pass, when it may judge
    # the owner came back meanwhile: its job stays its own
    await conn.execute("UPDATE dl_workers SET seen_at = now() WHERE worker_id = 'away'")
    fence.back_at -= GONE_AFTER_PERIODS  # (three periods later)
    assert await reaper.sweep() == {"put_back": 0}
    assert await status_of(conn, job_id) == "running"
    # one that did not come back is gone, as ever
    await conn.execute("UPDATE dl_workers SET seen_at = now() - interval '20 seconds'")
    assert await reaper.sweep() == {"queued": 1, "put_back": 0}
    assert await status_of(conn, job_id) == "queued"


async def test_a_refresh_that_lands_between_the_reapers_read_and_write_keeps_the_jobs(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    await add_owner(conn, "back", seen_ago_sec=3.5)
    job_id = await running_job(conn, "back")
    service = await start_service(run_workers=False)
    protocol = WorkerProtocol(service.context.pool)
    [expired] = await protocol.expired(10)
    await conn.execute("UPDATE dl_workers SET seen_at = now() WHERE worker_id = 'back'")
    applied = await protocol.reap([(expired, on_expired(expired.facts))], "r")
    assert job_id not in applied or applied[job_id].state != "written"
    assert await status_of(conn, job_id) == "running"


async def test_the_reaper_passes_when_an_owner_would_turn_gone(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    await add_owner(conn, "owner", seen_ago_sec=1.0)
    await running_job(conn, "owner")
    service = await start_service(run_workers=False)
    protocol = WorkerProtocol(service.context.pool)
    due_in = await protocol.next_reapable_in()
    assert due_in is not None
    assert 1.5 < due_in <= 2.0  # gone at 3 s, unless refreshed meanwhile; its lease is at 60 s
    await conn.execute("UPDATE dl_workers SET seen_at = now() - interval '10 seconds'")
    # an owner already gone is the current pass's business, not the next one's: its lease
    assert 55 < (await protocol.next_reapable_in() or 0) <= 60


async def test_a_process_that_cannot_refresh_stops_its_jobs_before_it_may_be_found_gone(
    make_settings: Callable[..., Settings],
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    db_dsn: str,
) -> None:
    """Its refreshes are held up (its row locked by another session); its job, on a lease of
    a minute, is stopped at its presence's deadline, while the database still counts the
    process live, and handed back (refunded) once the refreshes get through again."""
    stopped = block_first_run(registry, "t.long")
    period = 1.0
    settings = make_settings(
        workers=[{"queue": "default", "concurrency": 1}],
        presence_period_sec=period,
        default_lease_ttl_sec=60,
    )
    holder = await asyncpg.connect(db_dsn)
    try:
        async with Runner(settings, registry) as runner:
            assert runner.manager is not None
            worker_id = runner.manager.worker_id
            job_id = (
                await runner.client.enqueue("t.long", lock_key="long", queue="default")
            ).job_id
            await wait_until(pipeline_running(runner.manager, str(job_id)), what="the job")
            tx = holder.transaction()
            await tx.start()
            await holder.execute(
                "SELECT 1 FROM dl_workers WHERE worker_id = $1 FOR UPDATE", worker_id
            )
            locked_at = time.monotonic()
            await stopped.wait()
            stopped_at = time.monotonic()
            # the database has not found the process gone: no one may have taken the job yet
            live = await conn.fetchval(
                "SELECT seen_at > now() - make_interval(secs => 3 * period_sec)"
                " FROM dl_workers WHERE worker_id = $1",
                worker_id,
            )
            assert live
            assert stopped_at - locked_at <= presence_window(period)
            await tx.rollback()

            async def handed_back() -> bool:
                return bool(
                    await conn.fetchval(
                        "SELECT count(*) FROM dl_job_events WHERE job_id = $1"
                        " AND kind = 'requeue' AND payload->>'reason' LIKE '%presence%'"
                        " AND (payload->>'refunded')::bool",
                        job_id,
                    )
                )

            await wait_until(handed_back, what="the stopped job handed back")
    finally:
        await holder.close()
