"""Slots shared by several queues: each slot (a job processor) serves the queues in turn.

    WORKERS_JSON='[{"queues": ["emails", "sms"], "concurrency": 4,
                    "batch_size": {"emails": 10}}]'

A processor takes up to `batch_size` jobs of one queue (unless set, the largest `batch_size` of
the tasks declared on the queue, else 1; a batched task's jobs go to its handler in one call,
the others run one after another), runs them, and moves on to the next queue: one *cycle*.
The processors start on different queues, so each queue with work gets some whatever the
others hold. When a processor has found every queue empty in a row, it sleeps
until a queue is woken (a new job, a freed lock_key, a retry come due) or its safety poll. A
queue whose limits held jobs back is not empty (the slots are not idle: a drain waits for
them), yet its claims are not repeated at once: a job's end or the rate's next token wakes it.

Each cycle is measured (`queue_job_processor_cycle_duration_seconds`): a cycle is meant to end
within seconds, so that a stop never waits long for one; choose batch sizes that keep it so.
Queues served this way take no hand-offs from the completer (the next job of a lock_key is
claimed in a cycle like any other).
"""

from __future__ import annotations

import asyncio
import time

from dataloader.storage.protocol import ClaimedJob
from dataloader.workers.base import Slots, declared_batch_size
from dataloader.workers.claims import QueueClaims
from dataloader.workers.completer import Completer
from dataloader.workers.runtime import WorkerRuntime
from dataloader.workers.waiting import wait_any


class SharedSlots(Slots):
    """`concurrency` slots serving `queues` round-robin, `batch_size[queue]` jobs a cycle."""

    shared = True

    def __init__(
        self,
        queues: list[str],
        concurrency: int,
        batch_size: dict[str, int],
        runtime: WorkerRuntime,
        completer: Completer,
    ) -> None:
        super().__init__(concurrency, runtime, completer)
        self.queues = list(queues)
        self.batch_size = {
            queue: batch_size.get(queue) or declared_batch_size(runtime, queue) for queue in queues
        }
        self._claims = {queue: QueueClaims(queue, runtime) for queue in queues}
        self._wakeup = asyncio.Event()
        #: Processors whose last round over every queue found nothing, since when (monotonic).
        self._empty_since: dict[int, float] = {}
        self._stopping: asyncio.Event | None = None

    def wake(self) -> None:
        """Something may be ready in one of the queues."""
        self._wakeup.set()

    def keep_slot(self) -> bool:
        """No slot is kept for a hand-off: a processor claims the next job in its cycle."""
        return False

    def release_slot(self) -> None:  # pragma: no cover (no slot is ever kept)
        raise AssertionError("shared slots keep no slot")

    def take_handed(self, job: object) -> None:  # pragma: no cover (no slot is ever kept)
        raise AssertionError("shared slots take no hand-off")

    async def run(self, stopping: asyncio.Event) -> None:
        """Run the processors until `stopping` is set (their last jobs are the manager's)."""
        self._stopping = stopping
        await asyncio.gather(*(self._process(i, stopping) for i in range(self.concurrency)))

    async def _process(self, index: int, stopping: asyncio.Event) -> None:
        """One processor: a cycle on each queue in turn, starting at queue `index`."""
        position = index % len(self.queues)
        empty_in_a_row = 0
        round_started = time.monotonic()
        #: Whether a queue of this round had jobs its limits held back: it is not empty.
        held = False
        while not stopping.is_set():
            if not self._rt.locks.ready.is_set():
                await wait_any(self._rt.locks.ready, stopping)
                continue
            if self._rt.presence.lapsed():
                await self._rt.presence.wait_renewed(stopping)
                continue
            if empty_in_a_row == 0:
                round_started = time.monotonic()
                held = False
                self._wakeup.clear()  # a wake-up from now on is for the claims to come
            queue = self.queues[position]
            position = (position + 1) % len(self.queues)
            claims = self._claims[queue]
            started = time.monotonic()
            try:
                claimed = await claims.claim(self.batch_size[queue], started)
            except Exception as exc:  # the loop must outlive any database trouble
                await wait_any(stopping, timeout=claims.failure_pause(exc))
                continue
            if claimed.jobs:
                empty_in_a_row = 0
                self._empty_since.pop(index, None)
                self.idle.clear()
                await self._cycle(claimed.jobs, started, stopping)
                continue
            if claimed.moved or claimed.more:
                empty_in_a_row = 0  # the queue changed: look at every queue again
                self.idle.clear()
                continue
            held = held or claimed.held > 0
            empty_in_a_row += 1
            if empty_in_a_row < len(self.queues):
                continue
            empty_in_a_row = 0
            # a limit's room or rate wakes the slot (a job's end, the timer); a wake-up during
            # the round may have made a job claimable after a claim's snapshot
            if not held and not self._wakeup.is_set():
                self._empty_since[index] = round_started
                self._set_idle_if_all_empty()
            timeout = min(c.idle_timeout() for c in self._claims.values())
            await wait_any(self._wakeup, stopping, timeout=timeout)
            self._empty_since.pop(index, None)

    async def _cycle(
        self, jobs: list[ClaimedJob], claimed_at: float, stopping: asyncio.Event
    ) -> None:
        """Run the jobs of one claim in this processor's slot, one unit after another; return
        when they are done, or at once when the worker stops (the manager waits for them)."""
        units = await self._units(jobs)
        if not units:
            return
        task = asyncio.create_task(
            self._execute_units(units, claimed_at), name=f"dataloader-cycle-{jobs[0].queue}"
        )
        self._jobs.add(task)
        task.add_done_callback(self._finished)
        done = asyncio.Event()
        task.add_done_callback(lambda _: done.set())
        await wait_any(done, stopping)

    def _stopping_now(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    def _set_idle_if_all_empty(self) -> None:
        """Idle once every processor's last round found every queue empty, no job of these
        slots runs and none waits for its outcome to be written."""
        if len(self._empty_since) < self.concurrency or self._jobs:
            return
        served = set(self.queues)
        if any(r.job.queue in served for r in self._rt.running.values()):
            return
        self.idle_claim_started = min(self._empty_since.values())
        self.idle.set()
