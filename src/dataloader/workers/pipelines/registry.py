"""Pipelines keyed by task name.

    from pydantic import BaseModel
    from dataloader import JobContext, pipeline

    class LoadArgs(BaseModel):
        day: str

    @pipeline("load.cbr", args=LoadArgs)
    async def load_cbr(ctx: JobContext[LoadArgs]) -> None:
        async for chunk in ctx.iterate(fetch_chunks(ctx.args.day)):
            await write_idempotently(ctx.app.sessionmaker, chunk)

The task name is the stable contract stored in `dl_jobs.task`; the function name is free.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from dataloader.exceptions import InvalidJobArgs

if TYPE_CHECKING:
    from dataloader.workers.job_context import JobContext

Handler = Callable[["JobContext[Any]"], Coroutine[Any, Any, Any]]
H = TypeVar("H", bound=Handler)


@dataclass(frozen=True, slots=True)
class Pipeline:
    """A registered handler and the model its arguments must satisfy (if any)."""

    task: str
    handler: Handler
    args_model: type[BaseModel] | None = None

    def parse_args(self, args: dict[str, Any]) -> Any:
        """The handler's view of `args`: a model instance, or the dict itself."""
        if self.args_model is None:
            return args
        try:
            return self.args_model.model_validate(args)
        except ValidationError as exc:
            raise InvalidJobArgs(_describe(exc)) from None
        except Exception as exc:  # a validator raising TypeError & co. is not wrapped by pydantic
            raise InvalidJobArgs(f"args: {type(exc).__name__}: {exc}") from None


class PipelineRegistry:
    """Task name → pipeline."""

    def __init__(self) -> None:
        self._pipelines: dict[str, Pipeline] = {}

    def register(self, task: str, *, args: type[BaseModel] | None = None) -> Callable[[H], H]:
        """Decorator registering an `async def handler(ctx)` under `task`."""
        if not task:
            raise ValueError("task name must not be empty")

        def decorate(handler: H) -> H:
            if not inspect.iscoroutinefunction(handler):
                raise TypeError(f"pipeline {task!r} must be an `async def` function")
            existing = self._pipelines.get(task)
            if existing is not None and existing.handler is not handler:
                raise ValueError(f"task {task!r} is already registered")
            self._pipelines[task] = Pipeline(task, handler, args)
            return handler

        return decorate

    def get(self, task: str) -> Pipeline | None:
        """The pipeline of `task`, or None when this process does not know it."""
        return self._pipelines.get(task)

    def validate_args(self, task: str, args: dict[str, Any]) -> None:
        """Raise InvalidJobArgs when `task` is registered here and rejects `args`."""
        found = self._pipelines.get(task)
        if found is not None:
            found.parse_args(args)

    def copy(self) -> PipelineRegistry:
        """A new registry holding the same pipelines (to extend without touching this one)."""
        clone = PipelineRegistry()
        clone._pipelines.update(self._pipelines)
        return clone

    def __contains__(self, task: object) -> bool:
        return task in self._pipelines

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._pipelines))


def _describe(exc: ValidationError) -> str:
    """One line per problem: `args.field: message`."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in ("args", *error["loc"]))
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


#: The process-wide registry the `pipeline` decorator fills.
registry = PipelineRegistry()
#: `@pipeline("task.name", args=Model)` registers in the process-wide registry.
pipeline = registry.register
