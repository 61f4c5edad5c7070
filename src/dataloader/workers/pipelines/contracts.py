"""What a task promises its producers: its queue, options, and the JSON Schemas of its args and
of its result. Live workers publish it (`dl_workers.task_specs`), `GET /api/v1/tasks` lists
it, so that another service can validate what it sends before it triggers.

The args schema is the args model's (`@task(args=Model)`; any JSON object without one); the
result schema comes from the handler's return annotation (`-> dict[str, int]`, a model…;
any JSON value when there is none, or when it names a type JSON cannot hold).
"""

from __future__ import annotations

import typing
from dataclasses import is_dataclass
from typing import Any

from pydantic import TypeAdapter

from dataloader.tasks import Task, TaskRegistry

#: The schema of any JSON object (a task without an args model takes any).
ANY_OBJECT: dict[str, Any] = {"type": "object"}
#: The schema of any JSON value (a result whose type is not declared).
ANY_VALUE: dict[str, Any] = {}


def task_spec(task: Task) -> dict[str, Any]:
    """The task's contract as JSON: name, queue, options, args and result schemas. Options
    left unset are null: the enqueue call's value, else the settings' default, applies."""
    return {
        "name": task.name,
        "queue": task.queue,
        "priority": task.priority,
        "max_attempts": task.max_attempts,
        "lease_ttl_sec": task.lease_ttl_sec,
        "timeout_sec": task.timeout_sec,
        "retry": None if task.retry is None else _policy_name(task.retry),
        "non_retryable": [_qualified(t) for t in task.non_retryable],
        "batch_size": task.batch_size if task.batched else None,
        "args_schema": args_schema(task),
        "result_schema": result_schema(task),
    }


def args_schema(task: Task) -> dict[str, Any]:
    """The JSON Schema of the task's args: its model's (any object without one, or when the
    model holds a type JSON Schema cannot state: publishing must never stop a worker)."""
    if task.args_model is None:
        return ANY_OBJECT
    try:
        return task.args_model.model_json_schema()
    except Exception:
        return ANY_OBJECT


def registry_specs(registry: TaskRegistry) -> dict[str, dict[str, Any]]:
    """{task name: its contract} for every task of `registry`."""
    specs = {}
    for name in registry:
        task = registry.get(name)
        if task is not None:
            specs[name] = task_spec(task)
    return specs


def result_schema(task: Task) -> dict[str, Any]:
    """The JSON Schema of what the handler returns, from its return annotation."""
    try:
        returned = typing.get_type_hints(task.handler).get("return", Any)
    except Exception:  # an annotation that does not resolve here: promise nothing
        return ANY_VALUE
    if returned is Any:
        return ANY_VALUE
    try:
        schema: dict[str, Any] = TypeAdapter(returned).json_schema(mode="serialization")
    except Exception:  # a type pydantic cannot describe
        return ANY_VALUE
    return schema


def _policy_name(policy: object) -> str:
    """A retry policy as text that is the same in every process: a policy object's repr
    (`Exponential(base=5.0, …)`), a function's qualified name."""
    if is_dataclass(policy):
        return repr(policy)
    return _qualified(policy)


def _qualified(obj: object) -> str:
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{module}.{name}" if module else name
