"""Unit tests of `dataloader.core.models`: a new job's checks and how its options are filled."""

from __future__ import annotations

import dataclasses
import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from dataloader.core.limits import NAME_MAX_CHARS
from dataloader.core.models import (
    DEFAULT_LEASE_TTL_SEC,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY,
    FILLED_OPTIONS,
    JobDefaults,
    JobOptions,
    NewJob,
    new_job_id,
)
from dataloader.exceptions import InvalidJob
from dataloader.tasks import Task

NOON = datetime(2030, 1, 1, 12, tzinfo=UTC)


def new_job(**fields: Any) -> NewJob:
    return NewJob(**{"task": "etl.load", "lock_key": "k", **fields})


def refused(**fields: Any) -> InvalidJob:
    """The InvalidJob a NewJob with `fields` raises."""
    with pytest.raises(InvalidJob) as raised:
        new_job(**fields)
    return raised.value


async def handler(ctx: Any) -> None:
    return None


def task(**options: Any) -> Task:
    return Task(name="etl.load", handler=handler, **options)


# --- validation -------------------------------------------------------------------------------


def test_a_minimal_job_is_valid_and_leaves_its_options_open() -> None:
    job = new_job()
    assert job.args == {}
    assert job.args_json == "{}"
    assert job.partition_key == ""
    assert (job.queue, job.priority, job.max_attempts, job.lease_ttl_sec) == (None,) * 4
    assert not job.is_resolved
    assert job.delay_sec is None


def test_args_are_kept_as_the_json_text_that_is_sent() -> None:
    job = new_job(args={"day": "2024-01-01", "n": 3, "städte": ["Köln"]})
    assert job.args_json == '{"day": "2024-01-01", "n": 3, "städte": ["Köln"]}'


def test_args_given_as_a_model_are_stored_as_its_json_object() -> None:
    class LoadArgs(BaseModel):
        day: datetime
        rows: int

    job = new_job(args=LoadArgs(day=NOON, rows=5))
    assert job.args == {"day": "2030-01-01T12:00:00Z", "rows": 5}
    assert job.args_json == '{"day": "2030-01-01T12:00:00Z", "rows": 5}'


@pytest.mark.parametrize(
    ("fields", "field", "problem"),
    [
        ({"task": ""}, "task", "must not be empty"),
        ({"task": "t" * (NAME_MAX_CHARS + 1)}, "task", "must be at most 200 characters"),
        ({"task": 5}, "task", "must be a string, not int"),
        ({"lock_key": ""}, "lock_key", "must not be empty"),
        ({"lock_key": "a\x00b"}, "lock_key", "must not contain NUL characters"),
        ({"lock_key": "x" * 1001}, "lock_key", "must be at most 1000 characters"),
        ({"queue": ""}, "queue", "must not be empty"),
        ({"queue": "q\ud800"}, "queue", "must not contain unpaired surrogates"),
        ({"idempotency_key": ""}, "idempotency_key", "must not be empty"),
        ({"idempotency_key": "i" * 601}, "idempotency_key", "must be at most 600 characters"),
        ({"partition_key": None}, "partition_key", "must be a string, not NoneType"),
        ({"partition_key": "p" * 1001}, "partition_key", "must be at most 1000 characters"),
        ({"priority": -1}, "priority", "must be between 0 and 2147483647, not -1"),
        ({"priority": 2**31}, "priority", "must be between 0 and 2147483647"),
        ({"priority": True}, "priority", "must be an integer, not bool"),
        ({"priority": 1.0}, "priority", "must be an integer, not float"),
        ({"max_attempts": 0}, "max_attempts", "must be between 1 and 1000, not 0"),
        ({"max_attempts": 1001}, "max_attempts", "must be between 1 and 1000"),
        ({"lease_ttl_sec": 0}, "lease_ttl_sec", "must be between 1 and 2147483647, not 0"),
        ({"lease_ttl_sec": "60"}, "lease_ttl_sec", "must be an integer, not str"),
        ({"available_at": datetime(2030, 1, 1)}, "available_at", "must have a time zone"),
        ({"available_at": "2030-01-01"}, "available_at", "must be a datetime, not str"),
        ({"producer": ""}, "producer", "must not be empty"),
        ({"consumer_group": "c" * 201}, "consumer_group", "must be at most 200 characters"),
        ({"args": []}, "args", "must be a JSON object (a dict), not list"),
        ({"args": {"x": float("nan")}}, "args", "NaN and Infinity are not valid JSON"),
        ({"args": {"x": "a\x00"}}, "args", "must not contain NUL characters"),
        ({"args": {"x": object()}}, "args", "not JSON"),
    ],
)
def test_a_field_out_of_bounds_is_refused_naming_the_field(
    fields: dict[str, Any], field: str, problem: str
) -> None:
    error = refused(**fields)
    assert error.field == field
    assert problem in error.problem
    assert str(error).startswith(f"{field}: ")
    assert isinstance(error, ValueError)


