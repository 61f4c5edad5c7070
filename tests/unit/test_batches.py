"""Batch handlers run inline (`dataloader.testing.run_batch`): each job goes where the worker
sends it after the handler's settlement, and the worker's statistics count what it did."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from dataloader import Batch, Fixed, JobStatus, TaskRegistry
from dataloader.testing import run_batch, run_task


class Order(BaseModel):
    n: int
    do: str = "done"


registry = TaskRegistry()


@registry.task("orders.settle", queue="orders", args=Order, batch_size=10, retry=Fixed(7))
async def settle(batch: Batch[Order]) -> None:
    """Settles each job as its args say; `leave` leaves it open, `boom` raises after."""
    for item in batch:
        match item.args.do:
            case "done":
                batch.done(item, {"n": item.args.n * 2})
            case "retry":
                batch.retry(item, after=timedelta(minutes=5), error="supplier busy")
            case "retry-default":
                batch.retry(item)
            case "fail":
                batch.fail(item, "no such order")
            case "unstorable":
                batch.done(item, {"at": object()})
    if any(item.args.do == "boom" for item in batch):
        raise ConnectionError("warehouse unreachable")


@registry.task("orders.final", queue="orders", batch_size=5, non_retryable=(KeyError,))
async def final(batch: Batch[dict[str, Any]]) -> None:
    batch.done(batch.items[0])
    raise KeyError("no retry helps")


@registry.task("orders.slow", queue="orders", batch_size=5, timeout=0.05)
async def slow(batch: Batch[dict[str, Any]]) -> None:
    batch.done(batch.items[0])
    await asyncio.sleep(60)


@registry.task("orders.single")
async def single(ctx: Any) -> None:
    return None


async def test_each_settlement_decides_its_job() -> None:
    run = await run_batch(
        "orders.settle",
        [
            {"n": 1},
            {"n": 2, "do": "retry"},
            {"n": 3, "do": "fail"},
            {"n": 4, "do": "leave"},
            {"n": 5, "do": "retry-default"},
        ],
        registry=registry,
    )
    done, retried, failed, left, policy = run.runs
    assert (done.status, done.result) == (JobStatus.SUCCEEDED, {"n": 2})
    assert (retried.status, retried.retry_in_sec, retried.error) == (
        JobStatus.QUEUED,
        300,
        "supplier busy",
    )
    assert (failed.status, failed.error) == (JobStatus.FAILED, "no such order")
    assert (left.status, left.error) == (JobStatus.QUEUED, "left unsettled by the batch handler")
    assert left.retry_in_sec == 7  # the task's retry policy
    assert policy.retry_in_sec == 7
    stats = run.stats
    assert (stats.processed, stats.errors, stats.retried) == (1, 4, 3)
    assert stats.last_error == "left unsettled by the batch handler"
    assert stats.duration_sec >= 0


async def test_a_retry_with_no_attempt_left_fails_the_job() -> None:
    run = await run_batch(
        "orders.settle", [{"n": 1, "do": "retry"}], registry=registry, attempt=3, max_attempts=3
    )
    assert run.runs[0].status == JobStatus.FAILED
    assert run.stats.retried == 0


async def test_a_handler_that_raises_fails_only_what_it_left_open() -> None:
    run = await run_batch("orders.settle", [{"n": 1}, {"n": 2, "do": "boom"}], registry=registry)
    assert run.runs[0].status == JobStatus.SUCCEEDED
    assert run.runs[1].status == JobStatus.QUEUED
    assert run.runs[1].error == "ConnectionError: warehouse unreachable"
    assert run.stats.last_error == "ConnectionError: warehouse unreachable"


async def test_a_non_retryable_error_fails_the_open_jobs_for_good() -> None:
    run = await run_batch("orders.final", [{}, {}, {}], registry=registry)
    assert [r.status for r in run.runs] == [JobStatus.SUCCEEDED] + [JobStatus.FAILED] * 2
    assert run.stats.retried == 0


async def test_the_timeout_cuts_the_call_and_fails_the_open_jobs() -> None:
    run = await run_batch("orders.slow", [{}, {}], registry=registry)
    assert run.runs[0].status == JobStatus.SUCCEEDED
    assert run.runs[1].status == JobStatus.QUEUED
    assert str(run.runs[1].error).startswith("TaskTimeout")


async def test_a_result_that_cannot_be_stored_fails_its_job() -> None:
    run = await run_batch("orders.settle", [{"n": 1, "do": "unstorable"}], registry=registry)
    assert run.runs[0].status == JobStatus.FAILED
    assert str(run.runs[0].error).startswith("result: ")


async def test_settling_twice_or_a_stranger_raises() -> None:
    seen: list[str] = []
    twice = TaskRegistry()

    @twice.task("t.twice", queue="t", batch_size=2)
    async def handler(batch: Batch[dict[str, Any]]) -> None:
        first, second = batch.items
        batch.done(first)
        for attempt in (
            lambda: batch.done(first),
            lambda: batch.retry(second, after=1, at=datetime.now(UTC)),
            lambda: batch.retry(second, at=datetime(2030, 1, 1)),
        ):
            try:
                attempt()
            except ValueError as exc:
                seen.append(str(exc))
        batch.retry(second, at=datetime.now(UTC) + timedelta(hours=1))

    run = await run_batch("t.twice", [{}, {}], registry=twice)
    assert len(seen) == 3
    assert "settled already" in seen[0]
    assert "not both" in seen[1]
    assert "time zone" in seen[2]
    retry_in = run.runs[1].retry_in_sec
    assert retry_in is not None
    assert 3500 < retry_in <= 3600


async def test_args_that_break_the_model_are_refused_as_enqueue_refuses_them() -> None:
    from dataloader import InvalidJobArgs

    with pytest.raises(InvalidJobArgs):
        await run_batch("orders.settle", [{"n": "one"}], registry=registry)


async def test_batched_and_single_tasks_name_their_runner() -> None:
    with pytest.raises(TypeError, match="run_batch"):
        await run_task("orders.settle", {"n": 1}, registry=registry)
    with pytest.raises(TypeError, match="run_task"):
        await run_batch("orders.single", [{}], registry=registry)


@pytest.mark.parametrize("size", [0, 1001, True, "5", 2.0])
def test_a_bad_batch_size_is_refused_at_once(size: Any) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        registry.task("t.bad", queue="t", batch_size=size)


def test_a_batched_task_names_its_queue() -> None:
    """Its queue's workers claim `batch_size` jobs at once: without a queue, none would."""
    with pytest.raises(ValueError, match="needs the task's queue"):
        registry.task("t.anywhere", batch_size=10)


def test_a_batch_size_of_one_is_a_single_task() -> None:
    one = TaskRegistry()
    one.task("t.one", batch_size=1)(single)
    found = one.get("t.one")
    assert found is not None
    assert not found.batched
