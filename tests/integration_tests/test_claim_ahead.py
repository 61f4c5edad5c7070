"""Claiming ahead: while its jobs run shorter than a claim takes, a worker claims more jobs
than it has free slots (`workers.claims.ClaimPace`). They start as slots free, never more at
once than the slots; when the worker stops, or no slot frees in time, they go back to the
queue as jobs that never started (a `backoff`, attempt refunded, no hand-back counted)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from dataloader import NewJob
from dataloader.tasks import TaskRegistry
from dataloader.workers import base
from dataloader.workers.base import QueueWorker
from dataloader.workers.job_context import JobContext

from .conftest import StartService
from .helpers import ADVISORY_LOCKS, event_payloads, wait_until

QUEUE = "default"


class Slots:
    """Tasks that show how many jobs run at once: `t.quick` (no I/O) and `t.blocker`, which
    runs until the test releases it."""

    def __init__(self, registry: TaskRegistry) -> None:
        self.running = 0
        self.most_at_once = 0
        self.ran: list[int] = []
        self.blocker_started = asyncio.Event()
        self.release = asyncio.Event()

        @registry.register("t.quick")
        async def quick(ctx: JobContext[dict[str, Any]]) -> None:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            await asyncio.sleep(0)  # another job could start here, if it had a slot
            self.ran.append(ctx.args["i"])
            self.running -= 1

        @registry.register("t.blocker")
        async def blocker(ctx: JobContext[dict[str, Any]]) -> None:
            self.blocker_started.set()
            await self.release.wait()


def quick_jobs(numbers: range) -> list[NewJob]:
    return [NewJob(queue=QUEUE, task="t.quick", args={"i": i}) for i in numbers]


def claimed_ahead_metric() -> float:
    return REGISTRY.get_sample_value("dataloader_jobs_claimed_ahead_total", {"queue": QUEUE}) or 0


def started_metric(task: str) -> float:
    labels = {"queue": QUEUE, "task": task}
    return REGISTRY.get_sample_value("dataloader_jobs_started_total", labels) or 0


async def given_back(conn: asyncpg.Connection, jobs: list[Any]) -> list[tuple[str, int, int, str]]:
    """Each job's status, attempt and hand-backs, and why it was given back (its `backoff`)."""
    found = []
    for job in jobs:
        row = await conn.fetchrow(
            "SELECT status::text, attempt, handbacks FROM dl_jobs WHERE job_id = $1", job.job_id
        )
        assert row is not None
        (backoff,) = await event_payloads(conn, str(job.job_id), "backoff")
        found.append((row["status"], row["attempt"], row["handbacks"], backoff["reason"]))
    return found


async def primed(worker: QueueWorker) -> None:
    """The worker has seen units much shorter than its claims (their real measures follow),
    and no claim decided before that is still in flight."""
    worker.pace.ran(0.0)
    worker.pace.claimed(0.05)

    async def settled() -> bool:
        return worker.claims_started == worker.claims_answered

    await wait_until(settled, what="the claim in flight answered")


async def statuses(conn: asyncpg.Connection, jobs: list[Any]) -> list[tuple[str, int]]:
    rows = await conn.fetch(
        "SELECT status::text, attempt FROM dl_jobs WHERE job_id = ANY($1::uuid[]) ORDER BY job_id",
        [job.job_id for job in jobs],
    )
    return [(r["status"], r["attempt"]) for r in rows]


async def back_in_queue(conn: asyncpg.Connection, jobs: list[Any], what: str) -> None:
    """Wait until `jobs` are all queued again, their attempts refunded."""

    async def back() -> bool:
        return await statuses(conn, jobs) == [("queued", 0)] * len(jobs)

    await wait_until(back, what=what)


async def released(slots: Slots, service: Any, jobs: list[Any]) -> None:
    """Let the blocker end, and wait for `jobs` to succeed."""
    slots.release.set()
    for job in jobs:
        assert (await service.dl.wait(job.job_id, timeout=30)).status == "succeeded"


async def test_short_jobs_are_claimed_ahead_and_run_no_more_at_once_than_the_slots(
    start_service: StartService, registry: TaskRegistry
) -> None:
    slots = Slots(registry)
    service = await start_service(workers=[{"queue": QUEUE, "concurrency": 2}])
    worker = service.manager.queues[QUEUE]
    metric_before = claimed_ahead_metric()
    jobs = await service.dl.enqueue_many(quick_jobs(range(300)))
    for job in jobs:
        assert (await service.dl.wait(job.job_id, timeout=60)).status == "succeeded"
    assert sorted(slots.ran) == list(range(300))
    assert worker.claimed_ahead > 0
    assert claimed_ahead_metric() - metric_before == worker.claimed_ahead
    assert slots.most_at_once <= 2


