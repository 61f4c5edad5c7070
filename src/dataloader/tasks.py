"""Tasks keyed by name: what users register and trigger.

    from pydantic import BaseModel
    import dataloader

    class LoadArgs(BaseModel):
        day: str

    @dataloader.task("load.cbr", queue="etl", args=LoadArgs, retry=dataloader.Exponential(5))
    async def load_cbr(ctx: dataloader.JobContext[LoadArgs]) -> dict[str, int]:
        rows = 0
        async for chunk in ctx.iterate(fetch_chunks(ctx.args.day)):
            rows += await write_idempotently(chunk)
        return {"rows": rows}          # stored as the job's result

The task name is the stable contract stored in `dl_jobs.task`; the function name is free. A
`TaskRegistry` is an explicit registry (a service or a test builds its own); the module-level
one behind `dataloader.task` is there for the decorator's convenience.

Task definitions need no worker: a producer, the client and the HTTP API read them to check and
route what they enqueue, so this module imports nothing from `dataloader.workers`. The older
names (`pipeline`, `Pipeline`, `PipelineRegistry`) live in `dataloader.workers.pipelines.registry`.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from dataloader.core import limits
from dataloader.core.cron import check_schedule
from dataloader.core.processes import (
    DEFAULT_HISTORY,
    TASK_PREFIX,
    Namespace,
    check_namespace,
    namespace_of,
    task_name_of,
)
from dataloader.core.retry import RetryPolicy, RetrySpec, as_policy, seconds
from dataloader.core.routing import KnownTasks
from dataloader.exceptions import InvalidJobArgs

#: `async def handler(ctx: JobContext[Args])` or a plain `def handler(ctx: ThreadContext[Args])`
#: (run in a worker thread), or `async def handler(batch: Batch[Args])` for a task with a
#: `batch_size`, or a durable process's `async def processor(task, process)`.
Handler = Callable[..., Any]
H = TypeVar("H", bound=Handler)


@dataclass(frozen=True, slots=True)
class Task:
    """A registered handler and how its jobs run. Options left None take the enqueue call's
    value, else the settings' default (`DL_DEFAULT_*`)."""

    name: str
    handler: Handler
    #: The pydantic model `args` must satisfy (None: any JSON object).
    args_model: type[BaseModel] | None = None
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    lease_ttl_sec: int | None = None
    #: Delay before the next attempt of a failure (None: `Linear(DL_RETRY_BASE_SEC)`).
    retry: RetryPolicy | None = None
    #: An attempt running longer is cancelled and fails (None: no limit).
    timeout_sec: float | None = None
    #: Exceptions that fail the job at once, without further attempts.
    non_retryable: tuple[type[BaseException], ...] = field(default=())
    #: Jobs one call of the handler takes (1: `handler(ctx)` per job; more: `handler(batch)`
    #: with up to this many, see `workers.batches`).
    batch_size: int = 1
    #: A cron schedule: the task is enqueued (empty args) on its queue at each slot.
    cron: str | None = None
    #: Tasks enqueued when a job of this one succeeds, in the same transaction, with its
    #: result as args (a result that is not a JSON object as `{"result": …}`).
    then: tuple[str, ...] = ()
    #: Set when the handler is a durable process's processor (`TaskRegistry.process`):
    #: `async def handler(task, process) -> ProcessResult`, for the tasks of this namespace.
    process: Namespace | None = None

    @property
    def threaded(self) -> bool:
        """Whether the handler is a plain `def`, run in a worker thread (`workers.threaded`)."""
        return not inspect.iscoroutinefunction(self.handler)

    @property
    def batched(self) -> bool:
        """Whether the handler takes a `Batch` rather than a `JobContext`."""
        return self.batch_size > 1

    def parse_args(self, args: dict[str, Any]) -> Any:
        """The handler's view of stored `args`: a model instance, or the dict itself."""
        if self.args_model is None:
            return args
        try:
            return self.args_model.model_validate(args)
        except ValidationError as exc:
            raise InvalidJobArgs(describe(exc)) from None
        except Exception as exc:  # a validator raising TypeError & co. is not wrapped by pydantic
            raise InvalidJobArgs(f"args: {type(exc).__name__}: {exc}") from None

    def check_args(self, args: dict[str, Any]) -> None:
        """Raise InvalidJobArgs unless `args`, as JSON, satisfies the model as its JSON Schema
        states it (the same check for HTTP, library and CLI): pydantic's lax mode would also
        take `true` for a number or `"5"` for an integer, which the schema refuses. Whole
        numbers stay integers, as JSON Schema counts them (`2.0` is one)."""
        if self.args_model is None:
            return
        try:
            self.args_model.model_validate_json(json.dumps(_whole_numbers(args)), strict=True)
        except ValidationError as exc:
            raise InvalidJobArgs(describe(exc)) from None
        except Exception as exc:
            raise InvalidJobArgs(f"args: {type(exc).__name__}: {exc}") from None


