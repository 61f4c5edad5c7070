"""Maintenance that one process runs for all: the lease that elects it, the pruner, the cron
scheduler, and what /status shows of them."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from dataloader.base import JobStatus
from dataloader.config import CronSpec
from dataloader.core.cron import idempotency_key
from dataloader.maintenance.cron import CronScheduler, CronSchedulesFailed
from dataloader.maintenance.leader import MAINTENANCE_LEASE, Leadership
from dataloader.maintenance.pruner import PruneIncomplete, Pruner, Retention
from dataloader.storage.connections import GuardedPool
from dataloader.storage.maintenance import MaintenanceStore
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext

from .conftest import Service, StartService
from .helpers import wait_until
from .procs import Launcher, ServiceProcess

DAY = 86_400.0


@pytest.fixture
async def store(db_dsn: str) -> AsyncIterator[MaintenanceStore]:
    pool = await asyncpg.create_pool(db_dsn, min_size=1, max_size=4)
    yield MaintenanceStore(GuardedPool(pool, 10))
    await pool.close()


def leads(service: Service) -> bool:
    return service.manager.maintenance.leadership.leading.is_set()


# --- the lease ---------------------------------------------------------------------------------


async def test_one_process_holds_the_lease_and_another_takes_it_when_released(
    store: MaintenanceStore,
) -> None:
    first, second = Leadership(store, "p1", 30), Leadership(store, "p2", 30)
    assert await first.bid()
    assert not await second.bid()
    assert await first.bid()  # renewed
    assert [(lease.name, lease.holder) for lease in await store.leases()] == [
        (MAINTENANCE_LEASE, "p1")
    ]
    await first.release()
    assert not first.leading.is_set()
    assert await second.bid()
    assert second.leading.is_set()


async def test_an_expired_lease_is_taken_over(store: MaintenanceStore) -> None:
    """A holder that stops renewing (dead, or cut off from the database) loses the lease once it
    expires, by the database's clock."""
    frozen, other = Leadership(store, "frozen", 1), Leadership(store, "other", 1)
    assert await frozen.bid()
    assert not await other.bid()

    async def taken() -> bool:
        return await other.bid()

    await wait_until(taken, what="the expired lease taken")
    assert not await frozen.bid()  # it learns at its next bid that it no longer leads
    assert not frozen.leading.is_set()


async def test_one_of_two_services_leads_and_the_other_takes_over_when_it_stops(
    db_dsn: str, registry: TaskRegistry, make_settings: Any
) -> None:
    from dataloader.runner import Runner

    settings = make_settings(leader_lease_sec=1)
    async with Runner(settings, registry) as one, Runner(settings, registry) as two:
        managers = [one.manager, two.manager]
        assert all(m is not None for m in managers)

        async def exactly_one() -> list[Any] | None:
            leading = [m for m in managers if m.maintenance.leadership.leading.is_set()]
            return leading if len(leading) == 1 else None

        leader = (await wait_until(exactly_one, what="one leader"))[0]
        follower = next(m for m in managers if m is not leader)
        await leader.stop(timeout=5)  # a clean stop releases the lease

        async def taken_over() -> bool:
            return follower.maintenance.leadership.leading.is_set()

        await wait_until(taken_over, what="the other process leading")


# --- the pruner --------------------------------------------------------------------------------


async def _job(
    conn: asyncpg.Connection, status: str, finished_ago_sec: float | None, queue: str = "q"
) -> uuid.UUID:
    job_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, attempt, started_at,"
        " finished_at, created_at)"
        " VALUES ($1::uuid, $2, 't', $1::uuid::text, $3::dl_status, 1, now(),"
        " now() - make_interval(secs => $4), now() - interval '90 days')",
        job_id,
        queue,
        status,
        finished_ago_sec,
    )
    await conn.execute(
        "INSERT INTO dl_job_events (job_id, queue, kind, payload) VALUES ($1, $2, 'queued', '{}')",
        job_id,
        queue,
    )
    return job_id


async def _present(conn: asyncpg.Connection, ids: list[uuid.UUID]) -> set[uuid.UUID]:
    rows = await conn.fetch("SELECT job_id FROM dl_jobs WHERE job_id = ANY($1::uuid[])", ids)
    return {row["job_id"] for row in rows}


