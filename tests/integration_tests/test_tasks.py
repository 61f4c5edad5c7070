"""Tasks end to end: the options of `@registry.task(…)`, retry policies, timeouts and results,
through the real worker of an in-process service on a real database."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel

from dataloader import Exponential, Fixed, Linear, NonRetryableError, Retry
from dataloader.base import JobStatus
from dataloader.core.models import JobState
from dataloader.core.transitions import Ended, Outcome
from dataloader.exceptions import InvalidJob, InvalidJobArgs, JobLost
from dataloader.storage.protocol import WorkerProtocol
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext
from dataloader.workers.reaper import Reaper

from .conftest import Service, StartService
from .helpers import event_payloads, finish_claimed

#: Served next to `default` by the services of these tests.
TASK_QUEUE = "tasks"
WORKERS = [{"queue": "default", "concurrency": 4}, {"queue": TASK_QUEUE, "concurrency": 4}]


class Boom(Exception):
    """What the failing tasks of these tests raise."""


async def finished(service: Service, job_id: uuid.UUID, timeout: float = 30) -> JobState:
    """The job once it has ended (the client's wait: woken by the database's notification)."""
    return await service.dl.wait(job_id, timeout=timeout)


async def retry_delays(conn: asyncpg.Connection, job_id: uuid.UUID) -> list[float]:
    """Seconds between each failed attempt's end and the time the job may run again, as the
    journal records them (`retry_at` of a `requeue` entry, written by the statement that ended
    the attempt, at the entry's own time)."""
    rows = await conn.fetch(
        "SELECT EXTRACT(EPOCH FROM (payload->>'retry_at')::timestamptz - ts)::float8 AS delay"
        " FROM dl_job_events WHERE job_id = $1 AND kind = 'requeue' ORDER BY event_id",
        job_id,
    )
    return [r["delay"] for r in rows]


async def claimed_before_due(conn: asyncpg.Connection, job_id: uuid.UUID) -> int:
    """Claims of the job made before the retry time of the failure before them."""
    n: int = await conn.fetchval(
        "SELECT count(*) FROM dl_job_events p JOIN dl_job_events r"
        "  ON r.job_id = p.job_id AND r.kind = 'requeue'"
        "  AND (r.payload->>'attempt')::int + 1 = (p.payload->>'attempt')::int"
        " WHERE p.job_id = $1 AND p.kind = 'picked'"
        "   AND p.ts < (r.payload->>'retry_at')::timestamptz",
        job_id,
    )
    return n


def always_failing(registry: TaskRegistry, name: str, **options: Any) -> list[int]:
    """Register `name`, failing every attempt; returns the attempts seen."""
    seen: list[int] = []

    @registry.task(name, **options)
    async def fail(ctx: JobContext[dict[str, Any]]) -> None:
        seen.append(ctx.attempt)
        raise Boom(f"attempt {ctx.attempt}")

    return seen


# --- options of the task reach its jobs -------------------------------------------------------


async def test_the_tasks_options_fill_what_the_enqueue_leaves_out(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    seen = always_failing(
        registry,
        "t.options",
        queue=TASK_QUEUE,
        priority=7,
        max_attempts=2,
        lease_ttl=timedelta(seconds=9),
        retry=0,
    )
    service = await start_service(workers=WORKERS)
    job = await service.dl.enqueue("t.options", lock_key="k")  # names no queue
    state = await finished(service, job.job_id)
    row = await conn.fetchrow(
        "SELECT queue, priority, max_attempts, lease_ttl_sec FROM dl_jobs WHERE job_id = $1",
        job.job_id,
    )
    assert dict(row) == {"queue": TASK_QUEUE, "priority": 7, "max_attempts": 2, "lease_ttl_sec": 9}
    # the task's max_attempts governs: two attempts, not DL_DEFAULT_MAX_ATTEMPTS (5)
    assert (state.status, state.attempt, seen) == (JobStatus.FAILED, 2, [1, 2])
    assert state.error == "Boom: attempt 2"


async def test_the_enqueues_own_options_win_over_the_tasks(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    seen = always_failing(registry, "t.overridden", queue=TASK_QUEUE, max_attempts=4, retry=0)
    service = await start_service(workers=WORKERS)
    job = await service.dl.enqueue(  # but for the queue: its own (tests/…/test_client.py)
        "t.overridden", lock_key="k", queue=TASK_QUEUE, max_attempts=1, priority=3
    )
    state = await finished(service, job.job_id)
    assert (state.queue, state.priority, state.max_attempts) == (TASK_QUEUE, 3, 1)
    assert (state.status, seen) == (JobStatus.FAILED, [1])


async def test_an_http_trigger_takes_the_tasks_limits(
    start_service: StartService, registry: TaskRegistry
) -> None:
    seen = always_failing(registry, "t.http", max_attempts=3, lease_ttl=7, priority=11, retry=0)
    service = await start_service()
    job_id = await service.trigger(task="t.http")
    body = await service.wait_status(job_id, "failed")
    assert (body["max_attempts"], body["priority"], body["attempt"]) == (3, 11, 3)
    assert seen == [1, 2, 3]


async def test_a_task_without_a_queue_needs_one_from_the_enqueue(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    always_failing(registry, "t.queueless")
    service = await start_service()
    with pytest.raises(InvalidJob, match=r"queue: required: task 't\.queueless' does not name"):
        await service.dl.enqueue("t.queueless", lock_key="k")
    assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 0


class DayArgs(BaseModel):
    day: str
    rows: int = 0


async def test_typed_args_are_checked_on_enqueue_and_parsed_for_the_task(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    got: list[DayArgs] = []

    @registry.task("t.typed", queue=TASK_QUEUE, args=DayArgs)
    async def typed(ctx: JobContext[DayArgs]) -> None:
        got.append(ctx.args)

    service = await start_service(workers=WORKERS)
    with pytest.raises(InvalidJobArgs, match=r"args\.day"):
        await service.dl.enqueue("t.typed", {"rows": 1}, lock_key="k")
    assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 0
    job = await service.dl.enqueue("t.typed", DayArgs(day="2026-01-01", rows=5), lock_key="k")
    state = await finished(service, job.job_id)
    assert state.status is JobStatus.SUCCEEDED
    assert got == [DayArgs(day="2026-01-01", rows=5)]


# --- retry policies ---------------------------------------------------------------------------


def _linear_by_hand(attempt: int) -> float:
    return 0.05 + attempt / 10


@pytest.mark.parametrize(
    ("retry", "expected"),
    [
        (None, [0.2, 0.4]),  # Linear(DL_RETRY_BASE_SEC): base × attempt
        (Linear(0.15), [0.15, 0.3]),
        (Fixed(0.25), [0.25, 0.25]),
        (0.3, [0.3, 0.3]),  # seconds: a fixed delay
        (Exponential(base=0.1, factor=3, jitter=False), [0.1, 0.3]),
        (Exponential(base=0.2, factor=3, cap=0.25, jitter=False), [0.2, 0.25]),
        (_linear_by_hand, [0.15, 0.25]),
    ],
    ids=["default", "linear", "fixed", "seconds", "exponential", "capped", "callable"],
)
async def test_the_retry_policy_chooses_the_delay_before_the_next_attempt(
    start_service: StartService,
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    retry: Any,
    expected: list[float],
) -> None:
    options = {} if retry is None else {"retry": retry}
    seen = always_failing(registry, "t.flaky", queue=TASK_QUEUE, max_attempts=3, **options)
    service = await start_service(workers=WORKERS, retry_base_sec=0.2)
    job = await service.dl.enqueue("t.flaky", lock_key="k")
    state = await finished(service, job.job_id)
    assert (state.status, seen) == (JobStatus.FAILED, [1, 2, 3])
    assert await retry_delays(conn, job.job_id) == pytest.approx(expected, abs=0.001)
    assert await claimed_before_due(conn, job.job_id) == 0  # and the workers kept to it


def _raise_unstorable(attempt: int) -> float:
    raise ValueError("bad\x00value \udc80")  # what jsonb cannot hold: NUL, a lone surrogate


@pytest.mark.parametrize(
    ("policy", "problem"),
    [
        (lambda attempt: 1 / 0, "retry policy raised ZeroDivisionError: division by zero"),
        (lambda attempt: -1, "retry policy returned -1.0, not a delay in seconds"),
        (lambda attempt: float("nan"), "retry policy returned nan, not a delay in seconds"),
        (lambda attempt: "soon", "retry policy raised ValueError"),
        (_raise_unstorable, "retry policy raised ValueError: bad\\x00value \\udc80"),
    ],
    ids=["raises", "negative", "nan", "not-a-number", "unstorable-message"],
)
async def test_a_broken_retry_policy_falls_back_to_the_default_and_says_so(
    start_service: StartService,
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    policy: Callable[[int], Any],
    problem: str,
) -> None:
    always_failing(registry, "t.broken", queue=TASK_QUEUE, max_attempts=3, retry=policy)
    service = await start_service(workers=WORKERS, retry_base_sec=0.1)
    job = await service.dl.enqueue("t.broken", lock_key="k")
    state = await finished(service, job.job_id)
    assert (state.status, state.attempt) == (JobStatus.FAILED, 3)
    assert await retry_delays(conn, job.job_id) == pytest.approx([0.1, 0.2], abs=0.001)
    for payload in await event_payloads(conn, str(job.job_id), "requeue"):
        assert payload["retry_policy"].startswith(problem)


async def test_retry_after_uses_the_tasks_own_delay_and_counts_the_attempt(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    seen: list[int] = []

    @registry.task("t.later", queue=TASK_QUEUE, max_attempts=3, retry=Fixed(1000))
    async def later(ctx: JobContext[dict[str, Any]]) -> None:
        seen.append(ctx.attempt)
        after = 0.2 if ctx.attempt == 1 else timedelta(milliseconds=300)
        raise Retry(after=after, reason=f"rate limited ({ctx.attempt})")

    service = await start_service(workers=WORKERS)
    job = await service.dl.enqueue("t.later", lock_key="k")
    state = await finished(service, job.job_id)
    # not the policy's 1000 s: the task's own delays; the third Retry finds no attempt left
    assert await retry_delays(conn, job.job_id) == pytest.approx([0.2, 0.3], abs=0.001)
    assert (state.status, state.attempt, seen) == (JobStatus.FAILED, 3, [1, 2, 3])
    assert state.error == "Retry: rate limited (3)"
    assert await claimed_before_due(conn, job.job_id) == 0


async def test_a_retried_job_s_fields_tell_its_first_start_and_its_last_attempt(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """After a retry `started_at` is the first attempt's start, `attempted_at` the last one's,
    and `duration_ms` measures the last attempt, within `finished_at - attempted_at`; while the
    second attempt runs, the first one's error is gone from the job (the journal keeps it)."""
    running, release = asyncio.Event(), asyncio.Event()

    @registry.task("t.second", queue=TASK_QUEUE, max_attempts=2, retry=Fixed(0))
    async def second(ctx: JobContext[dict[str, Any]]) -> None:
        if ctx.attempt == 1:
            raise Boom("first attempt")
        running.set()
        await release.wait()

    service = await start_service(workers=WORKERS)
    job = await service.dl.enqueue("t.second", lock_key="k")
    await asyncio.wait_for(running.wait(), 30)
    during = await service.dl.get(job.job_id)
    assert during is not None
    assert (during.status, during.attempt, during.error) == (JobStatus.RUNNING, 2, None)
    assert during.duration_ms is None
    release.set()
    state = await finished(service, job.job_id)
    assert state.status == JobStatus.SUCCEEDED
    assert state.started_at is not None
    assert state.attempted_at is not None
    assert state.finished_at is not None
    assert state.duration_ms is not None
    assert state.started_at < state.attempted_at == during.attempted_at
    last_attempt_ms = (state.finished_at - state.attempted_at).total_seconds() * 1000
    assert state.duration_ms <= last_attempt_ms + 1  # the worker's clock, rounded
    (requeued,) = await event_payloads(conn, str(job.job_id), "requeue")
    assert requeued["error"] == "Boom: first attempt"


class Unrecoverable(LookupError):
    """A subclass of a type the task names non-retryable."""


@pytest.mark.parametrize(
    ("raised", "attempts", "error"),
    [
        (Unrecoverable("no such account"), [1], "Unrecoverable: no such account"),
        (KeyError("day"), [1], "KeyError: 'day'"),
        (NonRetryableError("bad file"), [1], "NonRetryableError: bad file"),
        (Boom("flaky"), [1, 2, 3], "Boom: flaky"),  # not named: retried as usual
    ],
    ids=["subclass", "named", "NonRetryableError", "other"],
)
async def test_non_retryable_errors_fail_the_job_at_once(
    start_service: StartService,
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    raised: Exception,
    attempts: list[int],
    error: str,
) -> None:
    seen: list[int] = []

    @registry.task(
        "t.fatal", queue=TASK_QUEUE, max_attempts=3, retry=0, non_retryable=(LookupError,)
    )
    async def fatal(ctx: JobContext[dict[str, Any]]) -> None:
        seen.append(ctx.attempt)
        raise raised

    service = await start_service(workers=WORKERS)
    job = await service.dl.enqueue("t.fatal", lock_key="k")
    state = await finished(service, job.job_id)
    assert (state.status, state.error, seen) == (JobStatus.FAILED, error, attempts)
    failed = await event_payloads(conn, str(job.job_id), "failed")
    assert [(p["attempt"], p["error"]) for p in failed] == [(attempts[-1], error)]


async def test_a_task_giving_up_its_job_with_any_message_hands_it_back(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    """JobLost raised by the task (its own fence refused a write) hands the job back, with the
    task's message in the journal even when the database could not store it as it is."""

    @registry.task("t.fenced", queue=TASK_QUEUE, max_attempts=1)
    async def fenced(ctx: JobContext[dict[str, Any]]) -> str:
        if ctx.claim_seq == 1:
            raise JobLost("fence refused\x00 the write")
        return "written"

    service = await start_service(workers=WORKERS)
    job = await service.dl.enqueue("t.fenced", lock_key="k")
    state = await finished(service, job.job_id)
    assert (state.status, state.result) == (JobStatus.SUCCEEDED, "written")
    (requeued,) = await event_payloads(conn, str(job.job_id), "requeue")
    assert (requeued["reason"], requeued["refunded"]) == ("fence refused\\x00 the write", True)


# --- timeouts ---------------------------------------------------------------------------------


async def test_a_task_running_past_its_timeout_is_cancelled_and_retried_per_its_policy(
    start_service: StartService, registry: TaskRegistry, conn: asyncpg.Connection
) -> None:
    cancelled: list[int] = []

    @registry.task("t.slow", queue=TASK_QUEUE, timeout=0.3, max_attempts=2, retry=Fixed(0.2))
    async def slow(ctx: JobContext[dict[str, Any]]) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(ctx.attempt)  # the task sees the cancellation (it may clean up)
            raise

    service = await start_service(workers=WORKERS)
    job = await service.dl.enqueue("t.slow", lock_key="k")
    state = await finished(service, job.job_id)
    assert (state.status, state.attempt, cancelled) == (JobStatus.FAILED, 2, [1, 2])
    assert state.error == "TaskTimeout: the task ran longer than its timeout of 0.3s"
    assert state.duration_ms is not None
    assert 250 <= state.duration_ms <= 5000
    requeued = await event_payloads(conn, str(job.job_id), "requeue")
    assert [p["error"] for p in requeued] == [state.error]
    assert await retry_delays(conn, job.job_id) == pytest.approx([0.2], abs=0.001)


async def test_a_timeout_error_of_the_tasks_own_is_not_its_timeout(
    start_service: StartService, registry: TaskRegistry
) -> None:
    @registry.task("t.upstream", queue=TASK_QUEUE, timeout=30, max_attempts=2, retry=0)
    async def upstream(ctx: JobContext[dict[str, Any]]) -> None:
        if ctx.attempt == 1:
            raise TimeoutError("the upstream API did not answer")
        async with asyncio.timeout(0.05):  # a timeout of the task's own, inside its limit
            await asyncio.sleep(10)

    service = await start_service(workers=WORKERS)
    job = await service.dl.enqueue("t.upstream", lock_key="k")
    state = await finished(service, job.job_id)
    assert (state.status, state.attempt) == (JobStatus.FAILED, 2)
    assert state.error == "TimeoutError: "  # the inner timeout's, not TaskTimeout
    assert state.duration_ms is not None
    assert state.duration_ms < 5000  # not the 30 s limit
    first = await service.dl.events(job.job_id)
    requeue = [e.payload for e in first if e.kind == "requeue"]
    assert [p["error"] for p in requeue if p] == ["TimeoutError: the upstream API did not answer"]


# --- results ----------------------------------------------------------------------------------


class Loaded(BaseModel):
    day: str
    rows: int


@pytest.mark.parametrize(
    ("returned", "stored"),
    [
        ({"rows": 3, "tables": ["a", "b"]}, {"rows": 3, "tables": ["a", "b"]}),
        ([1, "two", None, 4.5], [1, "two", None, 4.5]),
        (Loaded(day="2026-01-01", rows=12), {"day": "2026-01-01", "rows": 12}),
        ("done", "done"),
        (None, None),
    ],
    ids=["dict", "list", "model", "text", "none"],
)
async def test_the_return_value_is_the_jobs_result(
    start_service: StartService,
    registry: TaskRegistry,
    conn: asyncpg.Connection,
    returned: Any,
    stored: Any,
) -> None:
    @registry.task("t.result", queue=TASK_QUEUE)
    async def result(ctx: JobContext[dict[str, Any]]) -> Any:
        await asyncio.sleep(0.2)
        return returned

    service = await start_service(workers=WORKERS)
    job = await service.dl.enqueue("t.result", lock_key="k")
    waited = await finished(service, job.job_id)
    got = await service.dl.get(job.job_id)
    body = await service.status(str(job.job_id))
    assert got is not None
    assert waited.status is JobStatus.SUCCEEDED
    assert waited.result == got.result == body["result"] == stored
    assert waited.duration_ms == got.duration_ms == body["duration_ms"]
    assert waited.duration_ms is not None
    assert 150 <= waited.duration_ms <= 5000
    (picked,) = await event_payloads(conn, str(job.job_id), "picked")
    assert waited.worker_id == body["worker_id"] == picked["worker"]
    assert waited.worker_id == service.manager.runtime.worker_id


@pytest.mark.parametrize(
    ("returned", "error"),
    [
        (
            "x" * 2000,
            "result: the result is 2002 bytes of JSON, more than DL_MAX_RESULT_BYTES (1024)",
        ),
        (object(), "result: the result is not JSON: Unable to serialize unknown type"),
        ({"value": float("inf")}, "result: the result holds NaN or Infinity, which JSON cannot"),
        ("a\x00b", "result: the result holds a NUL character, which PostgreSQL cannot store"),
        (
            {frozenset({1}): 2},
            "result: the result is not JSON: `frozenset` not valid as object key",
        ),
    ],
    ids=["too-large", "not-json", "infinity", "nul", "bad-key"],
)
async def test_a_result_that_cannot_be_stored_fails_the_job_at_once(
    start_service: StartService, registry: TaskRegistry, returned: Any, error: str
) -> None:
    runs: list[int] = []

    @registry.task("t.unstorable", queue=TASK_QUEUE, max_attempts=3, retry=0)
    async def unstorable(ctx: JobContext[dict[str, Any]]) -> Any:
        runs.append(ctx.attempt)
        return returned

    service = await start_service(workers=WORKERS, max_result_bytes=1024)
    job = await service.dl.enqueue("t.unstorable", lock_key="k")
    state = await finished(service, job.job_id)
    assert (state.status, runs, state.result) == (JobStatus.FAILED, [1], None)
    assert state.error is not None
    assert state.error.startswith(error)


async def test_a_result_within_the_limit_is_stored_whole(
    start_service: StartService, registry: TaskRegistry
) -> None:
    text = "é" * 500  # 1000 bytes of UTF-8, 1002 with its quotes

    @registry.task("t.fits", queue=TASK_QUEUE)
    async def fits(ctx: JobContext[dict[str, Any]]) -> str:
        return text

    service = await start_service(workers=WORKERS, max_result_bytes=1024)
    job = await service.dl.enqueue("t.fits", lock_key="k")
    state = await finished(service, job.job_id)
    assert (state.status, state.result) == (JobStatus.SUCCEEDED, text)


async def test_a_result_that_refers_to_itself_fails_with_a_clear_error(
    start_service: StartService, registry: TaskRegistry
) -> None:
    @registry.task("t.cyclic", queue=TASK_QUEUE, max_attempts=3, retry=0)
    async def cyclic(ctx: JobContext[dict[str, Any]]) -> Any:
        looped: dict[str, Any] = {}
        looped["self"] = looped
        return looped

    service = await start_service(workers=WORKERS)
    job = await service.dl.enqueue("t.cyclic", lock_key="k")
    state = await finished(service, job.job_id)
    assert (state.status, state.attempt) == (JobStatus.FAILED, 1)
    assert state.error == (
        "result: the result is not JSON: Circular reference detected (id repeated)"
    )


class Versioned(BaseModel):
    v: int
    fail: bool = False


async def test_a_failed_attempt_clears_the_result_of_an_earlier_one(
    start_service: StartService, registry: TaskRegistry
) -> None:
    @registry.task("t.versioned", queue=TASK_QUEUE, args=Versioned, max_attempts=1)
    async def versioned(ctx: JobContext[Versioned]) -> dict[str, int]:
        if ctx.args.fail:
            raise Boom(f"version {ctx.args.v}")
        return {"v": ctx.args.v}

    service = await start_service(workers=WORKERS)
    first = await service.dl.enqueue("t.versioned", {"v": 1}, lock_key="k", idempotency_key="r")
    state = await finished(service, first.job_id)
    assert (state.status, state.result) == (JobStatus.SUCCEEDED, {"v": 1})
    again = await service.dl.enqueue(
        "t.versioned", {"v": 2, "fail": True}, lock_key="k", idempotency_key="r", rerun=True
    )
    assert again.job_id == first.job_id
    state = await finished(service, first.job_id)
    assert (state.status, state.error, state.result) == (JobStatus.FAILED, "Boom: version 2", None)
    assert state.duration_ms is not None


@pytest.mark.parametrize("how", ["lease expired", "handed back"])
async def test_an_attempt_that_is_lost_keeps_no_result_of_the_run_before(
    start_service: StartService, conn: asyncpg.Connection, how: str
) -> None:
    """A job succeeded with a result and was re-run; the re-run's only attempt is lost (its
    worker went silent, or handed it back once no refund was left): the job's result is not
    the earlier run's."""
    service = await start_service(run_workers=False)
    protocol = WorkerProtocol(service.context.pool)
    job = await service.dl.enqueue(
        "t.v", {"v": 1}, lock_key="k", queue="q", idempotency_key="v", max_attempts=1
    )
    (first,) = await protocol.claim("q", 1, "hand")
    assert await finish_claimed(protocol, first, Outcome(Ended.SUCCEEDED, result='{"v": 1}'), "w")
    await service.dl.enqueue(
        "t.v", {"v": 2}, lock_key="k", queue="q", idempotency_key="v", max_attempts=1, rerun=True
    )
    (second,) = await protocol.claim("q", 1, "hand")
    if how == "lease expired":
        await conn.execute(
            "UPDATE dl_jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = $1",
            job.job_id,
        )
        assert await Reaper(protocol, "test-reaper").run_once() == {"lost": 1}
    else:
        no_refund = Outcome(Ended.HANDED_BACK, "the lock connection was lost", refund=False)
        assert await finish_claimed(protocol, second, no_refund, "w")
    state = await service.dl.get(job.job_id)
    assert state is not None
    assert (state.status, state.result) == (JobStatus.LOST, None)
