"""Unit tests of `TaskRegistry.task` (its option checks), `Task.check_args` (strict JSON), and
the older import paths of the definitions (`workers.pipelines.registry`)."""

from __future__ import annotations

import importlib
from datetime import date, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

import dataloader
from dataloader import tasks
from dataloader.core.retry import Exponential, Fixed
from dataloader.exceptions import InvalidJobArgs
from dataloader.tasks import Task, TaskRegistry
from dataloader.workers import batches, pipelines

#: The module itself: the package's attribute `registry` is the registry object.
old = importlib.import_module("dataloader.workers.pipelines.registry")


async def handler(ctx: Any) -> None:
    return None


async def other_handler(ctx: Any) -> None:
    return None


def registered(**options: Any) -> Task:
    """The task `t` as registered with `options`."""
    registry = TaskRegistry()
    registry.task("t", **options)(handler)
    found = registry.get("t")
    assert found is not None
    return found


# --- options ----------------------------------------------------------------------------------


def test_a_task_keeps_its_handler_and_options() -> None:
    found = registered(
        queue="etl",
        priority=5,
        max_attempts=7,
        lease_ttl=timedelta(minutes=2),
        retry=30,
        timeout=1.5,
        non_retryable=(KeyError,),
    )
    assert found.handler is handler
    assert (found.queue, found.priority, found.max_attempts, found.lease_ttl_sec) == (
        "etl",
        5,
        7,
        120,
    )
    assert found.retry == Fixed(30.0)
    assert found.timeout_sec == 1.5
    assert found.non_retryable == (KeyError,)


def test_options_left_out_stay_open() -> None:
    found = registered()
    assert (found.queue, found.priority, found.max_attempts, found.lease_ttl_sec) == (None,) * 4
    assert (found.retry, found.timeout_sec, found.args_model) == (None, None, None)
    assert found.non_retryable == ()


def test_the_decorator_returns_the_function_unchanged() -> None:
    assert TaskRegistry().task("t")(handler) is handler


def test_a_retry_policy_is_kept_as_it_is() -> None:
    policy = Exponential(base=5)
    assert registered(retry=policy).retry is policy