async def test_the_pruner_deletes_only_finished_jobs_past_their_status_age(
    store: MaintenanceStore, conn: asyncpg.Connection
) -> None:
    retention = Retention(
        succeeded_sec=DAY, canceled_sec=DAY, failed_sec=30 * DAY, lost_sec=0, heartbeats_sec=DAY
    )
    old = {status: await _job(conn, status, 2 * DAY) for status in ("succeeded", "canceled")}
    kept = [
        await _job(conn, "succeeded", DAY / 2),  # too young
        await _job(conn, "failed", 2 * DAY),  # failed jobs are kept 30 days
        await _job(conn, "lost", 400 * DAY),  # lost jobs are kept forever (0)
        await _job(conn, "queued", None),  # unfinished, however old
        await _job(conn, "running", None),
    ]
    old_failed = await _job(conn, "failed", 31 * DAY)
    pruner = Pruner(store, retention, batch_size=1)  # one row per statement: many batches
    deleted = await pruner.prune()
    assert deleted["succeeded"] == 1
    assert deleted["canceled"] == 1
    assert deleted["failed"] == 1
    assert "lost" not in deleted
    assert await _present(conn, [*old.values(), old_failed, *kept]) == set(kept)
    orphans = await conn.fetchval(
        "SELECT count(*) FROM dl_job_events e WHERE NOT EXISTS"
        " (SELECT 1 FROM dl_jobs j WHERE j.job_id = e.job_id)"
    )
    assert orphans == 0  # the journals went with their jobs
    assert (await pruner.prune())["succeeded"] == 0


async def test_a_part_of_the_prune_that_fails_keeps_no_other_from_running(
    store: MaintenanceStore, conn: asyncpg.Connection
) -> None:
    """A retention the settings refuse (beyond the calendar: PostgreSQL cannot subtract it
    from now), given to the pruner all the same: its status fails, the others are pruned."""
    old = {s: await _job(conn, s, 2 * DAY) for s in ("succeeded", "canceled", "failed", "lost")}
    retention = Retention(
        succeeded_sec=1e12, canceled_sec=DAY, failed_sec=DAY, lost_sec=DAY, heartbeats_sec=DAY
    )
    with pytest.raises(PruneIncomplete) as raised:
        await Pruner(store, retention, batch_size=10).prune()
    assert list(raised.value.failed) == ["succeeded"]
    assert raised.value.deleted == {
        "canceled": 1, "failed": 1, "lost": 1, "heartbeats": 0, "throughput": 0,
    }  # fmt: skip
    assert "pruning failed for succeeded" in str(raised.value)
    assert await _present(conn, old.values()) == {old["succeeded"]}


async def test_heartbeat_entries_and_throughput_buckets_are_pruned_by_age(
    store: MaintenanceStore, conn: asyncpg.Connection
) -> None:
    running = await _job(conn, "running", None)
    await conn.execute(
        "INSERT INTO dl_job_events (job_id, queue, kind, ts, payload)"
        " SELECT $1, 'q', 'heartbeat', now() - make_interval(hours => h), '{}'"
        " FROM generate_series(0, 47) AS h",
        running,
    )
    await conn.execute(
        "INSERT INTO dl_queue_throughput (queue, bucket, kind, n)"
        " VALUES ('q', now() - interval '2 days', 'done', 5), ('q', now(), 'done', 7)"
    )
    retention = Retention(DAY, DAY, DAY, DAY, heartbeats_sec=DAY)
    deleted = await Pruner(store, retention, batch_size=10).prune()
    assert deleted["heartbeats"] == 24  # 24 … 47 hours old (24 h is more than a day by now)
    kinds = await conn.fetch(
        "SELECT kind, count(*) FROM dl_job_events WHERE job_id = $1 GROUP BY kind ORDER BY 1",
        running,
    )
    assert [(r["kind"], r["count"]) for r in kinds] == [("heartbeat", 24), ("queued", 1)]
    assert deleted["throughput"] == 1
    assert await conn.fetchval("SELECT sum(n) FROM dl_queue_throughput") == 7