def test_an_empty_partition_key_is_the_default_and_valid() -> None:
    assert new_job(partition_key="").partition_key == ""


def test_the_bounds_themselves_are_accepted() -> None:
    job = new_job(priority=0, max_attempts=1000, lease_ttl_sec=1, queue="q" * NAME_MAX_CHARS)
    assert (job.priority, job.max_attempts, job.lease_ttl_sec) == (0, 1000, 1)


def test_delay_counts_in_seconds() -> None:
    assert new_job(delay=timedelta(minutes=1, milliseconds=500)).delay_sec == 60.5


def test_a_zero_delay_is_valid() -> None:
    assert new_job(delay=timedelta(0)).delay_sec == 0


@pytest.mark.parametrize("delay", [timedelta(seconds=-1), timedelta(days=3651)])
def test_a_delay_out_of_range_is_refused(delay: timedelta) -> None:
    error = refused(delay=delay)
    assert (error.field, error.problem) == ("delay", "must be a timedelta from 0 to 3650 days")


def test_a_delay_that_is_no_timedelta_is_refused() -> None:
    assert refused(delay=30).field == "delay"


def test_delay_and_available_at_together_are_refused() -> None:
    error = refused(delay=timedelta(seconds=5), available_at=NOON)
    assert (error.field, error.problem) == ("delay", "give available_at or delay, not both")


def test_available_at_alone_is_valid() -> None:
    assert new_job(available_at=NOON).available_at == NOON


def test_rerun_needs_an_idempotency_key() -> None:
    error = refused(rerun=True)
    assert (error.field, error.problem) == (
        "rerun",
        "re-running on update needs an idempotency_key",
    )


def test_rerun_with_an_idempotency_key_is_valid() -> None:
    assert new_job(rerun=True, idempotency_key="day-1").rerun


def test_a_new_job_cannot_be_changed() -> None:
    job = new_job()
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.queue = "other"  # type: ignore[misc]


def test_args_json_takes_no_part_in_equality() -> None:
    assert new_job(args={"a": 1, "b": 2}) == new_job(args={"b": 2, "a": 1})


# --- resolved ---------------------------------------------------------------------------------

DEFAULTS = JobDefaults(priority=50, max_attempts=4, lease_ttl_sec=30)


def test_the_defaults_are_the_specs() -> None:
    assert JobDefaults() == JobDefaults(
        priority=DEFAULT_PRIORITY,
        max_attempts=DEFAULT_MAX_ATTEMPTS,
        lease_ttl_sec=DEFAULT_LEASE_TTL_SEC,
    )
    assert (DEFAULT_PRIORITY, DEFAULT_MAX_ATTEMPTS, DEFAULT_LEASE_TTL_SEC) == (100, 5, 60)


def filled(job: NewJob, of_task: Task | None) -> tuple[Any, ...]:
    """The job's queue, priority, max_attempts and lease_ttl_sec as they are inserted."""
    options = JobOptions.of(of_task, DEFAULTS)
    job.check_queue(options)
    return tuple(options.fill(job, name) for name in FILLED_OPTIONS)


