"""Batch handlers through the real worker: a slot takes up to `batch_size` jobs per call,
each settlement is written on its own, fenced on its job's claim, as soon as it is made, and
what the handler leaves open is decided when it ends."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from dataloader import Batch, JobStatus
from dataloader.storage.protocol import WorkerProtocol
from dataloader.tasks import TaskRegistry

from .conftest import Service, StartService
from .helpers import ADVISORY_LOCKS, wait_until

QUEUE = "batches"
ONE_SLOT = [{"queue": QUEUE, "concurrency": 1}]


class Item(BaseModel):
    n: int
    do: str = "done"


async def enqueue(service: Service, task: str, args: list[dict[str, Any]]) -> list[uuid.UUID]:
    jobs = [
        service.dl.job(task, a, lock_key=f"k{i}", queue=QUEUE, max_attempts=2)
        for i, a in enumerate(args)
    ]
    return [r.job_id for r in await service.dl.enqueue_many(jobs)]


async def statuses(conn: asyncpg.Connection, job_ids: list[uuid.UUID]) -> list[str]:
    rows = await conn.fetch(
        "SELECT job_id, status::text FROM dl_jobs WHERE job_id = ANY($1::uuid[])", job_ids
    )
    by_id = {r["job_id"]: r["status"] for r in rows}
    return [by_id[j] for j in job_ids]


async def test_a_slot_takes_up_to_batch_size_jobs_per_call(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    sizes: list[int] = []

    @registry.task("b.double", queue=QUEUE, args=Item, batch_size=10)
    async def double(batch: Batch[Item]) -> None:
        sizes.append(len(batch))
        for item in batch:
            batch.done(item, {"twice": item.args.n * 2})

    producer = await start_service(run_workers=False)
    job_ids = await enqueue(producer, "b.double", [{"n": n} for n in range(25)])
    service = await start_service(workers=ONE_SLOT)
    states = [await service.dl.wait(j, timeout=30) for j in job_ids]
    assert sizes == [10, 10, 5]
    assert [s.status for s in states] == [JobStatus.SUCCEEDED] * 25
    assert [s.result for s in states] == [{"twice": n * 2} for n in range(25)]
    assert {s.attempt for s in states} == {1}


async def test_each_job_ends_as_its_settlement_says(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    @registry.task("b.mixed", queue=QUEUE, args=Item, batch_size=10)
    async def mixed(batch: Batch[Item]) -> None:
        for item in batch:
            if item.attempt > 1:
                batch.done(item, "second time")
            elif item.args.do == "retry":
                batch.retry(item, after=3600, error="come back in an hour")
            elif item.args.do == "fail":
                batch.fail(item, "refused")
            elif item.args.do == "done":
                batch.done(item)

    producer = await start_service(run_workers=False)
    done, retry, fail, leave = await enqueue(
        producer,
        "b.mixed",
        [{"n": 1}, {"n": 2, "do": "retry"}, {"n": 3, "do": "fail"}, {"n": 4, "do": "leave"}],
    )
    service = await start_service(workers=ONE_SLOT)
    assert (await service.dl.wait(done, timeout=30)).status == JobStatus.SUCCEEDED
    failed = await service.dl.wait(fail, timeout=30)
    assert (failed.status, failed.error) == (JobStatus.FAILED, "refused")
    # left open: retried by the retry policy (no delay in these tests), then done
    again = await service.dl.wait(leave, timeout=30)
    assert (again.status, again.attempt, again.result) == (JobStatus.SUCCEEDED, 2, "second time")
    later = await service.dl.get(retry)
    assert later is not None
    assert later.status == JobStatus.QUEUED
    assert later.error == "come back in an hour"
    delay = await conn.fetchval(
        "SELECT EXTRACT(EPOCH FROM available_at - now())::float8 FROM dl_jobs WHERE job_id = $1",
        retry,
    )
    assert 3500 < delay <= 3600
    unsettled = await conn.fetchval(
        "SELECT count(*) FROM dl_job_events WHERE job_id = $1 AND kind = 'requeue'"
        " AND payload->>'error' = 'left unsettled by the batch handler'",
        leave,
    )
    assert unsettled == 1


async def test_a_settlement_is_written_while_the_handler_still_runs(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    gate = asyncio.Event()

    @registry.task("b.early", queue=QUEUE, batch_size=10)
    async def early(batch: Batch[dict[str, Any]]) -> None:
        first, second = sorted(batch, key=lambda item: item.args["n"])
        batch.done(first)
        await gate.wait()
        batch.done(second)

    producer = await start_service(run_workers=False)
    first, second = await enqueue(producer, "b.early", [{"n": 1}, {"n": 2}])
    service = await start_service(workers=ONE_SLOT)
    assert (await service.dl.wait(first, timeout=30)).status == JobStatus.SUCCEEDED
    assert await statuses(conn, [second]) == ["running"]
    gate.set()
    assert (await service.dl.wait(second, timeout=30)).status == JobStatus.SUCCEEDED


async def test_a_settlement_of_a_job_no_longer_ours_is_not_written(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """Another run took one job of the batch meanwhile (its claim token is not ours): that
    job's settlement is fenced out, the others are written."""
    gate = asyncio.Event()

    @registry.task("b.fenced", queue=QUEUE, batch_size=10)
    async def fenced(batch: Batch[dict[str, Any]]) -> None:
        await gate.wait()
        for item in batch:
            batch.done(item)

    producer = await start_service(run_workers=False)
    taken, ours = await enqueue(producer, "b.fenced", [{}, {}])
    service = await start_service(workers=ONE_SLOT, heartbeat_sec=60)
    await wait_until(lambda: _all_running(conn, [taken, ours]))
    stranger = uuid.uuid4()
    await conn.execute("UPDATE dl_jobs SET claim_token = $2 WHERE job_id = $1", taken, stranger)
    gate.set()
    assert (await service.dl.wait(ours, timeout=30)).status == JobStatus.SUCCEEDED
    await service.manager.completer.wait_flushed()
    row = await conn.fetchrow(
        "SELECT status::text, claim_token FROM dl_jobs WHERE job_id = $1", taken
    )
    assert (row["status"], row["claim_token"]) == ("running", stranger)


