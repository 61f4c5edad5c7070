"""Every text field at its accepted limit, in incompressible 4-byte characters, lives a job's
whole life on a queue with limits: trigger (HTTP and library), claim, run, the next job of the
same lock_key, the limits, a stage, a schedule, a retry of a failure and a retry by hand, lists
filtered by each field, pruning; and then an ordinary job of the queue still runs. An index
that holds such a value as it is fails one of these writes, or every later claim of the queue
(see test_index_bounds.py for the rule itself)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import asyncpg
import pytest

from dataloader import JobStatus, NonRetryableError
from dataloader.config import CronSpec
from dataloader.core import limits
from dataloader.maintenance.cron import CronScheduler
from dataloader.maintenance.pruner import Pruner, Retention
from dataloader.storage.connections import GuardedPool
from dataloader.storage.maintenance import MaintenanceStore
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext

from .conftest import StartService
from .helpers import wait_until
from .v1_api.constants import TRIGGER_URL
from .v1_api.test_limits import four_byte_text

QUEUE = four_byte_text(limits.NAME_MAX_CHARS, seed=101)
TASK = four_byte_text(limits.NAME_MAX_CHARS, seed=102)
STAGE = four_byte_text(limits.NAME_MAX_CHARS, seed=103)
PRODUCER = four_byte_text(limits.NAME_MAX_CHARS, seed=104)
CONSUMER_GROUP = four_byte_text(limits.NAME_MAX_CHARS, seed=105)
SCHEDULE = four_byte_text(limits.NAME_MAX_CHARS, seed=106)
LOCK_KEY = four_byte_text(limits.KEY_MAX_CHARS, seed=107)
PARTITION_KEY = four_byte_text(limits.KEY_MAX_CHARS, seed=108)


#: A value searched for in args, as long as a search of args takes (the JSON around it aside).
ARGS_VALUE = four_byte_text(limits.ARGS_FILTER_MAX_BYTES // 4 - 10, seed=109)
#: Args far larger than any index entry: the args index holds hashes of them.
LARGE_ARGS = {"blob": four_byte_text(250_000, seed=110), "k": ARGS_VALUE}


def idempotency_key(n: int) -> str:
    return four_byte_text(limits.IDEMPOTENCY_KEY_MAX_CHARS, seed=200 + n)


#: Each field's value and the byte bound of `dataloader.core.limits` it reaches.
AT_THE_LIMIT = {
    "queue": (QUEUE, limits.NAME_MAX_BYTES),
    "task": (TASK, limits.NAME_MAX_BYTES),
    "stage task": (STAGE, limits.NAME_MAX_BYTES),
    "producer": (PRODUCER, limits.NAME_MAX_BYTES),
    "consumer_group": (CONSUMER_GROUP, limits.NAME_MAX_BYTES),
    "schedule name": (SCHEDULE, limits.NAME_MAX_BYTES),
    "lock_key": (LOCK_KEY, limits.KEY_MAX_BYTES),
    "partition_key": (PARTITION_KEY, limits.KEY_MAX_BYTES),
    "idempotency_key": (idempotency_key(0), limits.IDEMPOTENCY_KEY_MAX_BYTES),
}


class Ledger:
    """Which job's handler ran when (this process's clock), to show the runs never overlapped."""

    def __init__(self) -> None:
        self.spans: list[tuple[uuid.UUID, float, float]] = []

    def overlapping(self) -> int:
        spans = sorted((start, end) for _, start, end in self.spans)
        return sum(1 for (_, end), (start, _) in itertools.pairwise(spans) if start < end)


def register(registry: TaskRegistry, ledger: Ledger) -> None:
    """TASK fails its first run when asked: retried at once ("once"), or for good ("for
    good"); its success enqueues STAGE."""
    ran: set[uuid.UUID] = set()

    @registry.task(TASK, queue=QUEUE, then=STAGE)
    async def work(ctx: JobContext[dict[str, Any]]) -> dict[str, Any]:
        started = time.monotonic()
        first_run = ctx.job.job_id not in ran
        ran.add(ctx.job.job_id)
        try:
            await asyncio.sleep(0.01)
            if ctx.args.get("fail") == "once" and first_run:
                raise RuntimeError("the first run fails")
            if ctx.args.get("fail") == "for good" and first_run:
                raise NonRetryableError("no attempt left")
            return {"after": str(ctx.job.job_id)}
        finally:
            ledger.spans.append((ctx.job.job_id, started, time.monotonic()))

    @registry.task(STAGE, queue=QUEUE)
    async def stage(ctx: JobContext[dict[str, Any]]) -> None:
        started = time.monotonic()
        await asyncio.sleep(0.01)
        ledger.spans.append((ctx.job.job_id, started, time.monotonic()))


@pytest.fixture
async def store(db_dsn: str) -> AsyncIterator[MaintenanceStore]:
    pool = await asyncpg.create_pool(db_dsn, min_size=1, max_size=2)
    yield MaintenanceStore(GuardedPool(pool, 10))
    await pool.close()


def test_each_value_takes_its_fields_whole_byte_budget() -> None:
    for field, (value, budget) in AT_THE_LIMIT.items():
        assert len(value.encode()) == budget, field
        assert all(ord(c) >= 0x10000 for c in value), field  # 4 bytes each


async def test_every_text_field_at_its_limit_lives_a_whole_job_life(
    start_service: StartService,
    registry: TaskRegistry,
    store: MaintenanceStore,
    conn: asyncpg.Connection,
) -> None:
    ledger = Ledger()
    register(registry, ledger)
    service = await start_service(workers=[{"queue": QUEUE, "concurrency": 4}])
    await service.dl.set_limits(
        QUEUE, max_running=2, max_running_per_partition=1, max_per_second=50
    )
    fields = {
        "queue": QUEUE,
        "lock_key": LOCK_KEY,
        "partition_key": PARTITION_KEY,
        "producer": PRODUCER,
        "consumer_group": CONSUMER_GROUP,
    }

    # trigger: over HTTP (twice: the idempotency key names the same job), and from the library
    body = {"task": TASK, "idempotency_key": idempotency_key(0), "args": {"fail": "once"}}
    first = await service.client.post(TRIGGER_URL, json=fields | body)
    again = await service.client.post(TRIGGER_URL, json=fields | body)
    assert first.status_code == again.status_code == 200, first.text
    retried = uuid.UUID(first.json()["job_id"])
    assert again.json()["job_id"] == str(retried)
    failing = (
        await service.dl.enqueue(
            TASK,
            {"fail": "for good"},
            idempotency_key=idempotency_key(1),
            max_attempts=1,
            **fields,
        )
    ).job_id
    plain = (
        await service.dl.enqueue(TASK, LARGE_ARGS, idempotency_key=idempotency_key(2), **fields)
    ).job_id

    # a schedule at its limits enqueues its slot's job
    cron = CronScheduler(
        store,
        service.dl,
        [
            CronSpec(
                name=SCHEDULE, schedule="* * * * * *", task=TASK, queue=QUEUE, lock_key=LOCK_KEY
            )
        ],
    )
    await cron.tick()  # starts from now
    await conn.execute("UPDATE dl_cron SET last_slot = last_slot - interval '1 second'")
    assert (await cron.tick())["enqueued"] == 1
    scheduled = await conn.fetchval("SELECT job_id FROM dl_jobs WHERE producer = 'cron'")

    # claim, run, the next job of the key, a retry of a failure; a stage after each success
    assert (await service.dl.wait(retried, timeout=60)).status == JobStatus.SUCCEEDED
    assert (await service.dl.wait(failing, timeout=60)).status == JobStatus.FAILED
    for job_id in (plain, scheduled):
        assert (await service.dl.wait(job_id, timeout=60)).status == JobStatus.SUCCEEDED
    assert (await service.dl.get(retried)).attempt == 2  # type: ignore[union-attr]

    # a retry by hand, chosen by the filters at their limits
    response = await service.client.post(
        "/api/v1/jobs/retry",
        json={"partition_key": PARTITION_KEY, "lock_key": LOCK_KEY, "status": "failed"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["changed"] == [str(failing)]
    assert (await service.dl.wait(failing, timeout=60)).status == JobStatus.SUCCEEDED

    # each success enqueued its stage, on the same lock_key and partition_key
    async def stages() -> list[uuid.UUID]:
        page = await service.dl.list(task=STAGE, status="succeeded")
        return [job.job_id for job in page.jobs]

    await wait_until(lambda: _have(stages(), 4), timeout=60, what="the 4 stages to run")
    ours = {retried, failing, plain, scheduled, *await stages()}
    assert len(ledger.spans) == 10  # 2 runs, 2 runs, 1, 1, and the 4 stages
    assert ledger.overlapping() == 0  # one lock_key, one partition: one at a time

    # every field stored whole
    rows = await conn.fetch(
        "SELECT queue, lock_key, partition_key, producer, consumer_group FROM dl_jobs"
        " WHERE job_id = ANY($1::uuid[])",
        [retried, failing, plain],
    )
    assert {tuple(r) for r in rows} == {tuple(fields.values())}

    # listed and filtered by each field, over HTTP and from the library (the schedule's job
    # and its stage have no partition_key)
    for name, value in [
        ("queue", QUEUE),
        ("task", TASK),
        ("task", STAGE),
        ("lock_key", LOCK_KEY),
        ("partition_key", PARTITION_KEY),
    ]:
        expected = {
            r["job_id"]
            for r in await conn.fetch(f"SELECT job_id FROM dl_jobs WHERE {name} = $1", value)
        }
        assert len(expected) >= 4, name
        response = await service.client.get("/api/v1/jobs", params={name: value, "limit": 100})
        assert response.status_code == 200, response.text
        assert {uuid.UUID(j["job_id"]) for j in response.json()["jobs"]} == expected, name
        page = await service.dl.list(**{name: value})
        assert {job.job_id for job in page.jobs} == expected, name
    # found by its args, from the args index, over HTTP and from the library
    by_args = {"k": ARGS_VALUE}
    assert len(limits.args_json(by_args).encode()) > limits.ARGS_FILTER_MAX_BYTES - 50
    as_text = json.dumps(by_args, ensure_ascii=False)
    response = await service.client.get("/api/v1/jobs", params={"args": as_text})
    assert response.status_code == 200, response.text
    assert [j["job_id"] for j in response.json()["jobs"]] == [str(plain)]
    assert [job.job_id for job in (await service.dl.list(args=by_args)).jobs] == [plain]
    stats = (await service.dl.stats(QUEUE))[QUEUE]
    assert (stats.ready, stats.running) == (0, 0)

    # pruned, once finished
    everything = Retention(
        succeeded_sec=0.001,
        canceled_sec=0.001,
        failed_sec=0.001,
        lost_sec=0.001,
        heartbeats_sec=0.001,
    )
    await asyncio.sleep(0.01)
    assert (await Pruner(store, everything, batch_size=3).prune())["succeeded"] == len(ours)
    assert (await service.dl.list(queue=QUEUE)).jobs == []

    # and the queue still runs the next ordinary job
    following = await service.dl.enqueue(TASK, {}, queue=QUEUE, lock_key="ordinary")
    assert (await service.dl.wait(following.job_id, timeout=60)).status == JobStatus.SUCCEEDED


async def _have(listed: Awaitable[list[uuid.UUID]], count: int) -> bool:
    return len(await listed) >= count