def test_the_jobs_own_values_win_over_the_tasks_and_the_defaults() -> None:
    job = new_job(queue="mine", priority=1, max_attempts=2, lease_ttl_sec=3)
    of_task = task(queue="its", priority=10, max_attempts=20, lease_ttl_sec=30)
    assert filled(job, of_task) == ("mine", 1, 2, 3)


def test_the_tasks_values_win_over_the_defaults() -> None:
    of_task = task(queue="its", priority=10, max_attempts=20, lease_ttl_sec=300)
    assert filled(new_job(), of_task) == ("its", 10, 20, 300)


def test_the_defaults_fill_what_neither_job_nor_task_gives() -> None:
    assert filled(new_job(priority=7), task(queue="its", max_attempts=9)) == ("its", 7, 9, 30)


def test_without_a_task_the_defaults_fill_the_options() -> None:
    assert filled(new_job(queue="q"), None) == ("q", 50, 4, 30)


def test_a_priority_of_zero_is_the_jobs_own_value_not_a_gap() -> None:
    assert filled(new_job(queue="q", priority=0), task(priority=9))[1] == 0


def test_a_job_without_a_queue_whose_task_names_none_is_refused() -> None:
    with pytest.raises(InvalidJob) as raised:
        filled(new_job(), task())
    assert raised.value.field == "queue"
    assert raised.value.problem == "required: task 'etl.load' does not name its queue"


def test_a_job_without_a_queue_or_a_task_is_refused() -> None:
    with pytest.raises(InvalidJob, match=r"^queue: required"):
        filled(new_job(), None)


def test_a_job_with_every_option_is_resolved() -> None:
    assert new_job(queue="q", priority=1, max_attempts=2, lease_ttl_sec=3).is_resolved
    assert not new_job(queue="q", priority=1, max_attempts=2).is_resolved


def test_the_tasks_values_are_not_checked_again() -> None:
    # the task's and the settings' values were checked when they were made; a value that
    # slipped past (a Task built by hand) is taken as it is, not refused here
    assert filled(new_job(), task(queue="q", priority=-5))[1] == -5


def test_a_new_job_id_is_a_version_7_uuid_holding_the_time_it_was_made() -> None:
    before = time.time_ns() // 1_000_000
    job_id = new_job_id()
    after = time.time_ns() // 1_000_000
    assert (job_id.version, job_id.variant) == (7, "specified in RFC 4122")
    assert before <= job_id.int >> 80 <= after


def test_job_ids_made_in_later_milliseconds_sort_after_earlier_ones() -> None:
    first = new_job_id()
    while time.time_ns() // 1_000_000 <= first.int >> 80:  # the next millisecond
        pass
    assert all(new_job_id() > first for _ in range(100))


def test_job_ids_made_in_one_millisecond_differ() -> None:
    assert len({new_job_id() for _ in range(10_000)}) == 10_000


def test_job_ids_increase_within_a_millisecond_in_the_order_they_were_made() -> None:
    """The jobs of one call share their created_at: their ids give their claim order."""
    ids = [new_job_id() for _ in range(10_000)]
    assert len({i.int >> 80 for i in ids}) < len(ids)  # several in one millisecond
    assert all(a < b for a, b in itertools.pairwise(ids))
    assert all((i.version, i.variant) == (7, "specified in RFC 4122") for i in ids)


def test_job_ids_keep_increasing_when_the_clock_steps_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = new_job_id()
    stepped_back = (first.int >> 80) - 5_000  # five seconds earlier
    monkeypatch.setattr(time, "time_ns", lambda: stepped_back * 1_000_000)
    later = [new_job_id() for _ in range(100)]
    assert first < later[0]
    assert all(a < b for a, b in itertools.pairwise(later))
    assert {i.int >> 80 for i in later} == {first.int >> 80}  # the last millisecond kept
