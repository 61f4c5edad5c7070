"""WorkerManager: starts this process's queue workers, listener, heartbeat, presence and its
bid for maintenance (reaper, pruner, cron) from `WORKERS_JSON`, and stops them gracefully
(spec §2, §9)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from functools import partial
from typing import TYPE_CHECKING

from dataloader import metrics
from dataloader.logger.summary import job_summary
from dataloader.maintenance.cron import MAX_SLEEP_SEC, CronScheduler, configured_schedules
from dataloader.maintenance.leader import Leadership
from dataloader.maintenance.pruner import Pruner, Retention
from dataloader.maintenance.runner import Maintenance, Periodic
from dataloader.storage import db
from dataloader.storage.maintenance import MaintenanceStore
from dataloader.storage.presence import PresenceStore
from dataloader.storage.protocol import ClaimedJob, WorkerProtocol
from dataloader.tasks import TaskRegistry
from dataloader.workers.base import QueueWorker
from dataloader.workers.completer import Completer
from dataloader.workers.destinations import check_at_start, warn_awaited
from dataloader.workers.heartbeat import Heartbeat
from dataloader.workers.listener import Listener
from dataloader.workers.locks import LockHolder
from dataloader.workers.presence import Presence
from dataloader.workers.processors import SharedSlots
from dataloader.workers.reaper import Reaper
from dataloader.workers.runtime import WorkerRuntime, new_worker_id
from dataloader.workers.supervisor import Loop, Supervisor
from dataloader.workers.watchdog import Watchdog

if TYPE_CHECKING:
    from dataloader.config import CronSpec, Settings
    from dataloader.context import AppContext

log = logging.getLogger(__name__)

#: Largest size of the workers' own pool.
WORKER_POOL_MAX = 8


class WorkerManager:
    """All background work of one process."""

    def __init__(self, app: AppContext, registry: TaskRegistry) -> None:
        settings: Settings = app.settings
        # The workers' own pool (claims, heartbeats, outcome writes), apart from the pool the
        # API and pipelines use: pipelines holding every connection of theirs cannot starve a
        # lease or an outcome write. One connection per queue's claim loop, the heartbeat's
        # and the completer's.
        self._pool = db.new_pool(
            app.dsn,
            min(2 + len(settings.workers), WORKER_POOL_MAX),
            "dataloader-worker",
            settings.db_timeout_sec,
            statement_cache=app.routes.statement_cache,
        )
        # session advisory locks and LISTEN need a server session of their own for longer
        # than a transaction: straight to the server past a transaction pooler
        session_dsn = app.routes.session_dsn
        self.runtime = WorkerRuntime(
            settings=settings,
            app=app,
            protocol=WorkerProtocol(self._pool, settings.db_timeout_sec),
            locks=LockHolder(
                session_dsn, on_lost=self._locks_lost, timeout=settings.db_timeout_sec
            ),
            registry=registry,
            worker_id=new_worker_id(),
            summary=job_summary(settings.log_summary_sec),
        )
        self.completer = Completer(self.runtime, on_written=self._queue_ready, slots=self)
        #: Each entry of WORKERS_JSON: a queue's own slots, or slots shared by queues.
        rt, completer = self.runtime, self.completer
        self.workers: list[QueueWorker | SharedSlots] = [
            SharedSlots(spec.served, spec.concurrency, spec.batch_size, rt, completer)
            if spec.shared
            else QueueWorker(spec.served[0], spec.concurrency, rt, completer)
            for spec in settings.workers
        ]
        #: Who serves each queue.
        self.queues = {queue: w for w in self.workers for queue in _served(w)}
        self.listener = Listener(
            session_dsn,
            on_queue_ready=self._queue_ready,
            on_cancel=self._cancel_requested,
            on_connected=self.wake_all,
            check_period_sec=settings.poll_interval_sec,
            timeout=settings.db_timeout_sec,
        )
        self.heartbeat = Heartbeat(self.runtime)
        self.presence = Presence(
            PresenceStore(self.runtime.protocol.db),
            self.runtime.worker_id,
            {queue: w.concurrency for queue, w in self.queues.items()},
            registry,
            settings.presence_period_sec,
            self.runtime.presence,
            self.runtime.ended,
        )
        #: Keeps the process alive from a thread of its own while a handler holds this loop.
        self.watchdog = Watchdog(self.runtime, app.dsn)
        self.reaper = Reaper(
            self.runtime.protocol,
            self.runtime.worker_id,
            self.runtime.ended,
            presence=self.runtime.presence,
        )
        #: Restarts whichever of this process's loops raises, and records it for /status.
        self.supervisor = Supervisor(MaintenanceStore(self.runtime.protocol.db), self.worker_id)
        self._schedules = configured_schedules(settings.cron, registry)
        self.maintenance = _maintenance(
            settings, app, self._schedules, self.runtime.protocol, self.reaper, self.supervisor
        )
        self._stop_claiming = asyncio.Event()  # queue workers and reaper
        self._stop_all = asyncio.Event()  # heartbeat, listener, lock holder
        self._hurry = asyncio.Event()  # cut the grace period of `stop` short
        self._loop = asyncio.get_running_loop()
        self._tasks: list[asyncio.Task[None]] = []
        self._claiming_tasks: list[asyncio.Task[None]] = []
        self._counted = False  # in the running gauges

    @property
    def worker_id(self) -> str:
        return self.runtime.worker_id

    async def start(self) -> None:
        """Open the workers' connections and start every loop."""
        await self._pool
        locks = self.runtime.locks
        try:
            await locks.connect()
        except BaseException:
            await self._pool.close()
            raise
        try:
            awaited = await check_at_start(
                self._schedules,
                self.runtime.registry,
                self.presence.store,
                self.queues,
                allow_unknown=self.runtime.settings.allow_unknown_tasks,
            )
            warn_awaited(awaited)
            await self.presence.register()
        except BaseException:
            await locks.close()
            await self._pool.close()
            raise
        self._spawn("watchdog", self.watchdog.run, self._stop_all)
        self._spawn("locks", locks.maintain, self._stop_all)
        self._spawn("listener", self.listener.run, self._stop_all)
        self._spawn("heartbeat", self.heartbeat.run, self._stop_all)
        self._spawn("summary", self.runtime.summary.run, self._stop_all)
        self._claiming_tasks = [
            self._spawn("maintenance", self.maintenance.run, self._stop_claiming),
            self._spawn("presence", self.presence.run, self._stop_claiming),
            *(
                self._spawn(f"queue:{','.join(_served(worker))}", worker.run, self._stop_claiming)
                for worker in self.workers
            ),
        ]
        self._count_running(+1)
        log.info(
            "workers started",
            extra={
                "worker_id": self.worker_id,
                "queues": {q: w.concurrency for q, w in self.queues.items()},
            },
        )

    def hurry(self) -> None:
        """End the grace period of a stop now: unfinished jobs are handed back at once, and
        outcome writes still failing are given up. Safe to call from a signal handler."""
        self._loop.call_soon_threadsafe(self._hurried)

    def _hurried(self) -> None:
        self._hurry.set()
        for worker in self.workers:
            worker.hurry()
        if self._stop_claiming.is_set():  # stopping: failing outcome writes are given up too
            self.completer.close(hurry=True)

    async def stop(self, timeout: float) -> None:
        """Stop claiming; let running jobs finish for `timeout` seconds (or until `hurry`);
        hand the rest back to the queue (attempt refunded, lock released); then stop
        everything."""
        self._stop_claiming.set()
        self.runtime.protocol.stop_recovering()
        # Let claims in flight settle first, so that every job they took is seen below.
        _, late = await asyncio.wait(self._claiming_tasks, timeout=10)
        for task in late:  # a claim still unanswered: its jobs are the reaper's, as at a crash
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        for worker in self.workers:
            worker.give_back_waiting()
        await self.presence.deregister()  # no longer serving: triggers and /status see it now
        jobs = {task for worker in self.workers for task in worker.job_tasks}
        if jobs and not self._hurry.is_set():
            log.info("waiting up to %.0fs for %d running job(s)", timeout, len(jobs))
            finished = asyncio.create_task(asyncio.wait(jobs))  # cancelling it spares the jobs
            hurried = asyncio.create_task(self._hurry.wait())
            await asyncio.wait(
                [finished, hurried], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            finished.cancel()
            hurried.cancel()
        pending = {task for task in jobs if not task.done()}
        if pending:
            log.warning("handing %d unfinished job(s) back to the queue", len(pending))
            for running in list(self.runtime.running.values()):
                running.hand_back()
            _, stuck = await asyncio.wait(pending, timeout=10)
            if stuck:
                log.error(
                    "%d pipeline(s) ignored cancellation; their locks go with the lock"
                    " connection and the reaper will requeue their jobs",
                    len(stuck),
                )
        self.completer.close(hurry=self._hurry.is_set())
        await self.completer.wait_flushed()
        try:  # what the last jobs ended as
            await self.presence.flush_throughput()
        except Exception as exc:
            log.warning("could not write the last throughput counts: %r", exc)
        self._stop_all.set()
        await asyncio.wait(self._tasks, timeout=5)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.watchdog.stop()
        # idle by now, but for a plain `def` handler that ignored its stop: not waited for
        self.runtime.threads.shutdown(wait=False)
        await self.runtime.locks.close()
        await asyncio.wait_for(self._pool.close(), timeout=10)
        self._count_running(-1)
        log.info("workers stopped")

    def _count_running(self, change: int) -> None:
        """Count this manager and its slots in the running gauges once (a stop may run
        twice: the second takes nothing off)."""
        if self._counted == (change > 0):
            return
        self._counted = change > 0
        metrics.RUNNING_WORKERS.inc(change)
        metrics.RUNNING_PROCESSORS.inc(change * sum(w.concurrency for w in self.workers))

    async def wait_idle(self) -> None:
        """Return once every queue, in a claim started after this call, found nothing to
        claim with none of its jobs running."""
        since = time.monotonic()
        for worker in self.workers:
            while not (worker.idle.is_set() and worker.idle_claim_started >= since):
                worker.idle.clear()
                worker.wake()
                await worker.idle.wait()
        await self.completer.wait_flushed()

    def wake_all(self) -> None:
        """Every queue polls once (after a listener reconnect)."""
        for worker in self.workers:
            worker.wake()

    def keep_slot(self, queue: str) -> bool:
        """A free slot of `queue` kept for a job an outcome's write may hand this process."""
        worker = self.queues.get(queue)
        return worker is not None and worker.keep_slot()

    def release_slot(self, queue: str) -> None:
        self.queues[queue].release_slot()

    def take_handed(self, job: ClaimedJob) -> None:
        self.queues[job.queue].take_handed(job)

    def _queue_ready(self, queue: str) -> None:
        worker = self.queues.get(queue)
        if worker is not None:
            worker.wake()

    def _cancel_requested(self, job_id: uuid.UUID) -> None:
        running = self.runtime.running.get(job_id)
        if running is not None:
            running.request_cancel()

    def _locks_lost(self, reason: str) -> None:
        self.runtime.lose_all(reason)

    def _spawn(self, name: str, loop: Loop, stopping: asyncio.Event) -> asyncio.Task[None]:
        """Run `loop` until `stopping`, supervised: restarted whenever it raises."""
        task = asyncio.create_task(
            self.supervisor.run(name, loop, stopping), name=f"dataloader-supervise-{name}"
        )
        self._tasks.append(task)
        return task


def _maintenance(
    settings: Settings,
    app: AppContext,
    schedules: list[CronSpec],
    protocol: WorkerProtocol,
    reaper: Reaper,
    supervisor: Supervisor,
) -> Maintenance:
    """The maintenance this process runs while it leads: reaper, pruner, cron scheduler."""
    store = MaintenanceStore(protocol.db)
    pruner = Pruner(store, Retention.of(settings), settings.prune_batch_size)
    cron = CronScheduler(store, app.client, schedules)
    return Maintenance(
        Leadership(store, supervisor.holder, settings.leader_lease_sec),
        store,
        [
            Periodic(
                "reaper",
                reaper.sweep,
                settings.reaper_period_sec,
                partial(
                    reaper.next_in_sec, settings.reaper_period_sec, settings.presence_period_sec
                ),
            ),
            Periodic("pruner", pruner.prune, settings.prune_period_sec),
            Periodic("cron", cron.tick, MAX_SLEEP_SEC, cron.next_in_sec),
        ],
        supervisor,
    )


def _served(worker: QueueWorker | SharedSlots) -> list[str]:
    """The queues a worker serves."""
    return worker.queues if isinstance(worker, SharedSlots) else [worker.queue]
