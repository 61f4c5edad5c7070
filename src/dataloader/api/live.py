"""What live processes know and serve (`dl_workers`), as the trigger's check needs it
(`core.routing`).

Read at most once per `CACHE_SEC` on the hot path, so a trigger costs a few lookups; a trigger
the cached view would refuse is checked again against a view no older than `MISS_CACHE_SEC`,
so a process that has just started is not refused for long, while a flood of misspelt names
costs at most a few reads per second. Concurrent readers share one read.
"""

from __future__ import annotations

import asyncio
import time

from dataloader.core.routing import KnownTasks, KnowsTasks, Route, check_route
from dataloader.exceptions import InvalidJob, UnknownTask
from dataloader.tasks import TaskRegistry

#: Age of the cached set beyond which a trigger reads it again.
CACHE_SEC = 1.0
#: Age beyond which a trigger the cached view refuses reads it again.
MISS_CACHE_SEC = 0.25


class LiveTasks:
    """A cached view of what live processes know and serve; attach a reader (the service's
    client) to read it."""

    def __init__(self) -> None:
        self.store: KnowsTasks | None = None
        self._tasks: KnownTasks | None = None
        self._read_at = float("-inf")
        self._reading: asyncio.Task[KnownTasks] | None = None

    async def get(self, max_age: float = CACHE_SEC) -> KnownTasks:
        """The view, read again if the cached one is older than `max_age` seconds."""
        if self._tasks is not None and time.monotonic() - self._read_at < max_age:
            return self._tasks
        if self._reading is None or self._reading.done():
            self._reading = asyncio.create_task(self._read())
        # shielded: one caller giving up (a client gone) does not cancel the others' read
        return await asyncio.shield(self._reading)

    async def check(
        self, task: str, queue: str, local: TaskRegistry, *, allow_unknown: bool
    ) -> Route:
        """`core.routing.check_route` of a job of `task` sent to `queue`, from `local` (this
        process's definitions) and the live processes: refused only when a fresh view
        refuses it too."""
        try:
            return check_route(
                task, queue, local.known(await self.get()), allow_unknown=allow_unknown
            )
        except (InvalidJob, UnknownTask):
            known = local.known(await self.get(MISS_CACHE_SEC))
            return check_route(task, queue, known, allow_unknown=allow_unknown)

    async def _read(self) -> KnownTasks:
        if self.store is None:
            raise RuntimeError("LiveTasks has no store yet (the service is not started)")
        tasks = await self.store.known_tasks()
        self._tasks, self._read_at = tasks, time.monotonic()
        return tasks