async def _all_running(conn: asyncpg.Connection, job_ids: list[uuid.UUID]) -> bool:
    return set(await statuses(conn, job_ids)) == {"running"}


async def test_a_stop_hands_the_open_jobs_back_and_keeps_the_settled(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    @registry.task("b.stuck", queue=QUEUE, batch_size=10)
    async def stuck(batch: Batch[dict[str, Any]]) -> None:
        batch.done(next(item for item in batch if item.args["first"]))
        await asyncio.sleep(3600)

    producer = await start_service(run_workers=False)
    settled, *open_ = await enqueue(
        producer, "b.stuck", [{"first": True}, {"first": False}, {"first": False}]
    )
    service = await start_service(workers=ONE_SLOT)
    assert (await service.dl.wait(settled, timeout=30)).status == JobStatus.SUCCEEDED
    await service.manager.stop(timeout=0.2)
    await assert_handed_back(conn, open_)


async def assert_handed_back(conn: asyncpg.Connection, job_ids: list[uuid.UUID]) -> None:
    """The jobs are queued again with their attempts refunded, and no lock is left behind."""
    rows = await conn.fetch(
        "SELECT status::text, attempt FROM dl_jobs WHERE job_id = ANY($1::uuid[])", job_ids
    )
    assert [(r["status"], r["attempt"]) for r in rows] == [("queued", 0)] * len(job_ids)
    assert await conn.fetchval(ADVISORY_LOCKS) == 0


async def test_jobs_whose_args_break_the_model_fail_without_the_handler(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    seen: list[int] = []

    @registry.task("b.typed", queue=QUEUE, args=Item, batch_size=10)
    async def typed(batch: Batch[Item]) -> None:
        for item in batch:
            seen.append(item.args.n)
            batch.done(item)

    producer = await start_service(run_workers=False)
    (good,) = await enqueue(producer, "b.typed", [{"n": 7}])
    bad = await conn.fetchval(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, args) VALUES"
        " (gen_random_uuid(), $1, 'b.typed', 'other', '{\"n\": \"seven\"}') RETURNING job_id",
        QUEUE,
    )
    service = await start_service(workers=ONE_SLOT)
    assert (await service.dl.wait(good, timeout=30)).status == JobStatus.SUCCEEDED
    refused = await service.dl.wait(bad, timeout=30)
    assert refused.status == JobStatus.FAILED
    assert refused.error is not None
    assert refused.error.startswith("invalid args: args.n")
    assert seen == [7]


async def test_a_queue_mixing_batched_and_single_tasks_keeps_its_slots(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """One slot: a claim sized for a batch may bring single jobs too; never more than one
    call runs at a time, and every job ends done."""
    running = 0
    most = 0

    async def occupy() -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0)
        running -= 1

    @registry.task("b.many", queue=QUEUE, batch_size=5)
    async def many(batch: Batch[dict[str, Any]]) -> None:
        await occupy()
        for item in batch:
            batch.done(item)

    @registry.task("b.one", queue=QUEUE)
    async def one(ctx: Any) -> None:
        await occupy()

    producer = await start_service(run_workers=False)
    jobs = [
        producer.dl.job("b.one" if i % 3 == 0 else "b.many", {}, lock_key=f"k{i}", queue=QUEUE)
        for i in range(30)
    ]
    job_ids = [r.job_id for r in await producer.dl.enqueue_many(jobs)]
    service = await start_service(workers=ONE_SLOT)
    states = [await service.dl.wait(j, timeout=60) for j in job_ids]
    assert {s.status for s in states} == {JobStatus.SUCCEEDED}
    assert most == 1


async def test_a_mixed_queue_claims_only_the_jobs_its_free_slots_start(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """One slot, a batched task beside a one-job task, one attempt each: every job is claimed
    once and runs; none is claimed only to go back to the queue for want of a slot (a claim
    sized for a batch used to bring single jobs the slot could not start, and their hand-backs
    ended jobs `lost` that never ran)."""

    @registry.task("b.many", queue=QUEUE, batch_size=5)
    async def many(batch: Batch[dict[str, Any]]) -> None:
        for item in batch:
            batch.done(item)

    @registry.task("b.one", queue=QUEUE)
    async def one(ctx: Any) -> None:
        pass

    producer = await start_service(run_workers=False)
    jobs = [
        producer.dl.job(
            "b.one" if i % 3 == 0 else "b.many", {}, lock_key=f"k{i}", queue=QUEUE, max_attempts=1
        )
        for i in range(30)
    ]
    job_ids = [r.job_id for r in await producer.dl.enqueue_many(jobs)]
    service = await start_service(workers=ONE_SLOT)
    states = [await service.dl.wait(j, timeout=60) for j in job_ids]
    assert [s.status for s in states] == [JobStatus.SUCCEEDED] * 30
    journal = await conn.fetch(
        "SELECT kind, count(*) AS n FROM dl_job_events WHERE job_id = ANY($1::uuid[])"
        " AND kind IN ('picked', 'requeue', 'backoff', 'lost') GROUP BY kind",
        job_ids,
    )
    assert {r["kind"]: r["n"] for r in journal} == {"picked": 30}


@pytest.mark.parametrize("limits", [{}, {"max_running": 100}], ids=["free", "limited"])
async def test_a_claim_takes_the_jobs_that_fill_its_slots_and_no_more(
    start_service: StartService, registry: TaskRegistry, limits: dict[str, int]
) -> None:
    """A one-job task's job fills a slot; up to `batch_size` jobs of a batched task fill one
    together, in claim order."""
    service = await start_service(run_workers=False)
    order = ["b.one", "b.many", "b.many", "b.one", "b.many", "b.many", "b.many", "b.one"]
    for priority, task in enumerate(order):
        await service.dl.enqueue(task, queue=QUEUE, lock_key=f"k{priority}", priority=priority)
    if limits:
        await service.dl.set_limits(QUEUE, **limits)
    protocol = WorkerProtocol(service.context.pool)

    async def claim(slots: int) -> list[str]:
        round_ = await protocol.claim_round(
            QUEUE, 30, "hand", walk=30, slots=slots, batch_sizes={"b.many": 3}
        )
        return [job.task for job in round_.jobs]

    assert await claim(2) == ["b.one", "b.many", "b.many"]  # the next b.one needs a third
    assert await claim(2) == ["b.one", "b.many", "b.many", "b.many"]
    assert await claim(2) == ["b.one"]


async def test_batches_are_counted_in_the_metrics(
    start_service: StartService, registry: TaskRegistry
) -> None:
    @registry.task("b.counted", queue=QUEUE, batch_size=4)
    async def counted(batch: Batch[dict[str, Any]]) -> None:
        for item in batch:
            if item.attempt > 1:
                batch.fail(item, "still open")
            elif item.args["do"] == "done":
                batch.done(item)
            elif item.args["do"] == "later":
                batch.retry(item, after=3600, error="later")

    producer = await start_service(run_workers=False)
    before = await scrape(producer.client)
    jobs = await enqueue(producer, "b.counted", [{"do": "done"}, {"do": "later"}, {"do": "-"}])
    service = await start_service(workers=ONE_SLOT)
    await service.dl.wait(jobs[0], timeout=30)
    assert (await service.dl.wait(jobs[2], timeout=30)).error == "still open"
    after = await scrape(service.client)
    labels = {"queue": QUEUE, "task": "b.counted"}

    def grew(name: str, **extra: str) -> float:
        key = (name, tuple(sorted((labels | extra).items())))
        return after.get(key, 0) - before.get(key, 0)

    assert grew("queue_handler_processed_total") == 1
    assert grew("queue_handler_retried_total") == 2  # `later`, and the one left open
    assert grew("queue_handler_errors_total") == 3  # the same, and `still open`
    assert grew("queue_handler_duration_seconds_count") == 2
    cycles = ("queue_job_processor_cycle_duration_seconds_count", (("queue", QUEUE),))
    assert after[cycles] - before.get(cycles, 0) >= 1
    assert after[("queue_running_workers", ())] >= 1
    assert after[("queue_running_job_processors", ())] >= 1


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of `/metrics`, by name and labels."""
    response = await client.get("/metrics")
    assert response.status_code == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
