"""`dataloader.testing.ProcessHarness`: a processor unit-tested without a database, by the rules
the workers follow."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dataloader import (
    Process,
    ProcessConflict,
    ProcessNotFound,
    ProcessResult,
    ProcessStatus,
    ProcessTask,
    ProcessTaskFailed,
    TaskKind,
    TaskRegistry,
)
from dataloader.core.processes import ZOMBIE_DETAIL
from dataloader.testing import ProcessHarness
from tests.orders import DAY, registry


@pytest.fixture
def orders() -> ProcessHarness:
    return ProcessHarness("orders", registry=registry)


async def test_a_start_runs_init_and_answers_with_its_response(orders: ProcessHarness) -> None:
    assert await orders.start("o-1", {"total": 10}) == {"state": "awaiting_payment"}
    process = orders.get("o-1")
    assert process is not None
    assert process.status is ProcessStatus.RUNNING
    assert [e.payload for e in process.history] == [{"created": {"total": 10}}]
    assert process.timer is not None
    assert process.timer.kind is TaskKind.TIMEOUT
    assert process.timer.due_at == orders.now + timedelta(days=1)


async def test_a_start_again_with_the_same_args_answers_the_same_and_with_others_conflicts(
    orders: ProcessHarness,
) -> None:
    first = await orders.start("o-1", {"total": 10})
    assert await orders.start("o-1", {"total": 10}) == first
    with pytest.raises(ProcessConflict) as refused:
        await orders.start("o-1", {"total": 11})
    assert refused.value.reason == "started_with_other_args"
    assert len(orders.tasks) == 1  # nothing ran again


async def test_timers_fire_in_turn_as_the_clock_moves(orders: ProcessHarness) -> None:
    await orders.start("o-1", {"total": 10})
    assert await orders.advance(DAY - 1) == []
    assert await orders.advance(1) == [("o-1", TaskKind.TIMEOUT)]
    assert await orders.advance(timedelta(days=1)) == [("o-1", TaskKind.TIMEOUT)]
    process = orders.get("o-1")
    assert process is not None
    assert process.aux_state["state"] == "canceled"
    assert process.detail == "unpaid"
    assert process.timer is None
    assert [e.event_id for e in process.history] == [1, 2, 3]


async def test_a_paid_order_unsets_its_reminder_and_is_removed_a_week_later(
    orders: ProcessHarness,
) -> None:
    await orders.start("o-1", {"total": 10})
    assert await orders.call("o-1", {"pay": 10}) == {"state": "paid"}
    process = orders.get("o-1")
    assert process is not None
    assert process.timer is not None
    assert process.timer.kind is TaskKind.REMOVE
    assert await orders.advance(timedelta(days=7)) == [("o-1", TaskKind.REMOVE)]
    assert orders.get("o-1") is None
    with pytest.raises(ProcessNotFound):
        await orders.call("o-1", {})
    assert await orders.start("o-1", {"total": 5}) == {"state": "awaiting_payment"}  # anew


async def test_a_failing_processor_is_called_again_then_puts_the_process_in_error(
    orders: ProcessHarness,
) -> None:
    await orders.start("o-1", {"total": 10})
    with pytest.raises(ProcessTaskFailed, match="RuntimeError: bad"):
        await orders.call("o-1", {"boom": "bad"})
    process = orders.get("o-1")
    assert process is not None
    assert process.status is ProcessStatus.ERROR
    assert process.detail == "RuntimeError: bad"
    assert process.corrupted_by == orders.tasks[-1][2]
    assert process.timer is None  # canceled with the error
    with pytest.raises(ProcessConflict) as refused:
        await orders.call("o-1", {})
    assert refused.value.reason == "in_error"
    assert await orders.repair("o-1") == {"repaired": True}
    process = orders.get("o-1")
    assert process is not None
    assert process.status is ProcessStatus.RUNNING
    assert process.corrupted_by is None
    assert process.detail is None


async def test_a_processor_is_given_only_the_last_events_of_its_history() -> None:
    seen: list[int] = []
    local = TaskRegistry()

    @local.process("window", history=3)
    async def window(task: ProcessTask, process: Process) -> ProcessResult:
        seen.append(len(process.history))
        return ProcessResult(events=[task.kind.value])

    harness = ProcessHarness("window", registry=local)
    await harness.start("w")
    for _ in range(5):
        await harness.call("w")
    assert seen == [0, 1, 2, 3, 3, 3]
    process = harness.get("w")
    assert process is not None
    assert process.last_event_id == 6


async def test_a_processor_attempts_are_counted_and_their_delays_pass_on_its_clock() -> None:
    attempts: list[int] = []
    local = TaskRegistry()

    @local.process("flaky", attempts=3, retry=60)
    async def flaky(task: ProcessTask, process: Process) -> ProcessResult:
        attempts.append(task.attempt)
        if task.attempt < 3:
            raise RuntimeError("not yet")
        return ProcessResult(response="ok")

    harness = ProcessHarness("flaky", registry=local)
    before = harness.now
    assert await harness.start("f") == "ok"
    assert attempts == [1, 2, 3]
    assert harness.now - before == timedelta(seconds=120)


async def test_a_zombie_puts_a_process_in_error_unless_its_processor_is_idempotent(
    orders: ProcessHarness,
) -> None:
    await orders.start("o-1", {"total": 10})
    await orders.zombie("o-1")
    process = orders.get("o-1")
    assert process is not None
    assert process.status is ProcessStatus.ERROR
    assert process.detail == ZOMBIE_DETAIL


def test_a_harness_needs_a_registered_processor() -> None:
    with pytest.raises(LookupError, match="no processor is registered for namespace 'nope'"):
        ProcessHarness("nope", registry=TaskRegistry())
