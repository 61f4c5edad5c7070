"""The watchdog: a thread of its own that keeps this process looking alive while a handler
holds the workers' event loop, and names the handler that held it.

Presence, heartbeats and leadership run on the event loop that runs the handlers. An `async def`
handler that makes a blocking call (a database driver, pandas, `time.sleep`) holds that loop:
nothing else of the process runs until it returns. Without the watchdog the presence row and
the leases would age meanwhile, and after three presence periods (or at the lease's end) the
reaper would take the job back while its handler still runs, so that it would end `lost` or run
twice at once. The watchdog cannot be starved by user code: it runs on a thread with its own
event loop and its own connection, and

* every `TICK_SEC` it asks the workers' loop to answer; a loop that has not answered for half a
  presence period (or half a beat of the shortest lease) is *held*;
* while the loop is held, it refreshes the process's presence row and extends the leases of the
  jobs the process runs (the heartbeat's fenced statement: a job taken back meanwhile is not
  extended), and moves the process's own deadlines forward, so that the heartbeat does not stop
  the jobs when the loop comes back;
* once the loop answers after being held `DL_LOOP_HELD_WARN_SEC` or more, it logs a WARNING
  naming what held it (the task and job whose handler ran, else the asyncio task) and how long,
  and records it for `/status`, which warns of it while the process is live.

A process whose handler holds its loop is still alive: its other jobs wait, its job keeps its
lease. A truly dead process (killed, frozen as a whole, cut from the database) stops refreshing
from the watchdog too, and is found gone as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

from dataloader.storage import db
from dataloader.storage.connections import GuardedPool
from dataloader.storage.maintenance import MaintenanceStore
from dataloader.storage.presence import PresenceStore
from dataloader.storage.protocol import WorkerProtocol
from dataloader.workers.fencing import beat_period_for
from dataloader.workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)

#: How often the watchdog asks the workers' loop to answer.
TICK_SEC: Final = 0.1
#: The `dl_maintenance_runs` entry of the last held loop (read by /status).
HELD_LOOP_RECORD: Final = "event loop"
#: What to do instead of holding the loop, said wherever a held loop is reported.
ADVICE: Final = (
    "make blocking calls in a plain `def` task (run in a thread) or with"
    " `await asyncio.to_thread(...)`, not in an `async def` handler"
)


@dataclass(frozen=True, slots=True)
class Hold:
    """The workers' loop held `seconds` long by `holder` (who held it, as people read it)."""

    seconds: float
    holder: str

    def message(self) -> str:
        return f"the event loop was held for {self.seconds:.1f}s by {self.holder}: {ADVICE}"