@pytest.mark.parametrize(
    ("queue", "problem"),
    [
        ("", "^queue: must not be empty$"),
        ("q" * 201, "^queue: must be at most 200 characters"),
        ("a\x00b", "^queue: must not contain NUL characters$"),
        (7, "^queue: must be a string, not int$"),
    ],
)
def test_a_bad_queue_name_is_refused(queue: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        TaskRegistry().task("t", queue=queue)  # type: ignore[arg-type]


def test_a_bad_task_name_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^task name: must not be empty$"):
        TaskRegistry().task("")


@pytest.mark.parametrize("priority", [-1, 2**31])
def test_a_priority_out_of_range_is_refused(priority: int) -> None:
    with pytest.raises(ValueError, match=r"^priority: must be between 0 and 2147483647"):
        TaskRegistry().task("t", priority=priority)


def test_a_boolean_priority_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^priority: must be an integer, not bool$"):
        TaskRegistry().task("t", priority=True)


@pytest.mark.parametrize("max_attempts", [0, 1001])
def test_max_attempts_out_of_range_is_refused(max_attempts: int) -> None:
    with pytest.raises(ValueError, match=r"^max_attempts: must be between 1 and 1000"):
        TaskRegistry().task("t", max_attempts=max_attempts)


def test_a_whole_float_lease_ttl_is_whole_seconds() -> None:
    assert registered(lease_ttl=90.0).lease_ttl_sec == 90
    assert isinstance(registered(lease_ttl=90.0).lease_ttl_sec, int)


@pytest.mark.parametrize("lease_ttl", [1.5, timedelta(milliseconds=1500), float("nan")])
def test_a_fractional_lease_ttl_is_refused(lease_ttl: float | timedelta) -> None:
    with pytest.raises(ValueError, match=r"^lease_ttl: must be whole seconds, not"):
        TaskRegistry().task("t", lease_ttl=lease_ttl)


@pytest.mark.parametrize("lease_ttl", [0, -60, timedelta(0), 2**31])
def test_a_lease_ttl_out_of_range_is_refused(lease_ttl: float | timedelta) -> None:
    with pytest.raises(ValueError, match=r"^lease_ttl: must be between 1 and 2147483647"):
        TaskRegistry().task("t", lease_ttl=lease_ttl)


@pytest.mark.parametrize(("lease_ttl", "kind"), [("60", "str"), (True, "bool")])
def test_a_lease_ttl_that_is_no_number_is_refused(lease_ttl: object, kind: str) -> None:
    with pytest.raises(ValueError, match=rf"^lease_ttl: must be an integer, not {kind}$"):
        TaskRegistry().task("t", lease_ttl=lease_ttl)  # type: ignore[arg-type]


def test_a_timeout_may_be_a_timedelta() -> None:
    assert registered(timeout=timedelta(minutes=1)).timeout_sec == 60


@pytest.mark.parametrize("timeout", [0, 0.0, timedelta(0)])
def test_a_timeout_of_zero_is_refused(timeout: float | timedelta) -> None:
    with pytest.raises(ValueError, match=r"^timeout must be more than 0 seconds$"):
        TaskRegistry().task("t", timeout=timeout)


@pytest.mark.parametrize("timeout", [-1, float("nan"), timedelta(seconds=-5)])
def test_a_negative_timeout_is_refused(timeout: float | timedelta) -> None:
    with pytest.raises(ValueError, match=r"^timeout must be between 0 and"):
        TaskRegistry().task("t", timeout=timeout)


def test_a_single_exception_class_is_taken_as_non_retryable() -> None:
    found = registered(non_retryable=KeyError)
    assert found.non_retryable == (KeyError,)


@pytest.mark.parametrize(
    "non_retryable", [(KeyError, "ValueError"), KeyError(), (int,), [KeyError]]
)
def test_non_retryable_must_hold_exception_classes(non_retryable: object) -> None:
    with pytest.raises(TypeError, match=r"^non_retryable must hold exception classes, not"):
        TaskRegistry().task("t", non_retryable=non_retryable)  # type: ignore[arg-type]


def test_args_must_be_a_model_class() -> None:
    with pytest.raises(TypeError, match=r"^args must be a pydantic model class"):
        TaskRegistry().task("t", args=dict)  # type: ignore[arg-type]


def test_a_retry_that_is_no_policy_is_refused() -> None:
    with pytest.raises(TypeError, match=r"^retry must be a policy"):
        TaskRegistry().task("t", retry="fast")  # type: ignore[arg-type]


def test_bad_options_are_refused_before_any_handler_is_given() -> None:
    registry = TaskRegistry()
    with pytest.raises(ValueError, match="priority"):
        registry.task("t", priority=-1)
    assert "t" not in registry


def test_a_handler_that_is_no_function_nor_a_plain_def_batch_is_refused() -> None:
    def sync_handler(ctx: Any) -> None:
        return None

    registry = TaskRegistry()
    with pytest.raises(TypeError, match=r"^task 't': a batch handler must be an `async def`"):
        registry.task("t", queue="q", batch_size=2)(sync_handler)
    with pytest.raises(TypeError, match=r"^task 't' must be an `async def` or a plain `def`"):
        registry.task("t")("not a function")  # type: ignore[type-var]

    async def generator(ctx: Any) -> Any:
        yield ctx

    with pytest.raises(TypeError, match=r"^task 't' must be an `async def` or a plain `def`"):
        registry.task("t")(generator)
    assert "t" not in registry
    registry.task("t")(sync_handler)  # a plain `def` task: run in a worker thread
    assert registry.get("t") is not None


def test_a_name_taken_by_another_handler_is_refused() -> None:
    registry = TaskRegistry()
    registry.task("t", queue="a")(handler)
    with pytest.raises(ValueError, match=r"^task 't' is already registered$"):
        registry.task("t", queue="b")(other_handler)
    found = registry.get("t")
    assert found is not None
    assert (found.handler, found.queue) == (handler, "a")


def test_registering_the_same_handler_again_replaces_its_options() -> None:
    # a module imported twice registers its tasks twice
    registry = TaskRegistry()
    registry.task("t", queue="a")(handler)
    registry.task("t", queue="b")(handler)
    found = registry.get("t")
    assert found is not None
    assert found.queue == "b"


def test_register_is_task_with_args_only() -> None:
    registry = TaskRegistry()
    registry.register("t", args=Args)(handler)
    found = registry.get("t")
    assert found is not None
    assert (found.args_model, found.queue) == (Args, None)


def test_a_copy_holds_the_same_tasks_and_grows_apart() -> None:
    registry = TaskRegistry()
    registry.task("a")(handler)
    clone = registry.copy()
    clone.task("b")(other_handler)
    assert list(clone) == ["a", "b"]
    assert list(registry) == ["a"]
    assert registry.get("b") is None


# --- check_args -------------------------------------------------------------------------------


class Inner(BaseModel):
    label: str


class Args(BaseModel):
    count: int
    ratio: float = 1.0
    day: date | None = None
    flag: bool = False
    inner: Inner | None = None
    items: list[int] = []


def checked(args: dict[str, Any]) -> None:
    registered(args=Args).check_args(args)


def refusal(args: dict[str, Any]) -> str:
    with pytest.raises(InvalidJobArgs) as raised:
        checked(args)
    return str(raised.value)


def test_args_that_satisfy_the_model_pass() -> None:
    checked({"count": 3, "ratio": 0.5, "day": "2024-01-02", "flag": True, "inner": {"label": "x"}})


def test_a_task_without_a_model_takes_any_object() -> None:
    registered().check_args({"anything": [1, "two", None]})


def test_a_whole_float_is_an_integer_as_json_schema_counts_it() -> None:
    checked({"count": 2.0, "items": [1.0, 2]})


def test_an_integer_is_a_number() -> None:
    checked({"count": 1, "ratio": 2})


def test_a_fractional_float_is_no_integer() -> None:
    assert refusal({"count": 2.5}).startswith("args.count: ")


def test_a_numeric_string_is_no_integer() -> None:
    assert refusal({"count": "5"}) == "args.count: Input should be a valid integer"


def test_a_boolean_is_no_integer() -> None:
    assert refusal({"count": True}) == "args.count: Input should be a valid integer"


def test_a_boolean_is_no_number() -> None:
    assert refusal({"count": 1, "ratio": False}).startswith("args.ratio: ")


def test_a_number_is_no_boolean() -> None:
    assert refusal({"count": 1, "flag": 1}).startswith("args.flag: ")


def test_a_date_may_be_given_as_its_json_string() -> None:
    checked({"count": 1, "day": "2024-02-29"})


def test_a_string_that_is_no_date_is_refused() -> None:
    assert refusal({"count": 1, "day": "yesterday"}).startswith("args.day: ")


def test_a_missing_field_is_refused_with_its_path() -> None:
    assert refusal({}) == "args.count: Field required"


def test_every_problem_is_listed_with_its_nested_path() -> None:
    message = refusal({"count": "x", "inner": {"label": 5}, "items": [1, "2"]})
    assert message.split("; ") == [
        "args.count: Input should be a valid integer",
        "args.inner.label: Input should be a valid string",
        "args.items.1: Input should be a valid integer",
    ]


def test_parse_args_is_lax_where_check_args_is_strict() -> None:
    # stored args were checked strictly when enqueued; reading them back converts freely
    task = registered(args=Args)
    parsed = task.parse_args({"count": "5"})
    assert isinstance(parsed, Args)
    assert parsed.count == 5


# --- where the definitions are imported from --------------------------------------------------


def test_the_registry_module_and_the_package_offer_the_same_definitions() -> None:
    for name in ("Task", "TaskRegistry", "Handler", "describe", "registry", "task"):
        assert getattr(old, name) is getattr(tasks, name), name
    for name in ("Task", "TaskRegistry", "registry", "task"):
        assert getattr(dataloader, name) is getattr(tasks, name), name
    # the older names
    assert old.Pipeline is tasks.Task
    assert old.PipelineRegistry is dataloader.PipelineRegistry is tasks.TaskRegistry
    assert pipelines.PipelineRegistry is tasks.TaskRegistry
    assert dataloader.pipeline == old.pipeline == tasks.registry.register
    assert batches.HandlerStats is dataloader.HandlerStats
