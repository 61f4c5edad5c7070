"""One behavioural suite, two backends: `dataloader.testing.InMemoryQueue` and the PostgreSQL
queue (the client's statements and the worker protocol's, as a worker uses them) go through
the same scenarios and must give the same answers, so that their semantics cannot drift.

Time passes in the memory queue by its clock; in PostgreSQL by moving every job's times back
(`available_at`, `created_at`, `lease_expires_at`), which is what the passing of time does to
the queue's decisions."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any, Protocol

import asyncpg
import pytest

from dataloader import Client, IdempotencyConflict, JobState, JobStatus, QueueStats, Settings
from dataloader.core.retry import Linear
from dataloader.core.transitions import Ended, Outcome, after_attempt
from dataloader.storage import db
from dataloader.storage.protocol import ClaimedJob, WorkerProtocol
from dataloader.tasks import TaskRegistry
from dataloader.testing import InMemoryQueue
from dataloader.workers.reaper import Reaper

QUEUE = "q"


class Backend(Protocol):
    async def enqueue(
        self, task: str, args: dict[str, Any] | None = None, **options: Any
    ) -> Any: ...
    async def get(self, job_id: uuid.UUID) -> JobState | None: ...
    async def cancel(self, job_id: uuid.UUID) -> JobState: ...
    async def stats(self, queue: str) -> QueueStats: ...
    async def claim(self, queue: str, limit: int = 1) -> list[ClaimedJob]: ...
    async def complete(self, claim: ClaimedJob, result: Any = None) -> bool: ...
    async def retry(self, claim: ClaimedJob, after_sec: float, error: str = "retry") -> bool: ...
    async def fail(self, claim: ClaimedJob, error: str) -> bool: ...
    async def expire_leases(self) -> int: ...
    async def advance(self, seconds: float) -> None: ...


class Memory:
    """InMemoryQueue as the suite drives it (its clock moves synchronously)."""

    def __init__(self, queue: InMemoryQueue) -> None:
        self.queue = queue

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queue, name)

    async def advance(self, seconds: float) -> None:
        self.queue.advance(seconds)


class Postgres:
    """The PostgreSQL queue: the client for producers, the worker protocol for claims and
    outcomes (decided by `core.transitions`, as the completer decides them), the reaper."""

    def __init__(self, client: Client, protocol: WorkerProtocol, conn: asyncpg.Connection) -> None:
        self.client = client
        self.protocol = protocol
        self.conn = conn
        self.reaper = Reaper(protocol, "suite-reaper")

    async def enqueue(self, task: str, args: dict[str, Any] | None = None, **options: Any) -> Any:
        return await self.client.enqueue(task, args, **options)

    async def get(self, job_id: uuid.UUID) -> JobState | None:
        return await self.client.get(job_id)

    async def cancel(self, job_id: uuid.UUID) -> JobState:
        return await self.client.cancel(job_id)

    async def stats(self, queue: str) -> QueueStats:
        return (await self.client.stats(queue))[queue]

    async def claim(self, queue: str, limit: int = 1) -> list[ClaimedJob]:
        await self.protocol.put_back_due(queue, 1000)
        claimed = await self.protocol.claim_round(queue, limit, "suite", walk=10_000)
        if claimed.blocked:
            await self.protocol.park(claimed.blocked)
        return claimed.jobs

    async def complete(self, claim: ClaimedJob, result: Any = None) -> bool:
        text = None if result is None else json.dumps(result)
        return await self._settle(claim, Outcome(Ended.SUCCEEDED, result=text))

    async def retry(self, claim: ClaimedJob, after_sec: float, error: str = "retry") -> bool:
        return await self._settle(claim, Outcome(Ended.FAILED, error, retry_after_sec=after_sec))

    async def fail(self, claim: ClaimedJob, error: str) -> bool:
        return await self._settle(claim, Outcome(Ended.FAILED, error, retryable=False))

    async def _settle(self, claim: ClaimedJob, outcome: Outcome) -> bool:
        facts = claim.facts()
        for _ in range(3):  # decided again on the row's facts when it changed meanwhile
            transition = after_attempt(outcome, facts, Linear(0))
            applied = (await self.protocol.finish([(claim, facts, transition)], "suite")).get(
                claim.job_id
            )
            if applied is None:
                return False  # the claim is no longer the job's
            if applied.state == "written":
                return True
            assert applied.facts is not None
            facts = applied.facts
        raise AssertionError("the job kept changing")

    async def expire_leases(self) -> int:
        return sum((await self.reaper.run_once()).values())

    async def advance(self, seconds: float) -> None:
        await self.conn.execute(
            "UPDATE dl_jobs SET available_at = available_at - $1::float8 * interval '1 second',"
            " created_at = created_at - $1::float8 * interval '1 second',"
            " lease_expires_at = lease_expires_at - $1::float8 * interval '1 second'",
            seconds,
        )


@pytest.fixture(params=["memory", "postgres"])
async def backend(
    request: pytest.FixtureRequest,
    make_settings: Callable[..., Settings],
    registry: TaskRegistry,
    db_dsn: str,
    conn: asyncpg.Connection,
) -> AsyncIterator[Backend]:
    @registry.task("t.leased", queue=QUEUE, lease_ttl=30)
    async def leased(ctx: Any) -> None:
        return None

    settings = make_settings(retry_base_sec=0)
    if request.param == "memory":
        yield Memory(InMemoryQueue(registry=registry, settings=settings))
        return
    pool = await db.create_pool(db_dsn, 4, "suite")
    try:
        client = Client(pool=pool, settings=settings, registry=registry)
        yield Postgres(client, WorkerProtocol(pool), conn)
    finally:
        await pool.close()


async def enqueue(backend: Backend, key: str, **options: Any) -> uuid.UUID:
    result = await backend.enqueue("t.leased", {"key": key}, lock_key=key, **options)
    job_id: uuid.UUID = result.job_id
    return job_id


async def status(backend: Backend, job_id: uuid.UUID) -> tuple[JobStatus, int]:
    state = await backend.get(job_id)
    assert state is not None
    return state.status, state.attempt


async def test_claims_follow_priority_then_age(backend: Backend) -> None:
    first = await enqueue(backend, "a")
    urgent = await enqueue(backend, "b", priority=10)
    last = await enqueue(backend, "c")
    claimed = await backend.claim(QUEUE, 3)
    assert [c.job_id for c in claimed] == [urgent, first, last]
    assert [c.attempt for c in claimed] == [1, 1, 1]


async def test_a_delayed_job_waits_until_it_is_due(backend: Backend) -> None:
    job = await enqueue(backend, "a", available_at=timedelta(seconds=60))
    assert await backend.claim(QUEUE) == []
    assert (await backend.stats(QUEUE)).delayed == 1
    await backend.advance(61)
    assert [c.job_id for c in await backend.claim(QUEUE)] == [job]


async def test_an_idempotency_key_names_one_job(backend: Backend) -> None:
    first = await backend.enqueue("t.leased", {"n": 1}, lock_key="k", idempotency_key="once")
    again = await backend.enqueue("t.leased", {"n": 1}, lock_key="k", idempotency_key="once")
    assert (again.job_id, again.created) == (first.job_id, False)
    with pytest.raises(IdempotencyConflict, match="args"):
        await backend.enqueue("t.leased", {"n": 2}, lock_key="k", idempotency_key="once")


async def test_jobs_of_one_lock_key_run_one_at_a_time(backend: Backend) -> None:
    first = await enqueue(backend, "k")
    second = await enqueue(backend, "k")
    other = await enqueue(backend, "other")
    claimed = await backend.claim(QUEUE, 3)
    assert [c.job_id for c in claimed] == [first, other]
    assert await backend.claim(QUEUE, 3) == []  # k's job runs
    assert await backend.complete(claimed[0], {"rows": 3})
    assert [c.job_id for c in await backend.claim(QUEUE, 3)] == [second]
    state = await backend.get(first)
    assert state is not None
    assert (state.status, state.result) == (JobStatus.SUCCEEDED, {"rows": 3})


async def test_jobs_without_a_lock_key_run_together_and_hold_back_nothing(
    backend: Backend,
) -> None:
    """Two jobs without a lock_key are claimed together and say they need no lock; a job with
    a key runs beside them; each ends as any job does."""
    free = [(await backend.enqueue("t.leased", {"n": n})).job_id for n in range(2)]
    keyed = await enqueue(backend, "k")
    claimed = await backend.claim(QUEUE, 3)
    assert [c.job_id for c in claimed] == [*free, keyed]
    assert [(c.lock_key, c.lock_hash is None) for c in claimed[:2]] == [(None, True)] * 2
    assert (claimed[2].lock_key, claimed[2].lock_hash is None) == ("k", False)
    assert all([await backend.complete(c) for c in claimed])
    for job_id in [*free, keyed]:
        assert await status(backend, job_id) == (JobStatus.SUCCEEDED, 1)
    state = await backend.get(free[0])
    assert state is not None
    assert state.lock_key is None


async def test_a_lease_that_runs_out_gives_the_job_to_the_next_claim(backend: Backend) -> None:
    job = await enqueue(backend, "a")
    (stale,) = await backend.claim(QUEUE)
    await backend.advance(31)  # the task's lease is 30 s
    assert await backend.expire_leases() == 1
    assert await status(backend, job) == (JobStatus.QUEUED, 1)
    (fresh,) = await backend.claim(QUEUE)
    assert fresh.attempt == 2
    assert not await backend.complete(stale, "late")  # fenced: the old claim writes nothing
    assert await backend.complete(fresh, "on time")
    state = await backend.get(job)
    assert state is not None
    assert (state.status, state.attempt, state.result) == (JobStatus.SUCCEEDED, 2, "on time")


async def test_a_retry_waits_its_delay_and_the_last_attempt_ends_the_job(backend: Backend) -> None:
    job = await enqueue(backend, "a", max_attempts=2)
    (claim,) = await backend.claim(QUEUE)
    assert await backend.retry(claim, 10, "upstream down")
    assert await status(backend, job) == (JobStatus.QUEUED, 1)
    assert await backend.claim(QUEUE) == []
    await backend.advance(11)
    (claim,) = await backend.claim(QUEUE)
    assert claim.attempt == 2
    assert await backend.retry(claim, 10, "still down")
    state = await backend.get(job)
    assert state is not None
    assert (state.status, state.error) == (JobStatus.FAILED, "still down")


async def test_a_job_running_again_shows_its_new_attempt_not_the_last_one(
    backend: Backend,
) -> None:
    """`started_at` stays the first attempt's start; `attempted_at` is the current one's, and
    the previous attempt's error shows while the job waits for its retry, not once it runs."""
    job = await enqueue(backend, "a", max_attempts=2)
    (claim,) = await backend.claim(QUEUE)
    first = await backend.get(job)
    assert first is not None
    assert first.started_at is not None
    assert first.attempted_at == first.started_at
    assert await backend.retry(claim, 10, "upstream down")
    waiting = await backend.get(job)
    assert waiting is not None
    assert (waiting.status, waiting.error) == (JobStatus.QUEUED, "upstream down")
    await backend.advance(11)
    (claim,) = await backend.claim(QUEUE)
    running = await backend.get(job)
    assert running is not None
    assert (running.status, running.attempt, running.error) == (JobStatus.RUNNING, 2, None)
    assert running.started_at == first.started_at
    assert running.attempted_at is not None
    assert running.attempted_at > first.attempted_at
    assert await backend.complete(claim, "ok")
    done = await backend.get(job)
    assert done is not None
    assert (done.status, done.error, done.attempted_at) == (
        JobStatus.SUCCEEDED,
        None,
        running.attempted_at,
    )


