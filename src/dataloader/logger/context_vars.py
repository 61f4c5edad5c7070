"""Per-task logging context: request, job, queue and task ids added to every log line.

`contextvars` rather than thread-locals or logger adapters: each asyncio task gets a copy of
the context when it is created, so a job id bound inside one job's task never leaks into a
concurrently running job or HTTP request.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token

request_id_var: ContextVar[str | None] = ContextVar("dl_request_id", default=None)
job_id_var: ContextVar[str | None] = ContextVar("dl_job_id", default=None)
queue_var: ContextVar[str | None] = ContextVar("dl_queue", default=None)
task_var: ContextVar[str | None] = ContextVar("dl_task", default=None)

#: Context fields in the order they appear in a log line.
CONTEXT_FIELDS: tuple[str, ...] = ("request_id", "job_id", "queue", "task")

_VARS: dict[str, ContextVar[str | None]] = {
    "request_id": request_id_var,
    "job_id": job_id_var,
    "queue": queue_var,
    "task": task_var,
}


def bind_request(request_id: str) -> Token[str | None]:
    """Set the request id for the current context; pass the token to `request_id_var.reset`."""
    return request_id_var.set(request_id)


@contextmanager
def log_context(**fields: str | None) -> Iterator[None]:
    """Bind any of `request_id`, `job_id`, `queue`, `task` for the block, restoring them after.

    A field passed as None is unset for the block. Unknown names raise TypeError, so a typo
    does not silently drop a field from the logs.
    """
    unknown = sorted(set(fields) - _VARS.keys())
    if unknown:
        raise TypeError(f"log_context() got unknown field(s): {', '.join(unknown)}")
    tokens = [(_VARS[name], _VARS[name].set(value)) for name, value in fields.items()]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def current_context() -> dict[str, str]:
    """The context fields that are set in the current context, in `CONTEXT_FIELDS` order."""
    values = {name: _VARS[name].get() for name in CONTEXT_FIELDS}
    return {name: value for name, value in values.items() if value is not None}