async def test_pruning_under_load_never_touches_unfinished_jobs(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """Jobs finish and are pruned at once (an age of a millisecond) while others are queued,
    running and retried: every job missing at the end had finished."""
    finished: set[str] = set()

    @registry.register("t.work")
    async def work(ctx: JobContext[dict[str, Any]]) -> None:
        await asyncio.sleep(0.001 * (ctx.args["i"] % 5))
        if ctx.args["i"] % 7 == 0 and ctx.attempt == 1:
            raise RuntimeError("retried once")
        finished.add(str(ctx.job_id))

    service = await start_service(
        workers=[{"queue": "load", "concurrency": 8}],
        prune_period_sec=0.05,
        prune_batch_size=7,
        prune_succeeded_after_sec=0.001,
        prune_failed_after_sec=0.001,
    )
    ids = [
        str(r.job_id)
        for r in await service.dl.enqueue_many(
            [
                service.dl.job("t.work", {"i": i}, queue="load", lock_key=f"k{i % 50}")
                for i in range(600)
            ]
        )
    ]

    async def all_gone() -> bool:
        left = await conn.fetchval(
            "SELECT count(*) FROM dl_jobs WHERE job_id = ANY($1::uuid[])", ids
        )
        return left == 0

    await wait_until(all_gone, timeout=120, what="every job run and pruned")
    assert finished == set(ids)  # nothing was deleted before it had finished
    runs = {
        run.task: run
        for run in await MaintenanceStore(GuardedPool(service.context.pool, 10)).runs()
    }
    assert runs["pruner"].ok


# --- cron --------------------------------------------------------------------------------------


async def _cron_jobs(conn: asyncpg.Connection, name: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT idempotency_key, available_at, producer, lock_key, args::text AS args"
        " FROM dl_jobs WHERE idempotency_key LIKE $1 ORDER BY available_at",
        f"cron:{name}:%",
    )


async def test_a_scheduler_enqueues_each_slot_once_from_its_first_tick(
    store: MaintenanceStore, start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False)
    spec = CronSpec(
        name="tick",
        schedule="* * * * * *",
        task="demo.noop",
        queue="q",
        args={"a": 1},
        catch_up=True,
    )
    first, second = (
        CronScheduler(store, service.dl, [spec]),
        CronScheduler(store, service.dl, [spec]),
    )
    assert await first.tick() == {"enqueued": 0, "schedules": 1}  # starts from now
    state = (await store.cron_state())["tick"]
    start = state.last_slot
    assert start is not None
    # two schedulers (two processes that both believe they lead) after 3 slots
    await conn.execute(
        "UPDATE dl_cron SET last_slot = last_slot - interval '3 seconds' WHERE name = 'tick'"
    )
    made = [await first.tick(), await second.tick()]
    rows = await _cron_jobs(conn, "tick")
    assert 3 <= sum(m["enqueued"] for m in made) == len(rows)
    slots = [row["available_at"] for row in rows]
    assert slots == sorted(set(slots))
    assert rows[-1]["idempotency_key"] == idempotency_key("tick", slots[-1])
    assert {(r["producer"], r["lock_key"], r["args"]) for r in rows} == {
        ("cron", "cron:tick", '{"a": 1}')
    }
    assert 0 < first.next_in_sec() <= 1


async def test_a_schedule_its_task_refuses_leaves_the_others_to_run_and_fails_the_run(
    store: MaintenanceStore, start_service: StartService, conn: asyncpg.Connection
) -> None:
    """`demo.sleep` needs `seconds`: its schedule cannot enqueue, the one after it does, and
    the tick fails naming it (the run is recorded failed: /status warns)."""
    service = await start_service(run_workers=False)
    specs = [
        CronSpec(name="bad", schedule="* * * * * *", task="demo.sleep", queue="q", args={}),
        CronSpec(name="good", schedule="* * * * * *", task="demo.noop", queue="q"),
    ]
    scheduler = CronScheduler(store, service.dl, specs)
    await scheduler.tick()  # both start from now
    await conn.execute("UPDATE dl_cron SET last_slot = last_slot - interval '2 seconds'")
    with pytest.raises(CronSchedulesFailed, match="schedule 'bad': InvalidJobArgs") as failed:
        await scheduler.tick()
    assert sorted(failed.value.failed) == ["bad"]
    assert len(await _cron_jobs(conn, "good")) == 1
    assert await _cron_jobs(conn, "bad") == []


async def test_missed_slots_are_skipped_unless_the_schedule_catches_up(
    store: MaintenanceStore, start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False)
    specs = [
        CronSpec(name="skip", schedule="* * * * *", task="demo.noop", queue="q"),
        CronSpec(name="catch", schedule="* * * * *", task="demo.noop", queue="q", catch_up=True),
    ]
    scheduler = CronScheduler(store, service.dl, specs)
    await scheduler.tick()
    shifted = await conn.fetchval(
        "UPDATE dl_cron SET last_slot = last_slot - interval '10 minutes'"
        " RETURNING date_trunc('minute', last_slot)"
    )
    await scheduler.tick()
    assert len(await _cron_jobs(conn, "skip")) == 1
    caught_up = [job["available_at"] for job in await _cron_jobs(conn, "catch")]
    # every minute since: 10, or 11 if a minute began between the two ticks
    assert len(caught_up) in (10, 11)
    assert caught_up == [shifted + timedelta(minutes=n + 1) for n in range(len(caught_up))]
    # a changed schedule starts from now again
    changed = CronSpec(name="skip", schedule="*/2 * * * *", task="demo.noop", queue="q")
    await conn.execute("UPDATE dl_cron SET last_slot = last_slot - interval '10 minutes'")
    assert (await CronScheduler(store, service.dl, [changed]).tick())["enqueued"] == 0


async def test_the_service_runs_dl_cron_and_task_schedules_and_status_shows_them(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    @registry.task("t.every_second", queue="cron", cron="* * * * * *")
    async def every_second(ctx: JobContext[dict[str, Any]]) -> None: ...

    cron = [{"name": "also", "schedule": "* * * * * *", "task": "demo.noop", "queue": "cron"}]
    service = await start_service(
        workers=[{"queue": "cron", "concurrency": 2}], cron=json.dumps(cron)
    )

    async def both_ran() -> bool:
        rows = await conn.fetch(
            "SELECT DISTINCT task FROM dl_jobs WHERE producer = 'cron' AND status = 'succeeded'"
        )
        return {r["task"] for r in rows} == {"t.every_second", "demo.noop"}

    await wait_until(both_ran, what="a job of each schedule run")
    body = (await service.client.get("/status")).json()
    maintenance = body["maintenance"]
    assert maintenance["this_process_leads"] is True
    assert maintenance["leader"]["holder"] == service.manager.worker_id
    assert maintenance["leader"]["valid"] is True
    assert {"reaper", "pruner", "cron"} <= set(maintenance["runs"])
    assert all(run["ok"] for run in maintenance["runs"].values())
    assert sorted(c["name"] for c in maintenance["cron"]) == ["also", "t.every_second"]
    assert not [w for w in body["warnings"] if "maintenance" in w]


async def test_status_warns_when_nobody_leads_or_a_run_failed(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False)
    await conn.execute(
        "INSERT INTO dl_workers (worker_id, host, pid, version, queues, period_sec)"
        " VALUES ('elsewhere', 'h', 1, '0', '{\"q\": 1}', 60)"
    )
    await conn.execute(
        "INSERT INTO dl_maintenance_runs (task, holder, started_at, ok, error)"
        " VALUES ('pruner', 'elsewhere', now(), false, 'DiskFull()')"
    )
    warnings = (await service.client.get("/status")).json()["warnings"]
    assert "the last pruner run failed: DiskFull()" in warnings
    assert any(w.startswith("no process leads maintenance") for w in warnings)


async def test_the_reaper_runs_in_the_leader_only(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    # a lease no late renewal loses on a slow machine: the lead must not change during the test
    first = await start_service(leader_lease_sec=30)
    second = await start_service(leader_lease_sec=30)

    async def one_leads() -> bool:
        return leads(first) != leads(second)

    await wait_until(one_leads, what="one leader")
    leader = first if leads(first) else second
    holders = await conn.fetch("SELECT DISTINCT holder FROM dl_maintenance_runs")
    assert {row["holder"] for row in holders} <= {leader.manager.worker_id}
    expired = await _job(conn, "running", None, queue="default")
    await conn.execute(
        "UPDATE dl_jobs SET lease_expires_at = now() - interval '1 second', max_attempts = 1"
        " WHERE job_id = $1",
        expired,
    )

    async def reaped() -> bool:
        status = await conn.fetchval("SELECT status::text FROM dl_jobs WHERE job_id = $1", expired)
        return status == JobStatus.LOST.value

    await wait_until(reaped, what="the expired job reaped")
    by = await conn.fetchval(
        "SELECT payload->>'reaper' FROM dl_job_events WHERE job_id = $1 AND kind = 'lost'",
        expired,
    )
    assert by == leader.manager.worker_id


async def test_cron_enqueues_every_slot_once_across_replicas_and_a_leader_kill(
    launcher: Launcher, db_dsn: str, conn: asyncpg.Connection
) -> None:
    """Two service processes; the one that leads is killed outright: the other takes the lease
    over once it expires, catches up the slots missed meanwhile, and no slot gets two jobs."""
    cron = [
        {
            "name": "beat",
            "schedule": "* * * * * *",
            "task": "demo.noop",
            "queue": "default",
            "catch_up": True,
        }
    ]
    processes = [launcher.start(db_dsn, DL_CRON=json.dumps(cron)) for _ in range(2)]
    for process in processes:
        await process.wait_healthy()

    async def leader() -> ServiceProcess | None:
        leading = [
            p
            for p in processes
            if p.proc.poll() is None
            and (await p.client.get("/status")).json()["maintenance"]["this_process_leads"]
        ]
        return leading[0] if len(leading) == 1 else None

    async def jobs_at_least(n: int) -> list[asyncpg.Record] | None:
        rows = await _cron_jobs(conn, "beat")
        return rows if len(rows) >= n else None

    first_leader = await wait_until(leader, what="one process leading")
    before = await wait_until(lambda: jobs_at_least(3), what="three slots enqueued")
    first_leader.kill()
    await first_leader.wait()
    second_leader = await wait_until(leader, timeout=30, what="the other process leading")
    assert second_leader is not first_leader
    rows = await wait_until(
        lambda: jobs_at_least(len(before) + 5), timeout=30, what="more slots enqueued"
    )
    slots = [row["available_at"] for row in rows]
    assert len(set(slots)) == len(slots)
    span = (slots[-1] - slots[0]).total_seconds()
    assert len(slots) == span + 1  # every second from the first to the last, none missed
