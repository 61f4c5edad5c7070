"""The tasks a process sends jobs of on its own — its cron schedules' (`DL_CRON`, `cron=`)
and its tasks' stages (`then=`) — checked once at its start, before it serves anything:
refused when certainly wrong, warned of in one log line where another process may still bring
the task (a leader need not host every task). The rule is `core.routing`'s; /status warns of
schedules no live process knows as long as it holds."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from dataloader.config import CronSpec
from dataloader.core.routing import Destination, KnownTasks, KnowsTasks, check_destinations
from dataloader.tasks import TaskRegistry

log = logging.getLogger(__name__)


def destinations(schedules: Sequence[CronSpec], registry: TaskRegistry) -> list[Destination]:
    """Each schedule's task on its queue, then each stage of each task on the queue its job
    goes to (`workers.stages`: the stage task's own queue, else the parent's)."""
    found = [Destination(f"schedule {s.name!r}", s.task, s.queue) for s in schedules]
    for task in registry.tasks():
        for name in task.then:
            stage = registry.get(name)
            queue = stage.queue if stage is not None and stage.queue is not None else task.queue
            found.append(Destination(f"a stage (then=) of task {task.name!r}", name, queue))
    return found


async def check_at_start(
    schedules: Sequence[CronSpec],
    registry: TaskRegistry,
    presence: KnowsTasks,
    own_queues: Iterable[str],
    *,
    allow_unknown: bool,
) -> list[Destination]:
    """ConfigError for a schedule or stage certainly wrong, judged from this process's tasks
    and queues (it will serve them) and the live processes'; the others whose task nobody
    knows yet (`warn_awaited`)."""
    live = await presence.known_tasks()
    known = registry.known(KnownTasks(live.definitions, live.served | frozenset(own_queues)))
    return check_destinations(destinations(schedules, registry), known, allow_unknown=allow_unknown)


def warn_awaited(awaited: Sequence[Destination]) -> None:
    """One warning line naming the schedules and stages whose task nobody knows yet."""
    if awaited:
        log.warning(
            "no live process knows the tasks these send jobs of (they wait for one that does): %s",
            "; ".join(f"{d.sender}: task {d.task!r}" for d in awaited),
        )