async def test_a_lease_that_runs_out_on_the_last_attempt_loses_the_job(backend: Backend) -> None:
    job = await enqueue(backend, "a", max_attempts=1)
    await backend.claim(QUEUE)
    await backend.advance(31)
    assert await backend.expire_leases() == 1
    assert await status(backend, job) == (JobStatus.LOST, 1)
    assert (await backend.stats(QUEUE)).lost == 1


async def test_a_failure_is_final_and_counted(backend: Backend) -> None:
    job = await enqueue(backend, "a")
    (claim,) = await backend.claim(QUEUE)
    assert await backend.fail(claim, "bad input")
    assert await status(backend, job) == (JobStatus.FAILED, 1)
    stats = await backend.stats(QUEUE)
    assert (stats.failed, stats.total) == (1, 0)


async def test_cancel_ends_a_queued_job_and_asks_a_running_one(backend: Backend) -> None:
    queued = await enqueue(backend, "a")
    running = await enqueue(backend, "b")
    (claim,) = await backend.claim(QUEUE)
    assert claim.job_id == queued
    other = await backend.cancel(running)
    assert other.status is JobStatus.CANCELED
    asked = await backend.cancel(queued)
    assert (asked.status, asked.cancel_requested) == (JobStatus.RUNNING, True)
    assert await backend.fail(claim, "stopped")
    assert await status(backend, queued) == (JobStatus.CANCELED, 1)


async def test_statistics_count_each_state(backend: Backend) -> None:
    for key in ("a", "b", "c"):
        await enqueue(backend, key)
    await enqueue(backend, "later", available_at=timedelta(hours=1))
    (claim,) = await backend.claim(QUEUE)
    stats = await backend.stats(QUEUE)
    assert (stats.ready, stats.delayed, stats.running, stats.total) == (2, 1, 1, 4)
    assert stats.oldest_ready_age_sec is not None
    assert await backend.complete(claim)
    assert (await backend.stats(QUEUE)).total == 3
