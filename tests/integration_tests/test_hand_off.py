"""Hand-offs: a worker that ends a job keeps a free slot for the next job of its lock_key, and
the write of the end claims that job for it (HAND_OFF_NEXT). A serial chain
runs job after job without a claim between them, in order, one at a time, and no slot is ever
promised twice."""

from __future__ import annotations

from typing import Any

import asyncpg

from dataloader import NewJob
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext

from .conftest import StartService
from .helpers import wait_until


class Ledger:
    """What the recording task saw: the order jobs ran in, and how many ran at once."""

    def __init__(self) -> None:
        self.order: list[int] = []
        self.running: dict[str, int] = {}
        self.most_at_once: dict[str, int] = {}
        self.most_at_once_in_all = 0

    def register(self, registry: TaskRegistry) -> None:
        @registry.register("t.recorded")
        async def recorded(ctx: JobContext[dict[str, Any]]) -> None:
            group = ctx.args["group"]
            self.running[group] = self.running.get(group, 0) + 1
            self.most_at_once[group] = max(self.most_at_once.get(group, 0), self.running[group])
            in_all = sum(self.running.values())
            self.most_at_once_in_all = max(self.most_at_once_in_all, in_all)
            self.order.append(ctx.args["i"])
            await ctx.set_progress({"done": 1, "total": 1})  # a round trip: others may start
            self.running[group] -= 1


def jobs_of(key: str | None, numbers: range) -> list[NewJob]:
    """Jobs numbered `numbers`, of one lock_key (a chain), or each of its own (key None)."""
    return [
        NewJob(
            queue="default",
            task="t.recorded",
            lock_key=key or f"free-{i}",
            args={"i": i, "group": key or "free"},
        )
        for i in numbers
    ]


async def test_a_serial_chain_is_handed_from_job_to_job_without_claims(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    ledger = Ledger()
    ledger.register(registry)
    service = await start_service()
    worker = service.manager.queues["default"]
    claims_before = worker.claims_answered
    jobs = await service.dl.enqueue_many(jobs_of("chain", range(20)))
    for job in jobs:
        assert (await service.dl.wait(job.job_id, timeout=30)).status == "succeeded"
    assert ledger.order == list(range(20))
    assert ledger.most_at_once == {"chain": 1}
    # one claim for the first job (and a few that found nothing), not one per job
    assert worker.claims_answered - claims_before < 10
    workers = await conn.fetch(
        "SELECT DISTINCT payload->>'worker' AS worker FROM dl_job_events WHERE kind = 'picked'"
    )
    assert [r["worker"] for r in workers] == [service.manager.worker_id]


async def test_slots_kept_for_hand_offs_never_exceed_the_concurrency(
    start_service: StartService, registry: TaskRegistry
) -> None:
    """Two chains and independent jobs on a worker with two slots: a slot kept for a chain's
    next job is not also given to a claim, so at most two jobs run at any time."""
    ledger = Ledger()
    ledger.register(registry)
    service = await start_service(workers=[{"queue": "default", "concurrency": 2}])
    jobs = jobs_of("chain-a", range(10)) + jobs_of("chain-b", range(10, 20))
    jobs += jobs_of(None, range(20, 30))
    enqueued = await service.dl.enqueue_many(jobs)
    for job in enqueued:
        assert (await service.dl.wait(job.job_id, timeout=30)).status == "succeeded"
    assert sorted(ledger.order) == list(range(30))
    assert ledger.most_at_once_in_all <= 2
    assert ledger.most_at_once["chain-a"] == ledger.most_at_once["chain-b"] == 1
    # each chain ran in its order
    assert [i for i in ledger.order if i < 10] == list(range(10))
    assert [i for i in ledger.order if 10 <= i < 20] == list(range(10, 20))


async def test_a_stopping_worker_keeps_no_slot(start_service: StartService) -> None:
    """Once a process stops claiming, an outcome's write hands it nothing: a job handed then
    would start after the stop has counted the jobs it waits for."""
    service = await start_service()
    manager = service.manager

    async def kept() -> bool:  # once no claim in flight holds the free slots
        return manager.keep_slot("default")

    await wait_until(kept, what="a slot kept while the worker claims")
    manager.release_slot("default")
    assert not manager.keep_slot("not-served")
    await manager.stop(timeout=5)
    assert not manager.keep_slot("default")


async def test_a_chain_enqueued_in_one_call_runs_in_its_order_after_its_rows_moved(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """The jobs of one call share their created_at; a parking or a put back writes a row anew,
    elsewhere in the table. Rewritten last to first (so that the table's order is theirs
    reversed), a chain still runs in the order it was given, claimed and handed on by id."""
    ledger = Ledger()
    ledger.register(registry)
    service = await start_service(workers=[{"queue": "default", "concurrency": 4}])
    await service.dl.pause("default")
    jobs = await service.dl.enqueue_many(jobs_of("chain", range(20)))
    for job in reversed(jobs):  # a change of `parked` is never a HOT update: a new place
        await conn.execute("UPDATE dl_jobs SET parked = 'lock_key' WHERE job_id = $1", job.job_id)
        await conn.execute("UPDATE dl_jobs SET parked = NULL WHERE job_id = $1", job.job_id)
    places = await conn.fetch("SELECT job_id FROM dl_jobs WHERE lock_key = 'chain' ORDER BY ctid")
    assert [r["job_id"] for r in places] == [job.job_id for job in reversed(jobs)]
    await service.dl.resume("default")
    for job in jobs:
        assert (await service.dl.wait(job.job_id, timeout=30)).status == "succeeded"
    assert ledger.order == list(range(20))
    assert ledger.most_at_once == {"chain": 1}