class Watchdog:
    """Watches the loop it was created on from a thread of its own (`start`, `stop`)."""

    def __init__(self, runtime: WorkerRuntime, dsn: str) -> None:
        self._rt = runtime
        self._dsn = dsn
        self._loop = asyncio.get_running_loop()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: When (monotonic) the loop was last asked to answer, when it answered, and whether
        #: a question is out.
        self._asked_at = self._answered_at = time.monotonic()
        self._asked = False
        #: Who held the loop, as seen while it was held (the loop cannot say it afterwards).
        self._holder: str | None = None
        #: The last hold reported, and one the thread has still to record for /status.
        self.last_hold: Hold | None = None
        self._unrecorded: Hold | None = None

    async def run(self, stopping: asyncio.Event) -> None:
        """Watch from the thread until `stopping` is set. A thread that fails (its connection
        refused at start, a bug) raises here, on the watched loop, where the process's
        supervisor logs it, records it for /status and starts the watchdog again."""
        ended: asyncio.Future[None] = self._loop.create_future()
        self._stop.clear()
        self._asked, self._holder = False, None
        self._thread = threading.Thread(
            target=self._main, args=(ended,), name="dataloader-watchdog", daemon=True
        )
        self._thread.start()
        try:
            stopped: asyncio.Future[Any] = asyncio.ensure_future(stopping.wait())
            try:
                await asyncio.wait([ended, stopped], return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
        finally:
            await self.stop()
        if ended.done():
            ended.result()  # the thread's failure, if it failed

    def watching(self) -> bool:
        """Whether the watchdog's thread runs."""
        return self._thread is not None and self._thread.is_alive()

    async def stop(self) -> None:
        """Stop the thread and close its connection (without holding the loop meanwhile)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread.is_alive():
            await asyncio.to_thread(thread.join, 10)

    def held_after(self) -> float:
        """How long the loop may go without answering before the process's liveness is kept
        from here: half of what the presence and the shortest running lease allow."""
        period = self._rt.settings.presence_period_sec
        for running in list(self._rt.running.values()):
            period = min(period, beat_period_for(running.job.lease_ttl_sec))
        return period / 2

    def _answer(self) -> None:
        """Run on the watched loop when it is free again: it answers, and says what held it
        (here, before anything else waiting on the loop runs: the job's end among them)."""
        self._answered_at = time.monotonic()
        held, holder = self._answered_at - self._asked_at, self._holder
        self._holder = None
        if holder is not None and held >= self._rt.settings.loop_held_warn_sec:
            hold = Hold(held, holder)
            self.last_hold = self._unrecorded = hold
            log.warning(hold.message(), extra={"held_sec": round(held, 3)})
        self._asked = False

    def _main(self, ended: asyncio.Future[None]) -> None:
        """The thread: watch until stopped, then tell the watched loop how it ended."""
        failure: BaseException | None = None
        try:
            asyncio.run(self._watch())
        except BaseException as exc:  # reported on the watched loop, where it is supervised
            failure = exc
        with contextlib.suppress(RuntimeError):  # the watched loop is closed: nobody to tell
            self._loop.call_soon_threadsafe(_settle, ended, failure)

    async def _watch(self) -> None:
        pool = db.new_pool(
            self._dsn,
            1,
            "dataloader-watchdog",
            self._rt.settings.db_timeout_sec,
            statement_cache=self._rt.app.routes.statement_cache,
        )
        await pool
        timeout = self._rt.settings.db_timeout_sec
        stores = _Stores(
            PresenceStore(GuardedPool(pool, timeout)),
            WorkerProtocol(pool, timeout),
            MaintenanceStore(GuardedPool(pool, timeout)),
        )
        try:
            kept_at = 0.0
            while not self._stop.is_set():
                await asyncio.sleep(TICK_SEC)
                now = time.monotonic()
                if not self._asked:  # the loop answered the last question
                    if self._unrecorded is not None:
                        await self._record(stores, self._unrecorded)
                        self._unrecorded = None
                    self._asked, self._asked_at = True, now
                    self._loop.call_soon_threadsafe(self._answer)
                    continue
                silent = now - self._asked_at
                if silent < 2 * TICK_SEC:
                    continue
                if self._holder is None:  # the loop cannot say it once it answers
                    self._holder = self._current_holder()
                held_after = self.held_after()
                if silent >= held_after and now - kept_at >= held_after:
                    kept_at = now
                    await self._keep_alive(stores)
        finally:
            await pool.close()

    def _current_holder(self) -> str:
        task = asyncio.current_task(self._loop)
        if task is None:
            return "a callback of the event loop"
        for running in list(self._rt.running.values()):
            if running.task is task:
                job = running.job
                return f"task {job.task!r} (job {job.job_id}, queue {job.queue!r})"
        return f"the asyncio task {task.get_name()!r}"

    async def _record(self, stores: _Stores, hold: Hold) -> None:
        """Record a hold for /status (the last one of the deployment, shown while its process
        is live and for `health.HELD_LOOP_SHOWN_SEC`)."""
        try:
            await stores.maintenance.record_run(
                HELD_LOOP_RECORD,
                self._rt.worker_id,
                hold.seconds,
                hold.message(),
                {"supervised": True, "held_loop": True},
            )
        except Exception as exc:
            log.warning("could not record the held event loop: %r", exc)

    async def _keep_alive(self, stores: _Stores) -> None:
        """The loop is held: refresh the presence and extend the leases from here."""
        sent = time.monotonic()
        try:
            if await stores.presence.touch(self._rt.worker_id):
                self._rt.presence.vouched(sent)
                self._loop.call_soon_threadsafe(self._rt.presence.renewed.set)
            running = [r for r in list(self._rt.running.values()) if not r.gone]
            beats = [(r.job.job_id, r.job.claim_token, False) for r in running]
            alive = await stores.protocol.heartbeat(beats, self._rt.worker_id)
            for r in running:
                beat = alive.get(r.job.job_id)
                if beat is not None and beat.extended:
                    r.lease_extended_at = max(r.lease_extended_at, sent)
                # a job no longer ours, or a cancel request, is the heartbeat's to act on
                # when the loop answers again (stopping a handler needs the loop)
        except Exception as exc:  # the next tick tries again
            log.warning("the watchdog could not keep the process alive: %r", exc)


def _settle(ended: asyncio.Future[None], failure: BaseException | None) -> None:
    """Resolve `ended` with the thread's failure, or with nothing (run on the watched loop)."""
    if ended.done():
        return
    if failure is None:
        ended.set_result(None)
    else:
        ended.set_exception(failure)


@dataclass(frozen=True, slots=True)
class _Stores:
    """The watchdog's statements, on its own connection."""

    presence: PresenceStore
    protocol: WorkerProtocol
    maintenance: MaintenanceStore
