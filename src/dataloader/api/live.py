"""The task names live processes know (`dl_workers`), as the API needs them: for the trigger's
unknown-task check and for the `task` enum of the OpenAPI schema.

Read at most once per `CACHE_SEC` on the hot path, so a trigger costs a set lookup; a name
missing from the cached set is looked up again if the set is older than `MISS_CACHE_SEC`, so a
process that has just started is not refused for long, while a flood of misspelt names costs
at most a few reads per second. Concurrent readers share one read.
"""

from __future__ import annotations

import asyncio
import time

from dataloader.storage.presence import PresenceStore

#: Age of the cached set beyond which a trigger reads it again.
CACHE_SEC = 1.0
#: Age beyond which a trigger naming a task missing from the set reads it again.
MISS_CACHE_SEC = 0.25


class LiveTasks:
    """A cached view of the task names live processes know; attach a store to read it."""

    def __init__(self) -> None:
        self.store: PresenceStore | None = None
        self._tasks: frozenset[str] | None = None
        self._read_at = float("-inf")
        self._reading: asyncio.Task[frozenset[str]] | None = None

    @property
    def last_known(self) -> frozenset[str] | None:
        """The set as last read (None before the first read)."""
        return self._tasks

    async def get(self, max_age: float = CACHE_SEC) -> frozenset[str]:
        """The set, read again if the cached one is older than `max_age` seconds."""
        if self._tasks is not None and time.monotonic() - self._read_at < max_age:
            return self._tasks
        if self._reading is None or self._reading.done():
            self._reading = asyncio.create_task(self._read())
        # shielded: one caller giving up (a client gone) does not cancel the others' read
        return await asyncio.shield(self._reading)

    async def knows(self, task: str) -> bool:
        """Whether some live process knows `task`."""
        return task in await self.get() or task in await self.get(MISS_CACHE_SEC)

    async def _read(self) -> frozenset[str]:
        if self.store is None:
            raise RuntimeError("LiveTasks has no store yet (the service is not started)")
        tasks = await self.store.live_tasks()
        self._tasks, self._read_at = tasks, time.monotonic()
        return tasks
