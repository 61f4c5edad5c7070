"""Whether a job of a task may be sent to a queue: the one rule behind every way a job enters
the queue (HTTP trigger, `dataloader enqueue`, `Client.enqueue`), and behind the check of a
process's cron schedules and stages at its start (`check_destinations`). No I/O: callers pass
what they know of the task and of live processes.

A queue accepts work while its consumers are away: producers and workers are deployed and
restarted apart (API-only replicas, rolling deploys, workers started after producers), so a
task that no live process knows is not, by itself, a mistake. Only two things certainly are:

* **wrong queue**: the task's definition names another queue. Its workers serve that queue
  (its pause and limits hold there); a job elsewhere would bypass them, or wait forever.
* **unrunnable**: live processes serve the queue and none of them knows the task. A job sent
  there would be claimed at once by a process that cannot run it and fail (a misspelt name,
  a task removed), long before a process that knows it could arrive.

Everything else is accepted: when the task is known, it runs; when nobody serves the queue
and nobody knows the task, the job waits for its consumers, and /status says so.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from dataloader.exceptions import ConfigError, InvalidJob, UnknownTask


class Route(Enum):
    """What becomes of a job of a task sent to a queue."""

    #: A definition of the task takes jobs on this queue.
    RUNNABLE = "runnable"
    #: No live process knows the task, and none serves the queue: the job waits.
    AWAITED = "awaited"
    #: Every definition of the task names another queue.
    WRONG_QUEUE = "wrong_queue"
    #: Live processes serve the queue and none knows the task.
    UNRUNNABLE = "unrunnable"


@dataclass(frozen=True, slots=True)
class KnownTasks:
    """What a sender knows: each task's definitions (by the queue each names, None for a
    definition that names none and so takes any), and the queues live processes serve."""

    definitions: Mapping[str, frozenset[str | None]] = field(default_factory=dict)
    served: frozenset[str] = frozenset()

    def tasks(self) -> frozenset[str]:
        """The names of the tasks defined."""
        return frozenset(self.definitions)


class KnowsTasks(Protocol):
    """Who can say what the live processes know (a `PresenceStore`, a `Client`)."""

    async def known_tasks(self) -> KnownTasks: ...


def route(task: str, queue: str, known: KnownTasks) -> Route:
    """Where a job of `task` sent to `queue` ends up, from what is known."""
    declared = known.definitions.get(task)
    if declared:
        return Route.RUNNABLE if queue in declared or None in declared else Route.WRONG_QUEUE
    return Route.UNRUNNABLE if queue in known.served else Route.AWAITED


def check_route(task: str, queue: str, known: KnownTasks, *, allow_unknown: bool = False) -> Route:
    """`route`, refused when certainly a mistake: InvalidJob (the queue) for a wrong queue,
    UnknownTask for an unrunnable task unless `allow_unknown` (DL_ALLOW_UNKNOWN_TASKS)."""
    found = route(task, queue, known)
    if found is Route.WRONG_QUEUE:
        raise InvalidJob("queue", wrong_queue(task, queue, known.definitions[task]))
    if found is Route.UNRUNNABLE and not allow_unknown:
        raise UnknownTask(task, known.tasks(), queue)
    return found


def wrong_queue(task: str, queue: str, declared: Collection[str | None]) -> str:
    """Why a job of `task` may not go to `queue`, naming both."""
    names = " or ".join(sorted(repr(q) for q in declared if q is not None))
    return f"task {task!r} runs on queue {names}, not {queue!r}"


@dataclass(frozen=True, slots=True)
class Destination:
    """A task a process sends jobs of on its own (a cron schedule's, a stage's), and where."""

    #: Who sends them, for messages: "schedule 'nightly'", "a stage of task 'etl.load'".
    sender: str
    task: str
    #: None: the queue of the job that sends it, unknown before it runs.
    queue: str | None


def check_destinations(
    destinations: Iterable[Destination], known: KnownTasks, *, allow_unknown: bool
) -> list[Destination]:
    """The destinations whose task nobody knows yet (another process may still bring it: warn
    of them); ConfigError for the first certainly wrong (`check_route`), so that a process
    refuses to start rather than send jobs to fail at every slot or success."""
    awaited = []
    for where in destinations:
        if where.queue is None:
            if where.task not in known.definitions:
                awaited.append(where)
            continue
        try:
            if check_route(where.task, where.queue, known, allow_unknown=allow_unknown) in (
                Route.AWAITED,
                Route.UNRUNNABLE,
            ):
                awaited.append(where)
        except (InvalidJob, UnknownTask) as exc:
            raise ConfigError(f"{where.sender}: {exc}") from None
    return awaited