async def test_jobs_longer_than_a_claim_are_not_claimed_ahead(
    start_service: StartService, registry: TaskRegistry
) -> None:
    @registry.register("t.slow")
    async def slow(ctx: JobContext[dict[str, Any]]) -> None:
        await asyncio.sleep(0.2)  # the job's own work: far longer than a claim

    service = await start_service(workers=[{"queue": QUEUE, "concurrency": 2}])
    worker = service.manager.queues[QUEUE]
    jobs = await service.dl.enqueue_many([NewJob(queue=QUEUE, task="t.slow") for _ in range(6)])
    for job in jobs:
        assert (await service.dl.wait(job.job_id, timeout=30)).status == "succeeded"
    assert worker.claimed_ahead == 0


async def start_behind_a_blocker(service: Any, slots: Slots) -> tuple[Any, list[Any]]:
    """Enqueue a blocker and three quick jobs in one call, on a worker of one slot whose pace
    says claim ahead: the blocker takes the slot and the quick ones are claimed ahead."""
    worker = service.manager.queues[QUEUE]
    await primed(worker)
    blocker, *quick = await service.dl.enqueue_many(
        [NewJob(queue=QUEUE, task="t.blocker"), *quick_jobs(range(3))]
    )
    await asyncio.wait_for(slots.blocker_started.wait(), timeout=15)
    return blocker, quick


