"""Batched heartbeat: one statement per period extends the leases of every job this process
runs or still has an outcome to write for, learns of cancel requests, and finds jobs that are
no longer ours (to stop them). It runs on the workers' own connections, which pipelines cannot
take, and never waits for a row someone else has locked. It also probes (and audits) the
lock-holding connection, whose loss means every lock is gone. It stops a job (self-fencing,
`workers.fencing`) when its lease could not be extended in time, or when the process's presence
could not be refreshed in time: by then the reaper may take the job."""

from __future__ import annotations

import asyncio
import logging
import time

from dataloader.storage.db import CONNECTION_ERRORS
from dataloader.workers.fencing import INF, beat_period_for, fence_window
from dataloader.workers.locks import LockConnectionLost
from dataloader.workers.runtime import RunningJob, WorkerRuntime
from dataloader.workers.waiting import wait_any

log = logging.getLogger(__name__)

#: A `heartbeat` journal row per job at most this often (the lease is extended every beat).
JOURNAL_EVERY_SEC = 60.0


class Heartbeat:
    """Keeps this process's leases alive."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        self._rt = runtime
        self._lock_probe: asyncio.Task[None] | None = None

    def period(self) -> float:
        """DL_HEARTBEAT_SEC, shortened so that no running job's lease can lapse between beats."""
        period = self._rt.settings.heartbeat_sec
        for running in self._rt.running.values():
            period = min(period, beat_period_for(running.job.lease_ttl_sec))
        return period

    async def run(self, stopping: asyncio.Event) -> None:
        """Beat until `stopping` is set. A job with a short lease starting makes the next beat
        come sooner (the deadline is recomputed from the last beat, never pushed back). Jobs are
        stopped at their own fence deadline, which may fall between beats or during one.
        Should the loop itself fail, every running job is stopped: nothing would stop them
        at their deadlines until it is restarted."""
        try:
            await self._beat_until(stopping)
        except Exception:
            self._rt.lose_all("the heartbeat failed")
            raise

    async def _beat_until(self, stopping: asyncio.Event) -> None:
        last_beat = time.monotonic()
        while not stopping.is_set():
            self.fence_stale()
            now = time.monotonic()
            # the presence's deadline too, jobs or not: a job starting during this sleep
            # must be stopped on time (one starting after the deadline wakes us)
            presence_due = self._rt.presence.valid_until
            wait = (
                min(
                    last_beat + self.period(),
                    self.next_fence_at(),
                    presence_due if presence_due > now else INF,
                )
                - now
            )
            if wait > 0:
                self._rt.job_started.clear()
                self._rt.beat_period = self.period()
                await wait_any(stopping, self._rt.job_started, timeout=wait)
                continue
            if now < last_beat + self.period():
                continue  # woken for a fence deadline, not for a beat
            last_beat = now
            await self._beat_fencing()
        if self._lock_probe is not None:
            self._lock_probe.cancel()

    async def _beat_fencing(self) -> None:
        """One beat, bounded (a hung connection must not keep the leases from being extended
        at the next one), fencing jobs whose deadline comes while it is out."""
        beat = asyncio.create_task(
            asyncio.wait_for(self.beat_once(), timeout=max(self.period(), 1.0)), name="heartbeat"
        )
        try:
            while not beat.done():
                fence_in = self.next_fence_at() - time.monotonic()
                await asyncio.wait([beat], timeout=None if fence_in == INF else max(fence_in, 0))
                self.fence_stale()
        finally:
            beat.cancel()
        try:
            beat.result()
        except Exception as exc:  # keep beating: the next one may get through
            log.warning(
                "heartbeat failed: %r", exc, exc_info=not isinstance(exc, CONNECTION_ERRORS)
            )

    def _fenced(self) -> list[RunningJob]:
        """Jobs whose pipeline may still have to be stopped: a finished job has none, and its
        outcome write is fenced anyway."""
        return [
            r for r in self._rt.running.values() if not r.finished and r.state.lost_reason is None
        ]

    def next_fence_at(self) -> float:
        """When the first running job is to be stopped unless its lease is extended, or the
        process's presence refreshed, before."""
        presence_due = self._rt.presence.valid_until
        return min((min(_fence_at(r), presence_due) for r in self._fenced()), default=INF)

    def fence_stale(self) -> None:
        """Stop jobs whose lease we could not extend in time, or all of them when the process's
        presence could not be refreshed in time: by the time the lease expires, or the others
        find the process gone, another worker may take the job, and two runs must never
        overlap. (A local clock, used only to stop early; the lease and the presence are the
        database's, and were set after our clock read.)"""
        now = time.monotonic()
        presence_lapsed = self._rt.presence.lapsed(now)
        for r in self._fenced():
            if now >= _fence_at(r):
                log.error("job %s: lease not extended in time; stopping it", r.job.job_id)
                r.lose("the lease could not be extended before it expired")
            elif presence_lapsed:
                log.error("job %s: presence not refreshed in time; stopping it", r.job.job_id)
                r.lose("the process's presence could not be refreshed before it lapsed")

    async def beat_once(self) -> None:
        """One heartbeat for every running job, and a probe of the lock connection."""
        await self._extend_leases()
        self._probe_locks()

    def _probe_locks(self) -> None:
        """Audit the lock connection unless an audit is still out. In a task of its own, bounded
        by the holder's own timeout (DL_DB_TIMEOUT_SEC), not by the beat's: only the holder's
        timeout marks a half-open connection lost and its server session for ending, and a
        silent lock connection must not hold up the leases' extension either."""
        if self._lock_probe is None or self._lock_probe.done():
            self._lock_probe = asyncio.create_task(self._audit_locks(), name="lock-probe")

    async def _audit_locks(self) -> None:
        try:
            await self._rt.locks.audit()
        except LockConnectionLost:
            pass  # the holder has stopped the jobs it had locked, and reconnects
        except Exception as exc:  # the next beat probes again
            log.warning("lock connection probe failed: %r", exc)

    async def _extend_leases(self) -> None:
        # Every job still ours is extended: a running pipeline, one stopped but still winding
        # down (its row must stay `running`, so that no claim takes its key before it ends),
        # and a finished one until its outcome is written.
        running = [r for r in self._rt.running.values() if not r.gone]
        if not running:
            return
        now = time.monotonic()
        beats = [
            (r.job.job_id, r.job.claim_token, now - r.last_journaled >= JOURNAL_EVERY_SEC)
            for r in running
        ]
        alive = await self._rt.protocol.heartbeat(beats, self._rt.worker_id)
        for r in running:
            beat = alive.get(r.job.job_id)
            if beat is None:
                if self._rt.running.get(r.job.job_id) is r:  # its outcome not written meanwhile
                    r.gone = True
                    if not r.finished:
                        log.warning("job %s is no longer ours; stopping it", r.job.job_id)
                        r.lose("lease lost: the job was taken back by the reaper")
                continue
            if beat.extended:
                r.lease_extended_at = now
                # journaled with the extension, a skipped row not (a beat whose answer was
                # lost after its commit journals once more: a row, never a gap of a minute)
                if now - r.last_journaled >= JOURNAL_EVERY_SEC:
                    r.last_journaled = now
            elif now - r.lease_extended_at >= beat_period_for(r.job.lease_ttl_sec):  # not passing
                log.warning(
                    "job %s: its row is locked by another session; lease not extended for %.1fs",
                    r.job.job_id,
                    now - r.lease_extended_at,
                )
            if beat.cancel_requested:
                r.request_cancel()


def _fence_at(running: RunningJob) -> float:
    """The local time at which a job whose lease is not extended meanwhile is stopped."""
    return running.lease_extended_at + fence_window(running.job.lease_ttl_sec)
