"""The rules of durable processes (`dataloader.core.processes`), without a database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from dataloader.core import limits
from dataloader.core.processes import (
    KEEP,
    NAMESPACE_MAX_CHARS,
    ZOMBIE_DETAIL,
    Before,
    Namespace,
    NewEvent,
    NewTimer,
    ProcessFacts,
    ProcessResult,
    ProcessStatus,
    Refusal,
    Remove,
    SetTimer,
    TaskArgs,
    TaskKind,
    UnsetTimer,
    admit,
    admit_start,
    after_step,
    before_step,
    check_namespace,
    check_process_id,
    idempotency_key_of,
    lock_key_of,
    namespace_of,
    on_failure,
    on_removal,
    on_zombie,
    priority_of,
    refusal_of,
    refused_error,
    task_name_of,
)

MAX = 1_000_000
TIMER = uuid.uuid4()
TASK = uuid.uuid4()


def running(timer: uuid.UUID | None = None, ref: int = 7) -> ProcessFacts:
    return ProcessFacts(ref, ProcessStatus.RUNNING, timer_task=timer)


def in_error(timer: uuid.UUID | None = None) -> ProcessFacts:
    return ProcessFacts(7, ProcessStatus.ERROR, timer_task=timer)


def args(kind: TaskKind, ref: int = 7, timer: bool | None = None) -> TaskArgs:
    if timer is None:
        timer = kind is TaskKind.TIMEOUT
    return TaskArgs(ref, "order-1", kind, None if timer else {"x": 1}, timer)


# admission ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [TaskKind.CALL, TaskKind.REPAIR, TaskKind.REMOVE])
def test_nothing_is_accepted_for_a_process_that_does_not_exist(kind: TaskKind) -> None:
    assert admit(kind, None) is Refusal.NOT_FOUND
    assert not Refusal.NOT_FOUND.conflict


def test_a_call_goes_to_a_running_or_starting_process_and_not_to_one_in_error() -> None:
    assert admit(TaskKind.CALL, running()) is None
    assert admit(TaskKind.CALL, ProcessFacts(7, ProcessStatus.INIT)) is None
    assert admit(TaskKind.CALL, in_error()) is Refusal.IN_ERROR
    assert Refusal.IN_ERROR.conflict


def test_a_repair_goes_only_to_a_process_in_error() -> None:
    assert admit(TaskKind.REPAIR, in_error()) is None
    assert admit(TaskKind.REPAIR, running()) is Refusal.NOT_IN_ERROR


def test_a_removal_goes_to_any_process() -> None:
    assert admit(TaskKind.REMOVE, running()) is None
    assert admit(TaskKind.REMOVE, in_error()) is None


def test_a_start_of_a_taken_id_returns_it_with_the_same_args_and_is_refused_with_others() -> None:
    taken = ProcessFacts(7, ProcessStatus.RUNNING, init_args_json='{"a": 1, "b": [1, 2]}')
    assert admit_start(None, "{}") is None
    assert admit_start(taken, '{"b":[1,2],"a":1}') is None  # the same JSON, spelt otherwise
    assert admit_start(taken, '{"a": 2, "b": [1, 2]}') is Refusal.STARTED_WITH_OTHER_ARGS


# before a step -------------------------------------------------------------------------------


@pytest.mark.parametrize("refusal", list(Refusal))
def test_a_task_refused_when_it_runs_says_so_in_its_error(refusal: Refusal) -> None:
    assert refusal_of(refused_error(refusal, "why")) is refusal


@pytest.mark.parametrize(
    "error",
    [None, "", "RuntimeError: refused (in_error): no", "refused (other): x", "refused (in_error)"],
)
def test_no_other_error_reads_as_a_refusal(error: str | None) -> None:
    assert refusal_of(error) is None


def test_a_task_of_a_running_process_runs() -> None:
    assert before_step(running(), args(TaskKind.CALL), TASK, 1, idempotent=False) is Before.RUN


def test_a_task_of_a_removed_process_or_of_another_incarnation_is_gone() -> None:
    assert before_step(None, args(TaskKind.CALL), TASK, 1, idempotent=False) is Before.GONE
    again = running(ref=8)  # the id was removed and started anew
    assert before_step(again, args(TaskKind.CALL, ref=7), TASK, 1, idempotent=False) is Before.GONE


def test_a_timer_that_is_no_longer_pending_never_fires() -> None:
    other = uuid.uuid4()
    for kind in (TaskKind.TIMEOUT, TaskKind.REMOVE):
        timer = args(kind, timer=True)
        assert before_step(running(other), timer, TIMER, 1, idempotent=True) is (Before.STALE_TIMER)
        assert before_step(running(None), timer, TIMER, 1, idempotent=True) is Before.STALE_TIMER
        assert before_step(running(TIMER), timer, TIMER, 1, idempotent=True) is Before.RUN


def test_a_callers_removal_is_no_timer_and_runs_whatever_the_timer() -> None:
    removal = args(TaskKind.REMOVE, timer=False)
    assert before_step(running(TIMER), removal, TASK, 1, idempotent=False) is Before.RUN


def test_only_a_repair_or_a_removal_runs_on_a_process_in_error() -> None:
    assert before_step(in_error(), args(TaskKind.CALL), TASK, 1, idempotent=False) is (
        Before.IN_ERROR
    )
    assert before_step(in_error(), args(TaskKind.REPAIR), TASK, 1, idempotent=False) is Before.RUN
    assert before_step(in_error(), args(TaskKind.REMOVE), TASK, 1, idempotent=False) is Before.RUN


@pytest.mark.parametrize("status", [ProcessStatus.INIT, ProcessStatus.RUNNING])
def test_a_repair_that_comes_to_run_on_a_process_not_in_error_is_refused(
    status: ProcessStatus,
) -> None:
    """Repairs admitted together: the first returns the process to `running`, the others
    find it so when they run."""
    process = ProcessFacts(7, status)
    assert before_step(process, args(TaskKind.REPAIR), TASK, 1, idempotent=True) is (
        Before.NOT_IN_ERROR
    )


def test_a_second_attempt_is_a_zombie_unless_the_processor_is_idempotent() -> None:
    task = args(TaskKind.CALL)
    assert before_step(running(), task, TASK, 2, idempotent=False) is Before.ZOMBIE
    assert before_step(running(), task, TASK, 2, idempotent=True) is Before.RUN


# after a step --------------------------------------------------------------------------------


def test_a_step_appends_its_events_and_sets_what_it_returned() -> None:
    result = ProcessResult(
        events=[{"paid": 10}, NewEvent("shipped", {"by": "dhl"})],
        aux_state={"n": 2},
        detail="waiting",
        response={"ok": True},
    )
    write = after_step(running(), args(TaskKind.CALL), TASK, result, MAX)
    assert write.status is ProcessStatus.RUNNING
    assert write.events == (('{"paid": 10}', None), ('"shipped"', '{"by": "dhl"}'))
    assert write.aux_state_json == '{"n": 2}'
    assert write.detail == "waiting"
    assert write.response_json == '{"ok": true}'
    assert write.metadata_json is KEEP
    assert (write.cancel_timer, write.clear_timer, write.new_timer) == (None, False, None)
    assert not write.cancel_queued
    assert not write.removed


def test_a_step_that_returns_nothing_new_keeps_state_detail_and_timer() -> None:
    write = after_step(running(TIMER), args(TaskKind.CALL), TASK, ProcessResult(), MAX)
    assert write.aux_state_json is KEEP
    assert write.detail is KEEP
    assert write.cancel_timer is None
    assert not write.clear_timer


def test_a_timer_that_fires_is_no_longer_pending() -> None:
    write = after_step(running(TIMER), args(TaskKind.TIMEOUT), TIMER, ProcessResult(), MAX)
    assert write.clear_timer
    assert write.cancel_timer is None
    assert write.response_json is None  # nobody waits for a timer


def test_a_new_timer_replaces_the_pending_one() -> None:
    write = after_step(
        running(TIMER), args(TaskKind.CALL), TASK, ProcessResult(action=SetTimer(in_sec=30)), MAX
    )
    assert write.cancel_timer == TIMER
    assert write.clear_timer
    assert write.new_timer == NewTimer(TaskKind.TIMEOUT, 30, None)


def test_a_timer_that_fires_and_sets_the_next_one_cancels_nothing() -> None:
    write = after_step(
        running(TIMER), args(TaskKind.TIMEOUT), TIMER, ProcessResult(action=SetTimer(60)), MAX
    )
    assert write.cancel_timer is None
    assert write.new_timer is not None


def test_unset_cancels_the_pending_timer() -> None:
    write = after_step(
        running(TIMER), args(TaskKind.CALL), TASK, ProcessResult(action=UnsetTimer()), MAX
    )
    assert write.cancel_timer == TIMER
    assert write.clear_timer
    assert write.new_timer is None


def test_remove_later_is_a_remove_timer_in_place_of_the_pending_one() -> None:
    at = datetime(2030, 1, 1, tzinfo=UTC)
    write = after_step(
        running(TIMER), args(TaskKind.CALL), TASK, ProcessResult(action=Remove(at=at)), MAX
    )
    assert write.new_timer == NewTimer(TaskKind.REMOVE, None, at)
    assert write.cancel_timer == TIMER
    assert not write.removed


def test_remove_now_removes_the_process_and_cancels_everything_queued() -> None:
    write = after_step(
        running(TIMER), args(TaskKind.CALL), TASK, ProcessResult(action=Remove()), MAX
    )
    assert write.removed
    assert write.status is None
    assert write.cancel_timer == TIMER
    assert write.cancel_queued


def test_a_repair_clears_the_error_it_repaired() -> None:
    write = after_step(in_error(), args(TaskKind.REPAIR), TASK, ProcessResult(), MAX)
    assert write.status is ProcessStatus.RUNNING
    assert write.corrupted_by is None
    assert write.detail is None
    kept = after_step(in_error(), args(TaskKind.REPAIR), TASK, ProcessResult(detail="fixed"), MAX)
    assert kept.detail == "fixed"


@pytest.mark.parametrize(
    ("result", "named"),
    [
        (ProcessResult(events="abc"), "events must be a list"),
        (ProcessResult(events=[float("nan")]), "event 1"),
        (ProcessResult(aux_state={"big": "x" * 2000}), "aux_state"),
        (ProcessResult(response=object()), "response"),
        (ProcessResult(metadata=["a"]), "metadata"),  # type: ignore[arg-type]
    ],
)
def test_a_result_that_cannot_be_stored_is_refused_naming_the_part(
    result: ProcessResult, named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        after_step(running(), args(TaskKind.CALL), TASK, result, 1000)


def test_a_processor_that_returns_something_else_is_told_what_to_return() -> None:
    with pytest.raises(ValueError, match="returns a ProcessResult, not dict"):
        after_step(running(), args(TaskKind.CALL), TASK, {"events": []}, MAX)  # type: ignore[arg-type]


# failures, zombies, removals -------------------------------------------------------------------


def test_a_failure_puts_the_process_in_error_and_cancels_its_timer_and_queued_tasks() -> None:
    write = on_failure(running(TIMER), TASK, "boom\x00")
    assert write.status is ProcessStatus.ERROR
    assert write.detail == "boom"
    assert write.corrupted_by == TASK
    assert write.cancel_timer == TIMER
    assert write.clear_timer
    assert write.cancel_queued


def test_a_zombie_puts_the_process_in_error_as_zombie_detected() -> None:
    write = on_zombie(running(TIMER), TASK)
    assert (write.status, write.detail, write.corrupted_by) == (
        ProcessStatus.ERROR,
        ZOMBIE_DETAIL,
        TASK,
    )
    assert write.cancel_timer == TIMER


def test_a_zombie_timer_does_not_cancel_itself() -> None:
    assert on_zombie(running(TIMER), TIMER).cancel_timer is None


def test_a_removal_removes_without_the_processor() -> None:
    write = on_removal(running(TIMER), TIMER)  # the remove timer itself fires
    assert write.removed
    assert write.cancel_timer is None
    assert write.cancel_queued


# names, keys, job args -------------------------------------------------------------------------


def test_task_names_map_to_namespaces_and_back() -> None:
    assert task_name_of("orders") == "process:orders"
    assert namespace_of("process:orders") == "orders"
    assert namespace_of("orders") is None


def test_lock_keys_of_distinct_processes_are_distinct() -> None:
    assert lock_key_of("a:b", "c") != lock_key_of("a", "b:c")


def test_idempotency_keys_are_bounded_and_belong_to_one_incarnation() -> None:
    long = "🙂" * limits.IDEMPOTENCY_KEY_MAX_CHARS
    key = idempotency_key_of(7, TaskKind.CALL, long)
    assert len(key.encode()) < 100
    assert key != idempotency_key_of(8, TaskKind.CALL, long)
    assert key != idempotency_key_of(7, TaskKind.REPAIR, long)


def test_job_args_carry_the_task_and_refuse_anything_else() -> None:
    task = TaskArgs(7, "p", TaskKind.TIMEOUT, [1, 2], timer=True)
    assert TaskArgs.of_job(task.as_job_args()) == task
    with pytest.raises(ValueError, match="not the args of a process task"):
        TaskArgs.of_job({"process_ref": 7, "kind": "dance", "process_id": "p"})


def test_timers_are_claimed_after_external_tasks() -> None:
    assert priority_of(True, 100) > priority_of(False, 100) == 100


def test_a_process_id_is_bounded_in_characters() -> None:
    assert check_process_id("x" * 400) == "x" * 400
    with pytest.raises(ValueError, match="at most 400 characters"):
        check_process_id("x" * 401)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"history": -1}, "history"),
        ({"step_timeout_sec": 0}, "step_timeout_sec"),
        ({"priority": limits.INT32_MAX}, "priority"),
        ({"attempts": 0}, "between"),
    ],
)
def test_a_namespace_refuses_options_out_of_bounds(options: dict[str, int], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Namespace("orders", "orders", **options)  # type: ignore[arg-type]


def test_timers_take_one_time() -> None:
    with pytest.raises(ValueError, match="one of in_sec and at"):
        SetTimer()
    with pytest.raises(ValueError, match="one of in_sec and at"):
        SetTimer(1, datetime.now(UTC))
    with pytest.raises(ValueError, match="between 0"):
        Remove(in_sec=-1)
    assert Remove().now
    assert not Remove(in_sec=0).now


def test_a_namespace_is_short_enough_for_its_task_name_to_be_a_name() -> None:
    longest = "n" * NAMESPACE_MAX_CHARS
    assert limits.check_name(task_name_of(check_namespace(longest)))
    with pytest.raises(ValueError, match=f"at most {NAMESPACE_MAX_CHARS} characters"):
        check_namespace(longest + "n")