async def test_jobs_claimed_ahead_start_as_the_slot_frees(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    slots = Slots(registry)
    service = await start_service(workers=[{"queue": QUEUE, "concurrency": 1}])
    worker = service.manager.queues[QUEUE]
    blocker, quick = await start_behind_a_blocker(service, slots)
    assert worker.claimed_ahead == 3
    assert await statuses(conn, quick) == [("running", 1)] * 3
    assert slots.ran == []  # claimed, not started: the slot is the blocker's
    await released(slots, service, [blocker, *quick])
    assert slots.ran == [0, 1, 2]  # in claim order
    assert slots.most_at_once == 1


async def test_jobs_claimed_ahead_go_back_to_the_queue_when_the_worker_stops(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    slots = Slots(registry)
    service = await start_service(workers=[{"queue": QUEUE, "concurrency": 1}])
    started_before = started_metric("t.quick")
    blocker, quick = await start_behind_a_blocker(service, slots)
    stopping = asyncio.create_task(service.manager.stop(timeout=30))

    await back_in_queue(conn, quick, "the jobs claimed ahead back in the queue")
    slots.release.set()  # the job in the slot runs to its end
    await stopping
    assert await statuses(conn, [blocker]) == [("succeeded", 1)]
    assert slots.ran == []
    assert await given_back(conn, quick) == [("queued", 0, 0, "worker shutting down")] * 3
    assert started_metric("t.quick") == started_before  # claimed, never started
    assert await conn.fetchval(ADVISORY_LOCKS) == 0


async def test_jobs_claimed_ahead_go_back_when_no_slot_frees_in_time(
    start_service: StartService,
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job in the slot turned out long: the jobs claimed ahead behind it go back to the
    queue (another worker may be free), and the worker claims nothing ahead again until its
    jobs run short again."""
    monkeypatch.setattr(base, "AHEAD_MAX_WAIT_SEC", 0.3)
    slots = Slots(registry)
    service = await start_service(workers=[{"queue": QUEUE, "concurrency": 1}])
    worker = service.manager.queues[QUEUE]
    blocker, quick = await start_behind_a_blocker(service, slots)

    await back_in_queue(conn, quick, "the jobs claimed ahead back in the queue")
    why = "claimed ahead, no slot was free within 0.3s"
    assert await given_back(conn, quick) == [("queued", 0, 0, why)] * 3
    assert worker.pace.ahead(1, 0) == 0  # the wait taught it: the slot's jobs are long
    assert await statuses(conn, [blocker]) == [("running", 1)]
    await released(slots, service, [blocker, *quick])
    assert worker.claimed_ahead == 3


async def test_claiming_ahead_switched_off_claims_only_for_free_slots(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    slots = Slots(registry)
    service = await start_service(workers=[{"queue": QUEUE, "concurrency": 1}], claim_ahead=False)
    worker = service.manager.queues[QUEUE]
    blocker, quick = await start_behind_a_blocker(service, slots)
    # the claim that took the blocker has ended: it took nothing else
    assert await statuses(conn, quick) == [("queued", 0)] * 3
    assert worker.claimed_ahead == 0
    await released(slots, service, [blocker, *quick])
    assert worker.claimed_ahead == 0


async def test_jobs_claimed_ahead_take_a_slot_freed_without_a_wake_up(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """The completer keeps the only slot for a hand-off that does not come (its write failed):
    the slot comes back without any job's end to wake the worker, and the jobs claimed ahead
    meanwhile take it rather than wait to be given back."""
    slots = Slots(registry)
    service = await start_service(workers=[{"queue": QUEUE, "concurrency": 1}])
    worker = service.manager.queues[QUEUE]

    async def kept() -> bool:  # once no claim in flight holds the free slot
        return worker.keep_slot()

    await wait_until(kept, what="the only slot kept")
    await primed(worker)
    quick = await service.dl.enqueue_many(quick_jobs(range(3)))

    async def all_ahead() -> bool:
        return worker.claimed_ahead == 3

    await wait_until(all_ahead, what="three jobs claimed ahead of the kept slot")
    worker.release_slot()
    for job in quick:
        assert (await service.dl.wait(job.job_id, timeout=30)).status == "succeeded"
    assert slots.ran == [0, 1, 2]
    for job in quick:
        assert await event_payloads(conn, str(job.job_id), "backoff") == []


async def test_a_queue_with_limits_is_not_claimed_ahead(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """A job claimed counts against the queue's limits: claimed ahead, it would hold back
    another worker's free slot. Another worker runs them while the first one's slot is busy."""
    slots = Slots(registry)
    first = await start_service(workers=[{"queue": QUEUE, "concurrency": 1}])
    await first.dl.set_limits(QUEUE, max_running=3)
    worker = first.manager.queues[QUEUE]
    (blocker,) = await first.dl.enqueue_many([NewJob(queue=QUEUE, task="t.blocker")])
    await asyncio.wait_for(slots.blocker_started.wait(), timeout=15)
    await primed(worker)  # its claims learnt that the queue has limits
    quick = await first.dl.enqueue_many(quick_jobs(range(3)))
    second = await start_service(workers=[{"queue": QUEUE, "concurrency": 2}])
    for job in quick:
        assert (await second.dl.wait(job.job_id, timeout=30)).status == "succeeded"
    assert worker.claimed_ahead == 0
    for job in quick:
        assert await event_payloads(conn, str(job.job_id), "backoff") == []
    assert await statuses(conn, [blocker]) == [("running", 1)]
    slots.release.set()
    assert (await first.dl.wait(blocker.job_id, timeout=30)).status == "succeeded"


async def test_jobs_claimed_ahead_go_back_at_once_when_limits_were_set_meanwhile(
    start_service: StartService,
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Limits set since the worker's last claim: its next claim, made to claim ahead, finds
    them (it claims within them); the jobs it took beyond the free slots go back at once."""
    slots = Slots(registry)
    service = await start_service(workers=[{"queue": QUEUE, "concurrency": 1}])
    worker = service.manager.queues[QUEUE]
    protocol = service.manager.runtime.protocol
    learnt = protocol.limited
    stale = True  # what the worker knew before its next claim: no limits

    def limited(queue: str) -> bool:
        return False if stale else learnt(queue)

    claim = worker.claims.claim

    async def next_claim(*args: Any, **kwargs: Any) -> Any:
        nonlocal stale
        found = await claim(*args, **kwargs)
        stale = stale and not found.jobs
        return found

    monkeypatch.setattr(protocol, "limited", limited)
    monkeypatch.setattr(worker.claims, "claim", next_claim)
    await primed(worker)  # before: a claim the limits' change wakes may take the jobs too
    await service.dl.set_limits(QUEUE, max_running=3)
    blocker, *quick = await service.dl.enqueue_many(
        [NewJob(queue=QUEUE, task="t.blocker"), *quick_jobs(range(2))]
    )
    await asyncio.wait_for(slots.blocker_started.wait(), timeout=15)

    await back_in_queue(conn, quick, "the jobs claimed beyond the slot back in the queue")
    why = "the queue has limits: not claimed ahead"
    assert await given_back(conn, quick) == [("queued", 0, 0, why)] * 2
    assert worker.claimed_ahead == 0
    await released(slots, service, [blocker, *quick])


async def test_a_job_claimed_ahead_that_lost_its_lock_goes_back_unstarted(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """Its lock went with the lock connection while it waited: it never starts, and goes back
    without counting as a hand-back (which would use up its attempt in the end)."""
    slots = Slots(registry)
    service = await start_service(workers=[{"queue": QUEUE, "concurrency": 1}])
    worker = service.manager.queues[QUEUE]
    await primed(worker)
    blocker, *keyed = await service.dl.enqueue_many(
        [
            NewJob(queue=QUEUE, task="t.blocker"),
            *(
                NewJob(queue=QUEUE, task="t.quick", lock_key=f"k{i}", args={"i": i})
                for i in range(2)
            ),
        ]
    )
    await asyncio.wait_for(slots.blocker_started.wait(), timeout=15)
    assert worker.claimed_ahead == 2
    service.manager.runtime.lose_all("the lock connection was lost")  # the blocker has no key
    slots.release.set()
    for job in [blocker, *keyed]:  # given back, then claimed again and run
        assert (await service.dl.wait(job.job_id, timeout=30)).status == "succeeded"
    for job in keyed:
        kinds = await conn.fetch(
            "SELECT kind, payload->>'reason' AS reason FROM dl_job_events WHERE job_id = $1"
            # a heartbeat is journalled whenever a run outlasts its period: not this test's
            " AND kind NOT IN ('queued', 'heartbeat') ORDER BY event_id",
            job.job_id,
        )
        assert [tuple(r) for r in kinds] == [
            ("picked", None),
            ("backoff", "the lock connection was lost"),
            ("picked", None),
            ("done", None),
        ]
        assert await conn.fetchval(
            "SELECT (attempt, handbacks) = (1, 0) FROM dl_jobs WHERE job_id = $1", job.job_id
        )


async def claim_answered_in_a_stop(
    service: Any, monkeypatch: pytest.MonkeyPatch, *, hurried: bool
) -> list[Any]:
    """Three quick jobs taken by one claim (one for the only slot, two ahead) whose answer
    arrives once the stop has begun (and, `hurried`, a second stop signal came); returns
    them once the stop is over."""
    worker = service.manager.queues[QUEUE]
    answered = asyncio.Event()
    held = asyncio.Event()
    claim = worker.claims.claim

    async def held_claim(*args: Any, **kwargs: Any) -> Any:
        found = await claim(*args, **kwargs)
        if found.jobs:
            held.set()
            await answered.wait()
        return found

    monkeypatch.setattr(worker.claims, "claim", held_claim)
    await primed(worker)
    quick = await service.dl.enqueue_many(quick_jobs(range(3)))
    await asyncio.wait_for(held.wait(), timeout=15)
    stopping = asyncio.create_task(service.manager.stop(timeout=30))

    async def stop_began() -> bool:
        return worker.stopped_claiming

    await wait_until(stop_began, what="the stop to begin")
    if hurried:
        service.manager.hurry()

        async def heard() -> bool:
            return worker.hurried

        await wait_until(heard, what="the second signal to reach the worker")
    answered.set()
    await stopping
    return quick


async def test_a_claim_answered_after_the_stop_began_runs_its_slots_jobs_and_gives_back_others(
    start_service: StartService,
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slots = Slots(registry)
    service = await start_service(workers=[{"queue": QUEUE, "concurrency": 1}])
    quick = await claim_answered_in_a_stop(service, monkeypatch, hurried=False)
    # the job for the free slot runs, as any job claimed before a stop; none waits after it
    assert slots.ran == [0]
    assert await statuses(conn, quick[:1]) == [("succeeded", 1)]
    assert await given_back(conn, quick[1:]) == [("queued", 0, 0, "worker shutting down")] * 2


async def test_a_claim_answered_after_a_hurried_stop_began_starts_nothing(
    start_service: StartService,
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second stop signal: not even the job for the free slot starts (it would be cut short
    at once, and count as a hand-back)."""
    slots = Slots(registry)
    service = await start_service(workers=[{"queue": QUEUE, "concurrency": 1}])
    quick = await claim_answered_in_a_stop(service, monkeypatch, hurried=True)
    assert slots.ran == []
    assert await given_back(conn, quick) == [("queued", 0, 0, "worker shutting down")] * 3


async def test_a_job_canceled_while_it_waits_for_a_slot_never_starts(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    slots = Slots(registry)
    service = await start_service(workers=[{"queue": QUEUE, "concurrency": 1}])
    blocker, quick = await start_behind_a_blocker(service, slots)
    await service.dl.cancel(quick[0].job_id)
    running = service.manager.runtime.running

    async def seen() -> bool:  # the worker heard of the request
        return running[quick[0].job_id].state.cancel_requested

    await wait_until(seen, what="the cancel request to reach the worker")
    slots.release.set()
    assert (await service.dl.wait(quick[0].job_id, timeout=30)).status == "canceled"
    for job in [blocker, *quick[1:]]:
        assert (await service.dl.wait(job.job_id, timeout=30)).status == "succeeded"
    assert slots.ran == [1, 2]
    assert await statuses(conn, quick[:1]) == [("canceled", 0)]
