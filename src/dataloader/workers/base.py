"""One queue's worker: claim as many jobs as there are free slots, lock, run, finish.

claim (batch ≤ free slots + ahead) ─► advisory lock ─┬─ busy ─► backoff (attempt refunded)
                                                     └─ held ─► run ─► unlock ─► finish

While its jobs run shorter than a claim takes, the worker also claims ahead
(`workers.claims.ClaimPace`): the jobs claimed beyond its free slots wait, in claim order, for
the next slots to free; those still waiting when it stops, or after AHEAD_MAX_WAIT_SEC, go
back to the queue.

Each job, or batch of a batched task's jobs, runs in a slot of its own through the process's
`Executor` (`workers.executor`: the handler's call, its timeout, what it ended as), stopped
when the job stops being ours. Backoffs and outcomes are decided and written by the completer,
which retries them until they land.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import NamedTuple

from dataloader import metrics
from dataloader.core.transitions import Ended, Outcome
from dataloader.logger import log_context
from dataloader.storage.protocol import ClaimedJob
from dataloader.tasks import Task
from dataloader.workers.claims import AHEAD_MAX_WAIT_SEC, ClaimPace, QueueClaims
from dataloader.workers.completer import Completer
from dataloader.workers.executor import Executor
from dataloader.workers.locks import LockConnectionLost
from dataloader.workers.runtime import RunningJob, WorkerRuntime
from dataloader.workers.waiting import wait_any

log = logging.getLogger(__name__)


class Slots:
    """Slots that run claimed jobs, each a single job or a batch of a batched task's: what
    both kinds of worker share (`QueueWorker`, one queue's own slots, and
    `workers.processors.SharedSlots`, slots shared by several queues)."""

    #: Whether several queues share these slots.
    shared = False

    def __init__(self, concurrency: int, runtime: WorkerRuntime, completer: Completer) -> None:
        self.concurrency = concurrency
        self._rt = runtime
        self._completer = completer
        self._executor = Executor(
            app=runtime.app,
            protocol=runtime.protocol,
            max_result_bytes=runtime.settings.max_result_bytes,
            threads=runtime.threads,
        )
        self._slot_freed = asyncio.Event()
        self._jobs: set[asyncio.Task[None]] = set()
        #: Set while the last claims found nothing, none of the jobs runs and none waits for
        #: its outcome to be written.
        self.idle = asyncio.Event()
        #: When (monotonic) the claim that last set `idle` started.
        self.idle_claim_started = 0.0
        #: A second stop signal came: nothing more starts (see `hurry`).
        self.hurried = False

    @property
    def busy(self) -> int:
        """Slots in use."""
        return len(self._jobs)

    @property
    def job_tasks(self) -> set[asyncio.Task[None]]:
        return set(self._jobs)

    async def _units(self, jobs: list[ClaimedJob]) -> list[list[RunningJob]]:
        """Lock each job's key and back off those busy; the others, running now (their leases
        kept alive from here on), grouped in units: a single job, or up to its task's
        `batch_size` jobs of a batched task."""
        try:
            locked = await self._rt.locks.try_lock(job.lock_hash for job in jobs)
        except Exception as exc:  # nothing was locked: give them back at once
            if not isinstance(exc, LockConnectionLost):
                log.warning("locking %d job(s) failed: %r", len(jobs), exc)
            for job in jobs:
                await self._backoff(job, 0.0, f"the jobs could not be locked ({exc!r})")
            return []
        busy: list[ClaimedJob] = []
        units: list[list[RunningJob]] = []
        filling: dict[str, list[RunningJob]] = {}  # the batch of each task being filled
        for job in jobs:  # no await in this loop: every lock taken gets its job in the running set
            if job.lock_hash is not None:  # None: a lock_free job, which needs no lock
                if job.lock_hash not in locked:
                    busy.append(job)
                    continue
                locked.discard(job.lock_hash)  # a colliding hash later in the batch is busy
            running = RunningJob(job, locked=job.lock_hash is not None)
            self._rt.running[job.job_id] = running
            size = self._batch_size_of(job.task)
            unit = filling.get(job.task)
            if unit is None or len(unit) >= size:
                unit = []
                units.append(unit)
                if size > 1:
                    filling[job.task] = unit
            unit.append(running)
        if self._rt.wakes_heartbeat(jobs):
            self._rt.job_started.set()
        for job in busy:
            await self._backoff(job, self._rt.settings.claim_backoff_sec, "lock_key is busy")
        return units

    async def _give_back(self, unit: list[RunningJob], why: str) -> None:
        """Return a unit that will not start to the queue, its attempts refunded."""
        self._give_back_now(unit, why)
        await self._completer.backpressure()

    def _give_back_now(self, unit: list[RunningJob], why: str) -> None:
        """`_give_back`, its outcomes queued without waiting for a flush."""
        for running in unit:
            self._completer.enqueue(running, Outcome(Ended.UNSTARTED, why))

    def _batch_size_of(self, task: str) -> int:
        found = self._rt.registry.get(task)
        return 1 if found is None else found.batch_size

    async def _backoff(self, job: ClaimedJob, delay: float, why: str) -> None:
        """Hand a job that cannot run now back to the queue (written by the completer, which
        keeps its lease alive until then). `delay` applies only if the key turns out to be
        held outside dataloader (see `queries.BACKOFF_JOB`)."""
        with log_context(job_id=str(job.job_id), queue=job.queue, task=job.task):
            log.info("%s (%r); handing the job back", why, job.lock_key)
        running = RunningJob(job)
        self._rt.running[job.job_id] = running
        await self._completer.finish(
            running, Outcome(Ended.BACKED_OFF, error=why, backoff_sec=delay)
        )

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._jobs.discard(task)
        self._slot_freed.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("job task crashed", exc_info=task.exception())

    async def _execute_units(self, units: list[list[RunningJob]], claimed_at: float) -> None:
        """Run one slot's units one after another: a cycle of the slot, measured from the
        claim that took them (`claimed_at`, monotonic). A unit that is not to start (the worker
        stops, or one of its jobs is no longer ours or lost its lock) goes back to the queue
        unstarted."""
        queue = units[0][0].job.queue
        in_progress = metrics.of(metrics.TASKS_IN_PROGRESS, queue)
        count = sum(map(len, units))
        in_progress.inc(count)
        try:
            for unit in units:
                found = self._rt.registry.get(unit[0].job.task)
                why = self._not_to_start(unit)
                if why is not None:
                    await self._give_back(unit, why)
                    continue
                started = time.monotonic()
                for running in unit:
                    _count_start(running.job, started - claimed_at)
                if found is not None and found.batched:
                    await self._execute_batch(unit, found)
                else:
                    await self._execute(unit[0])
                self._unit_ran(time.monotonic() - started)
        finally:
            in_progress.dec(count)
            metrics.of(metrics.CYCLE_DURATION, queue).observe(time.monotonic() - claimed_at)

    def _stopping_now(self) -> bool:
        """Whether the worker stops: a unit not started yet is not started. Jobs claimed
        before a stop start and have its grace period, unless the stop is hurried."""
        return self.hurried

    def hurry(self) -> None:
        """A second stop signal: a unit not started yet goes back unstarted."""
        self.hurried = True

    def _not_to_start(self, unit: list[RunningJob]) -> str | None:
        """Why a unit about to start goes back to the queue instead (None: it starts). A job
        whose cancel was requested before it started ends canceled without starting (the
        jobs of a batch are each the handler's to settle)."""
        if self._stopping_now() or any(r.handback for r in unit):
            return "worker shutting down"
        if len(unit) == 1 and unit[0].state.cancel_requested and not self._is_step(unit[0]):
            return "canceled before it started"
        for running in unit:
            if not self._rt.locks.covers(running.job.lock_hash):  # the lock connection died
                running.lose("the lock connection was lost before the job started")
            if running.state.lost_reason is not None:
                return running.state.lost_reason
        return None

    def _is_step(self, running: RunningJob) -> bool:
        """Whether the job is a durable process's step (its processor settles cancels)."""
        found = self._rt.registry.get(running.job.task)
        return found is not None and found.process is not None

    def _unit_ran(self, seconds: float) -> None:
        """A unit ran for `seconds`, from its start until its outcomes were queued."""

    def give_back_waiting(self) -> None:
        """The worker stops: give back the units it claimed that wait for a slot (none here:
        see `QueueWorker`)."""

    async def _execute(self, running: RunningJob) -> None:
        job = running.job
        with log_context(job_id=str(job.job_id), queue=job.queue, task=job.task):
            log.debug("job started (attempt %d of %d)", job.attempt, job.max_attempts)
            try:
                outcome = await self._executor.execute(self._rt.registry.get(job.task), running)
            except BaseException:
                self._rt.running.pop(job.job_id, None)
                await self._rt.locks.unlock([job.lock_hash])
                raise
        # The completer takes the job out of the running set once its outcome is written.
        await self._completer.finish(running, outcome)

    async def _execute_batch(self, unit: list[RunningJob], task: Task) -> None:
        """Run a batched task's jobs in one call of its handler; each settlement is queued for
        writing as the handler makes it, the jobs left open once it ends after that."""
        runs = {running.job.job_id: running for running in unit}
        queue = unit[0].job.queue
        with log_context(queue=queue, task=task.name):
            try:
                stats = await self._executor.execute_batch(
                    task,
                    list(runs.values()),
                    lambda job, outcome: self._completer.enqueue(runs[job.job_id], outcome),
                )
            except BaseException:
                unsettled = [r for r in runs.values() if not r.finished]
                for running in unsettled:
                    self._rt.running.pop(running.job.job_id, None)
                await self._rt.locks.unlock([r.job.lock_hash for r in unsettled])
                raise
            if stats.last_error is not None:
                log.warning(
                    "batch of %d: %d done, %d error(s), last: %s",
                    len(unit),
                    stats.processed,
                    stats.errors,
                    stats.last_error,
                )
        metrics.observe_batch(queue, task.name, stats)
        await self._completer.backpressure()


class QueueWorker(Slots):
    """Serves one queue with `concurrency` slots of its own."""

    def __init__(
        self, queue: str, concurrency: int, runtime: WorkerRuntime, completer: Completer
    ) -> None:
        super().__init__(concurrency, runtime, completer)
        self.queue = queue
        self._wakeup = asyncio.Event()
        #: Slots kept for jobs the completer may be handed (the next job of a key it frees),
        #: and slots a claim in flight may fill: neither may be promised twice.
        self._kept = 0
        self._claiming = 0
        self._stopping: asyncio.Event | None = None
        self.claims = QueueClaims(queue, runtime)
        #: Jobs a slot takes per claim.
        self.batch_size = declared_batch_size(runtime, queue)
        #: When the worker claims ahead, and how much (see `ClaimPace`).
        self.pace = ClaimPace(enabled=runtime.settings.claim_ahead)
        #: Units claimed ahead (see `ClaimPace`), in claim order: they start as slots free.
        self._ahead: deque[_Waiting] = deque()
        #: Jobs claimed ahead of free slots since the worker started (for operators, tests).
        self.claimed_ahead = 0

    @property
    def stopped_claiming(self) -> bool:
        """Whether the process has told this worker to stop claiming (a stop has begun)."""
        return self._stopping is not None and self._stopping.is_set()

    def keep_slot(self) -> bool:
        """Keep a free slot for a job an outcome's write may claim for this worker (see
        `Completer`); False when none is free or the worker stops claiming."""
        if self._stopping is None or self.stopped_claiming:
            return False
        if len(self._jobs) + self._kept + self._claiming >= self.concurrency:
            return False
        self._kept += 1
        return True

    def release_slot(self) -> None:
        """Give back a slot kept by `keep_slot`."""
        self._kept -= 1
        self._slot_freed.set()

    def take_handed(self, job: ClaimedJob) -> None:
        """Run a job claimed for this worker by an outcome's write (its slot was kept). Its
        key was let go just before that write: it is locked again first, like a claimed job's."""
        self.idle.clear()
        task = asyncio.create_task(
            self._run_handed(job, time.monotonic()), name=f"dataloader-job-{job.job_id}"
        )
        self._jobs.add(task)
        task.add_done_callback(self._finished)

    async def _run_handed(self, job: ClaimedJob, claimed_at: float) -> None:
        if self._stopping is not None and self._stopping.is_set():
            await self._backoff(job, 0.0, "the worker is stopping")
            return
        try:
            locked = job.lock_hash in await self._rt.locks.try_lock([job.lock_hash])
        except Exception as exc:
            await self._backoff(job, 0.0, f"the job could not be locked ({exc!r})")
            return
        if locked:
            self._rt.running[job.job_id] = RunningJob(job, locked=True)
            if self._rt.wakes_heartbeat([job]):
                self._rt.job_started.set()
            await self._run_slot([[self._rt.running[job.job_id]]], claimed_at)
        else:
            await self._backoff(job, self._rt.settings.claim_backoff_sec, "lock_key is busy")

    def wake(self) -> None:
        """Something may be ready (notification, poll, a finished job freeing a lock_key)."""
        self._wakeup.set()

    @property
    def claims_started(self) -> int:
        return self.claims.started

    @property
    def claims_answered(self) -> int:
        return self.claims.answered

    async def run(self, stopping: asyncio.Event) -> None:
        """Claim and start jobs until `stopping` is set; then give back the jobs claimed
        ahead that have not started (whatever ended the loop)."""
        self._stopping = stopping
        try:
            await self._claim_until(stopping)
        finally:
            self.give_back_waiting()

    def give_back_waiting(self) -> None:
        """The worker stops: the units claimed ahead that have not started go back to the
        queue (their outcomes queued, without waiting)."""
        self._give_back_ahead(stale_only=False)

    async def _claim_until(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            free = self.concurrency - len(self._jobs) - self._kept
            if free > 0 and self._ahead:
                self._start_ahead(free)
                continue
            self._give_back_ahead(stale_only=True)
            ahead = self.pace.ahead(
                self.concurrency,
                len(self._ahead),
                limited=self._rt.protocol.limited(self.queue),
            )
            if free + ahead <= 0:
                self._slot_freed.clear()
                await wait_any(self._slot_freed, stopping, timeout=self._ahead_patience())
                continue
            if not self._rt.locks.ready.is_set():
                await wait_any(self._rt.locks.ready, stopping)
                continue
            if self._rt.presence.lapsed():
                await self._rt.presence.wait_renewed(stopping)
                continue
            self._wakeup.clear()
            try:
                claim_started = time.monotonic()
                self._claiming = free  # until the jobs claimed have their slots
                wanted = free + ahead
                claimed = await self.claims.claim(wanted * self.batch_size, claim_started, wanted)
                self.pace.claimed(time.monotonic() - claim_started)
                self._claiming = min(len(claimed.jobs), free)
                # a wake-up while the claim ran (an outcome written, a job enqueued) may have
                # made a job claimable after the claim's snapshot: not idle yet
                busy = claimed.moved or claimed.held or self._jobs or self._outcomes_pending()
                if busy or self._wakeup.is_set():
                    self.idle.clear()
                else:
                    self.idle_claim_started = claim_started
                    self.idle.set()
                if claimed.jobs:
                    await self._start(claimed.jobs, claim_started)
                self._claiming = 0
                if claimed.more:
                    continue
                timeout = self.claims.idle_timeout()
            except Exception as exc:  # the loop must outlive any database trouble
                self._claiming = 0
                timeout = self.claims.failure_pause(exc)
            if not self._ahead:
                await wait_any(self._wakeup, stopping, timeout=timeout)
                continue
            # units claimed ahead wait: a slot freeing wakes the loop too
            if self.concurrency - len(self._jobs) - self._kept > 0:
                continue
            self._slot_freed.clear()
            patience = self._ahead_patience() or 0.0
            await wait_any(self._wakeup, self._slot_freed, stopping, timeout=min(timeout, patience))

    async def _start(self, jobs: list[ClaimedJob], claimed_at: float) -> None:
        """Lock the jobs and run them, a unit per free slot (`_units`); the units beyond the
        free slots (claimed ahead) wait for slots, in claim order."""
        units = await self._units(jobs)
        free = max(0, self.concurrency - len(self._jobs) - self._kept)
        for unit in units[:free]:  # a stop that began meanwhile lets them run, as it lets any
            self._open_slot(unit, claimed_at)
        why = None
        if self._stopping is not None and self._stopping.is_set():
            why = "worker shutting down"
        elif self._rt.protocol.limited(self.queue):  # limits set since the claim before
            why = "the queue has limits: not claimed ahead"
        if why is not None:
            for unit in units[free:]:
                await self._give_back(unit, why)
            return
        now = time.monotonic()
        for unit in units[free:]:
            self._ahead.append(_Waiting(unit, claimed_at, now))
            self.claimed_ahead += len(unit)
            metrics.of(metrics.JOBS_CLAIMED_AHEAD, self.queue).inc(len(unit))

    def _start_ahead(self, free: int) -> None:
        """Start units claimed ahead in `free` free slots."""
        while free > 0 and self._ahead:
            waiting = self._ahead.popleft()
            self._open_slot(waiting.unit, waiting.claimed_at)
            free -= 1

    def _open_slot(self, unit: list[RunningJob], claimed_at: float) -> None:
        task = asyncio.create_task(
            self._run_slot([unit], claimed_at), name=f"dataloader-job-{unit[0].job.job_id}"
        )
        self._jobs.add(task)
        task.add_done_callback(self._finished)

    async def _run_slot(self, units: list[list[RunningJob]], claimed_at: float) -> None:
        """A slot's run: `units`, then the units claimed ahead, while some wait and the
        worker does not stop (those left then go back to the queue: see `run`)."""
        await self._execute_units(units, claimed_at)
        while self._ahead and not (self._stopping is not None and self._stopping.is_set()):
            waiting = self._ahead.popleft()
            if not self._ahead:
                self._slot_freed.set()  # room to claim ahead again
            await self._execute_units([waiting.unit], waiting.claimed_at)

    def _unit_ran(self, seconds: float) -> None:
        self.pace.ran(seconds)

    def _ahead_patience(self) -> float | None:
        """Seconds until the oldest unit claimed ahead has waited AHEAD_MAX_WAIT_SEC (None:
        none waits)."""
        if not self._ahead:
            return None
        return max(0.0, self._ahead[0].since + AHEAD_MAX_WAIT_SEC - time.monotonic())

    def _give_back_ahead(self, *, stale_only: bool) -> None:
        """Give back to the queue, attempt refunded, the units claimed ahead that waited
        AHEAD_MAX_WAIT_SEC for a slot (`stale_only`: the slots' jobs turned out long, which
        the pace learns; another worker may be free), or all of them (the worker stops).
        Their outcomes are queued without waiting: this runs when the loop is cancelled too."""
        now = time.monotonic()
        if stale_only:
            if not self._ahead or now - self._ahead[0].since < AHEAD_MAX_WAIT_SEC:
                return
            self.pace.stalled(now - self._ahead[0].since)
            why = f"claimed ahead, no slot was free within {AHEAD_MAX_WAIT_SEC:g}s"
            log.info("jobs claimed ahead on %s go back to the queue: %s", self.queue, why)
        else:
            why = "worker shutting down"
        while self._ahead and (not stale_only or now - self._ahead[0].since >= AHEAD_MAX_WAIT_SEC):
            self._give_back_now(self._ahead.popleft().unit, why)

    def _outcomes_pending(self) -> bool:
        """Whether a job of this queue has ended but its outcome is not written yet: a
        failure written later may make it ready again (the write wakes this queue)."""
        return any(r.job.queue == self.queue for r in self._rt.running.values())


class _Waiting(NamedTuple):
    """A unit claimed ahead, waiting for a slot."""

    unit: list[RunningJob]
    #: When (monotonic) the claim that took it started, and when it began to wait.
    claimed_at: float
    since: float


def declared_batch_size(runtime: WorkerRuntime, queue: str) -> int:
    """The largest `batch_size` of the tasks declared on `queue` (1 when none is batched)."""
    return max((t.batch_size for t in runtime.registry.tasks() if t.queue == queue), default=1)


def _count_start(job: ClaimedJob, since_claim: float) -> None:
    """A job's attempt starts in this process, `since_claim` seconds after its claim started
    (metrics: it waited until its claim, then that long)."""
    metrics.of(metrics.JOBS_STARTED, job.queue, job.task).inc()
    if job.waited_sec is not None:
        metrics.of(metrics.JOB_WAIT, job.queue).observe(max(0.0, job.waited_sec) + since_claim)