class TaskRegistry:
    """Task name → task."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}

    def task(
        self,
        name: str,
        *,
        queue: str | None = None,
        args: type[BaseModel] | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        lease_ttl: float | timedelta | None = None,
        retry: RetrySpec | None = None,
        timeout: float | timedelta | None = None,
        non_retryable: tuple[type[BaseException], ...] = (),
        batch_size: int | None = None,
        cron: str | None = None,
        then: str | tuple[str, ...] = (),
    ) -> Callable[[H], H]:
        """Decorator registering an `async def handler(ctx)` as task `name`, or a plain
        `def handler(ctx)`, which runs in a worker thread with a `ThreadContext`
        (`DL_TASK_THREADS` of them at most; cancellation is cooperative); the function is
        returned unchanged. With `batch_size`, the handler is `async def handler(batch)` and
        takes up to that many jobs per call (`dataloader.Batch`). With `cron` (a cron
        expression, UTC), a job of it with empty args is enqueued on its queue at each slot
        (`DL_CRON` gives more options). With `then` (a task name, or several), each success
        enqueues a job of each, with the result as args, in the transaction of the success
        (`ctx.then` adds stages from the handler). Bad options raise at once (ValueError,
        TypeError)."""
        if namespace_of(name) is not None:
            raise ValueError(f"task {name!r}: names starting with {TASK_PREFIX!r} are processors'")
        defined = Task(
            name=_checked("task name", limits.check_name, name),
            handler=_unset,
            args_model=_model(args),
            queue=None if queue is None else _checked("queue", limits.check_name, queue),
            priority=None
            if priority is None
            else _checked("priority", limits.check_priority, priority),
            max_attempts=None
            if max_attempts is None
            else _checked("max_attempts", limits.check_max_attempts, max_attempts),
            lease_ttl_sec=None
            if lease_ttl is None
            else _checked("lease_ttl", limits.check_lease_ttl, _whole_seconds(lease_ttl)),
            retry=None if retry is None else as_policy(retry),
            timeout_sec=None if timeout is None else _timeout(timeout),
            non_retryable=_exception_types(non_retryable),
            batch_size=1
            if batch_size is None
            else _checked("batch_size", limits.check_batch_size, batch_size),
            cron=None if cron is None else _checked("cron", check_schedule, cron),
            then=tuple(
                _checked("then", limits.check_name, name)
                for name in ((then,) if isinstance(then, str) else then)
            ),
        )
        if defined.batched and defined.then:
            raise ValueError(f"task {name!r}: a batched task has no next stages (then=…)")
        if defined.batched and defined.queue is None:
            # its queue's workers claim batch_size jobs at once: they must know the queue
            raise ValueError(f"task {name!r}: a batch_size needs the task's queue (queue=…)")
        if defined.cron is not None:
            if defined.queue is None:
                raise ValueError(f"task {name!r}: a cron schedule needs the task's queue")
            try:
                defined.check_args({})  # its jobs have empty args
            except InvalidJobArgs as exc:
                raise ValueError(f"task {name!r}: its cron jobs have empty args: {exc}") from None

        def decorate(handler: H) -> H:
            if inspect.isasyncgenfunction(handler) or not callable(handler):
                raise TypeError(f"task {name!r} must be an `async def` or a plain `def` function")
            if defined.batched and not inspect.iscoroutinefunction(handler):
                raise TypeError(f"task {name!r}: a batch handler must be an `async def` function")
            existing = self._tasks.get(name)
            if existing is not None and existing.handler is not handler:
                raise ValueError(f"task {name!r} is already registered")
            self._tasks[name] = replace(defined, handler=handler)
            return handler

        return decorate

    def process(
        self,
        namespace: str,
        *,
        queue: str | None = None,
        priority: int = 100,
        history: int = DEFAULT_HISTORY,
        step_timeout: float | timedelta = 60.0,
        attempts: int = 3,
        retry: RetrySpec | None = None,
        idempotent: bool = False,
    ) -> Callable[[H], H]:
        """Decorator registering `async def handler(task, process) -> ProcessResult` as the
        processor of the durable processes of `namespace` (see `dataloader.core.processes`).

        Its tasks are jobs of `queue` (default: the namespace's name) at `priority` (timers
        one lower). The processor is given the process with its last `history` events; a
        step longer than `step_timeout` is stopped; a processor that raises is called again,
        `attempts` times in all, after the delays of `retry`, before the process goes to
        `error`. A step whose worker died half-way puts the process in `error` ("zombie
        detected"), unless the processor is `idempotent`: then it runs again. Bad options
        raise at once (ValueError, TypeError)."""
        defined = Namespace(
            name=_checked("namespace", check_namespace, namespace),
            queue=namespace if queue is None else queue,
            priority=priority,
            history=history,
            step_timeout_sec=_timeout(step_timeout),
            attempts=attempts,
            retry=None if retry is None else as_policy(retry),
            idempotent=idempotent,
        )
        task = Task(
            name=defined.task,
            handler=_unset,
            queue=defined.queue,
            priority=defined.priority,
            max_attempts=defined.max_attempts,
            timeout_sec=defined.step_timeout_sec,
            retry=defined.retry,
            process=defined,
        )

        def decorate(handler: H) -> H:
            if not inspect.iscoroutinefunction(handler):
                raise TypeError(f"the processor of {namespace!r} must be an `async def` function")
            existing = self._tasks.get(task.name)
            if existing is not None and existing.handler is not handler:
                raise ValueError(f"namespace {namespace!r} has a processor already")
            self._tasks[task.name] = replace(task, handler=handler)
            return handler

        return decorate

    def namespace(self, name: str) -> Namespace | None:
        """The durable processes' namespace `name`, when this process has its processor."""
        found = self._tasks.get(task_name_of(name))
        return None if found is None else found.process

    def register(self, name: str, *, args: type[BaseModel] | None = None) -> Callable[[H], H]:
        """`task(name, args=…)` under its older name."""
        return self.task(name, args=args)

    def get(self, name: str) -> Task | None:
        """The task `name`, or None when this process does not know it."""
        return self._tasks.get(name)

    def tasks(self) -> list[Task]:
        """Every task, by name."""
        return [self._tasks[name] for name in sorted(self._tasks)]

    def known(self, live: KnownTasks | None = None) -> KnownTasks:
        """What a sender in this process knows (`core.routing`): these tasks as defined here
        (a producer's own definitions win over other versions'), then the others `live`
        processes know, and the queues they serve."""
        here = {name: frozenset({task.queue}) for name, task in self._tasks.items()}
        if live is None:
            return KnownTasks(here)
        return KnownTasks({**live.definitions, **here}, live.served)

    def only(self, keep: Callable[[Task], bool]) -> TaskRegistry:
        """A new registry holding the tasks `keep` accepts."""
        kept = TaskRegistry()
        kept._tasks.update({name: t for name, t in self._tasks.items() if keep(t)})
        return kept

    def copy(self) -> TaskRegistry:
        """A new registry holding the same tasks (to extend without touching this one)."""
        clone = TaskRegistry()
        clone._tasks.update(self._tasks)
        return clone

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._tasks))


