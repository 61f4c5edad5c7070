"""Task contracts (workers/pipelines/contracts.py): what a task publishes of itself."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from dataloader import Exponential, JobContext, TaskRegistry
from dataloader.workers.pipelines.contracts import ANY_OBJECT, ANY_VALUE, task_spec


class LoadArgs(BaseModel):
    day: str
    rows: list[int] = []


class Loaded(BaseModel):
    rows: int


class Unsupported:
    """A type pydantic cannot describe as JSON."""


def build() -> TaskRegistry:
    registry = TaskRegistry()

    @registry.task(
        "etl.load",
        queue="etl",
        args=LoadArgs,
        priority=5,
        max_attempts=3,
        lease_ttl=120,
        retry=Exponential(base=2),
        timeout=30,
        non_retryable=(ValueError,),
    )
    async def load(ctx: JobContext[LoadArgs]) -> Loaded:
        return Loaded(rows=1)

    @registry.task("etl.count")
    async def count(ctx: JobContext[dict[str, Any]]) -> dict[str, int]:
        return {}

    @registry.task("etl.untyped")
    async def untyped(ctx):  # type: ignore[no-untyped-def]
        return 1

    @registry.task("etl.odd")
    async def odd(ctx: JobContext[dict[str, Any]]) -> Unsupported:
        return Unsupported()

    return registry


def spec(name: str) -> dict[str, Any]:
    task = build().get(name)
    assert task is not None
    return task_spec(task)


def test_a_task_publishes_its_options_and_the_schema_of_its_args_and_result() -> None:
    published = spec("etl.load")
    assert published["name"] == "etl.load"
    assert (published["queue"], published["priority"], published["max_attempts"]) == ("etl", 5, 3)
    assert (published["lease_ttl_sec"], published["timeout_sec"]) == (120, 30.0)
    assert published["retry"].startswith("Exponential(base=2")
    assert published["non_retryable"] == ["builtins.ValueError"]
    assert published["args_schema"] == LoadArgs.model_json_schema()
    assert published["result_schema"]["properties"] == {
        "rows": {"title": "Rows", "type": "integer"}
    }


def test_without_a_model_args_are_any_object_and_the_annotation_gives_the_result() -> None:
    published = spec("etl.count")
    assert published["args_schema"] == ANY_OBJECT
    assert published["result_schema"] == {
        "type": "object",
        "additionalProperties": {"type": "integer"},
    }
    assert (published["queue"], published["retry"], published["non_retryable"]) == (None, None, [])


def test_a_result_without_a_describable_type_promises_any_json_value() -> None:
    assert spec("etl.untyped")["result_schema"] == ANY_VALUE
    assert spec("etl.odd")["result_schema"] == ANY_VALUE


class Opaque:
    """A type only Python knows."""


class OpaqueArgs(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    handle: Opaque | None = None


def test_args_whose_schema_cannot_be_stated_publish_any_object() -> None:
    registry = TaskRegistry()

    @registry.task("odd.args", args=OpaqueArgs)
    async def odd(ctx: JobContext[OpaqueArgs]) -> None:
        return None

    task = registry.get("odd.args")
    assert task is not None
    assert task_spec(task)["args_schema"] == ANY_OBJECT