def describe(exc: ValidationError) -> str:
    """One line per problem: `args.field: message`."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in ("args", *error["loc"]))
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


async def _unset(ctx: Any) -> None:  # pragma: no cover (replaced when decorating)
    raise AssertionError("task handler not set")


def _checked(what: str, check: Callable[[object], Any], value: object) -> Any:
    try:
        return check(value)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def _model(args: object) -> type[BaseModel] | None:
    if args is None or (isinstance(args, type) and issubclass(args, BaseModel)):
        return args
    raise TypeError(f"args must be a pydantic model class, not {args!r}")


def _whole_seconds(value: float | timedelta) -> object:
    """A float or timedelta of whole seconds as an int; anything else as given, for
    `check_lease_ttl` to refuse (`int()` would take "60" and True)."""
    total = value.total_seconds() if isinstance(value, timedelta) else value
    if not isinstance(total, float):
        return total
    if not total.is_integer():
        raise ValueError(f"lease_ttl: must be whole seconds, not {total}")
    return int(total)


def _timeout(value: float | timedelta) -> float:
    timeout = seconds(value, "timeout")
    if timeout <= 0:
        raise ValueError("timeout must be more than 0 seconds")
    return timeout


def _exception_types(value: object) -> tuple[type[BaseException], ...]:
    types = value if isinstance(value, tuple) else (value,)
    for item in types:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise TypeError(f"non_retryable must hold exception classes, not {item!r}")
    return types


def _whole_numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _whole_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(item) for item in value]
    return value


#: The process-wide registry the `task` decorator fills.
registry = TaskRegistry()
#: `@task("name", queue=…, args=Model, …)` registers in the process-wide registry.
task = registry.task
#: `@process("namespace", queue=…, …)` registers a processor in the process-wide registry.
process = registry.process
