"""A queue's claim rounds: put back the delayed jobs come due, claim, park what cannot run.

Each claim tells when the queue's earliest delayed job is due, so the next round puts back
delayed jobs only when one is (no statement runs for nothing), and a worker with nothing to
claim sleeps until then at most. Jobs a claim walked past that cannot run (not due, or behind a
running job of their lock_key) are parked, and the next claim walks further, so that a long
run of them is parked in a few claims rather than one slot's worth each.

While its jobs run shorter than a claim takes, a worker claims ahead (`ClaimPace`): beyond its
free slots, the jobs its slots run in a claim's time, claimed while its slots run, so that the
claim's round trip overlaps their runs instead of following them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from dataloader import metrics
from dataloader.core.due import PutBack, next_put_back_at
from dataloader.core.processes import namespace_of
from dataloader.storage.db import CONNECTION_ERRORS
from dataloader.storage.protocol import ClaimedJob
from dataloader.workers.runtime import WorkerRuntime
from dataloader.workers.waiting import jittered

log = logging.getLogger(__name__)

#: The most jobs one claim walks (locking each) after the last one parked some: a run of
#: 50,000 jobs of a running lock_key is parked in about ten claims.
MAX_WALK = 10_000
#: Delayed jobs come due put back per statement.
PUT_BACK_BATCH = 1000
#: Weight of the newest measure in the estimates of `ClaimPace`.
PACE_WEIGHT = 0.2
#: Fewest units a claim ahead may take, however few the slots: claims of twenty jobs cost the
#: database far less per job than claims of a few.
AHEAD_MIN_UNITS = 20
#: Longest a job claimed ahead waits for a slot before it goes back to the queue (the jobs in
#: the slots turned out long: another worker may be free).
AHEAD_MAX_WAIT_SEC = 1.0


@dataclass(frozen=True, slots=True)
class Claimed:
    """What one claim round took, and whether another may find more at once."""

    jobs: list[ClaimedJob]
    #: Jobs parked or put back leave others claimable, a delayed job is due, or the claim
    #: stopped at its walk (a batch comes back short when several candidates share a
    #: lock_key): nothing would wake the worker for them. A claim that walked every job needs
    #: no second look: whatever changes after it (a new job, a freed key, a retry) wakes it.
    more: bool
    #: The round changed the queue: it claimed, parked or put back jobs.
    moved: bool
    #: Jobs that could run but the queue's limits held back (the queue is not idle).
    held: int = 0


@dataclass(slots=True)
class ClaimPace:
    """How many units (a job, or a batch) a worker claims ahead: for slots that are not free
    yet, while the slots' jobs run, so that the claim's round trip overlaps their runs rather
    than leaving the slots idle. Only while the units run shorter than a claim takes (both
    estimated from what the worker saw last), and no more than its slots run in one claim's
    time: a unit claimed ahead then waits for a slot no longer than it would have waited for
    the next claim. Without an estimate yet (no unit ran), nothing is claimed ahead."""

    #: Whether claiming ahead is allowed at all (`DL_CLAIM_AHEAD`).
    enabled: bool
    #: How long a slot's unit runs, and a claim round takes, in seconds.
    run_sec: float | None = None
    claim_sec: float | None = None

    def ran(self, seconds: float) -> None:
        """A unit ran for `seconds` (or the slots were taken that long)."""
        self.run_sec = _blend(self.run_sec, seconds)

    def claimed(self, seconds: float) -> None:
        """A claim round took `seconds`."""
        self.claim_sec = _blend(self.claim_sec, seconds)

    def stalled(self, seconds: float) -> None:
        """Units claimed ahead waited `seconds` for a slot: the slots' units run at least that
        long, until short runs say otherwise again."""
        self.run_sec = max(self.run_sec or 0.0, seconds)

    def ahead(self, slots: int, waiting: int, *, limited: bool = False) -> int:
        """How many units to claim ahead now, for `slots` slots with `waiting` units claimed
        ahead already: none while some wait, nor for a queue with limits (`limited`: a job
        claimed counts against them, and would hold back another worker's free slot); else
        what the slots run in a claim's time, at most the slots or AHEAD_MIN_UNITS, whichever
        is more."""
        run, claim = self.run_sec, self.claim_sec
        if not self.enabled or limited or waiting or run is None or claim is None or run > claim:
            return 0
        most = max(slots, AHEAD_MIN_UNITS)
        return most if run == 0 else min(most, int(slots * claim / run))


def _blend(estimate: float | None, measure: float) -> float:
    """An exponentially weighted moving average, started at the first measure."""
    if estimate is None:
        return measure
    return estimate + PACE_WEIGHT * (measure - estimate)


class QueueClaims:
    """The claim rounds of one queue, for one process."""

    def __init__(self, queue: str, runtime: WorkerRuntime) -> None:
        self.queue = queue
        self._rt = runtime
        #: Claim rounds started and answered, or failed (one at a time: the n-th answered is
        #: the n-th started; none in flight when they are equal), for operators and tests.
        self.started = 0
        self.answered = 0
        #: How many jobs the next claim walks at least (see MAX_WALK).
        self._walk = 0
        #: When (monotonic) the queue's earliest delayed job is due, as the last claim saw it
        #: (infinity: none; see `_put_back_due`).
        self._due_at = 0.0

    async def claim(self, wanted: int, now: float, slots: int | None = None) -> Claimed:
        """One round started at `now` (monotonic): up to `wanted` jobs, that fill `slots` free
        slots at most (None: any number) as the worker runs them: a job of a one-job task
        fills one, up to `batch_size` jobs of one batched task fill one together."""
        # counted from the start of the round, its put-back included: a round decided before
        # something changed (a pace, a limit) is in flight from here on
        self.started += 1
        try:
            try:
                put_back = await self._put_back_due(now)
                started = time.perf_counter()
                with metrics.of(metrics.CLAIM_DURATION, self.queue).time():
                    claim = await self._rt.protocol.claim_round(
                        self.queue,
                        wanted,
                        self._rt.worker_id,
                        walk=max(wanted, self._walk),
                        slots=slots,
                        batch_sizes={
                            t.name: t.batch_size
                            for t in self._rt.registry.tasks()
                            if t.batch_size > 1
                        },
                    )
            finally:
                self.answered += 1  # or failed: no longer in flight either way
            if claim.jobs:
                _time_process_scans(claim.jobs, time.perf_counter() - started)
            # armed from the claim's answer, which came after the database read its clock:
            # the timer never wakes the loop before the job is due by that clock
            answered = time.monotonic()
            self._due_at = next_put_back_at(answered, put_back, claim.next_due_in)
            parked = await self._rt.protocol.park(claim.blocked) if claim.blocked else 0
        except BaseException:
            self._due_at = 0.0  # unknown: look again
            raise
        self._walk = min(max(self._walk, wanted) * 4, MAX_WALK) if parked else 0
        return Claimed(
            claim.jobs,
            # a round that claimed nothing because the limits held jobs back is not tried
            # again at once (that would spin): a job leaving `running` wakes the worker
            more=bool(
                parked
                or (put_back is not None and put_back.count)
                or self._due_at <= answered
                or (not claim.exhausted and (claim.jobs or not claim.held))
            ),
            moved=bool(claim.jobs or parked or (put_back is not None and put_back.count)),
            held=claim.held,
        )

    def failure_pause(self, exc: BaseException) -> float:
        """Log a failed round; how long to wait before the next (the loop must outlive any
        database trouble, without hammering it)."""
        log.warning("claim on %s failed: %r", self.queue, exc, exc_info=_unexpected(exc))
        return jittered(min(self._rt.settings.poll_interval_sec, 1.0))

    def idle_timeout(self) -> float:
        """Sleep until the safety poll or the earliest delayed job, whichever comes first."""
        poll = jittered(self._rt.settings.poll_interval_sec)
        return max(0.0, min(poll, self._due_at - time.monotonic() + 0.001))

    async def _put_back_due(self, now: float) -> PutBack | None:
        """Put back the queue's delayed jobs that have come due, when the last claim said one
        is (see `core.due`); what it did, or None when none was due."""
        if now < self._due_at:
            return None
        return await self._rt.protocol.put_back_due(self.queue, PUT_BACK_BATCH)


def _time_process_scans(jobs: list[ClaimedJob], seconds: float) -> None:
    """Time a claim round that took tasks of durable processes as progressor's scans: of
    calls (init, call, repair) or of timers (timeout, remove), once per namespace and kind."""
    seen: set[tuple[str, bool]] = set()
    for job in jobs:
        namespace = namespace_of(job.task)
        if namespace is None:
            continue
        timer = bool(job.args.get("timer"))
        if (namespace, timer) not in seen:
            seen.add((namespace, timer))
            stage = "timers_scanning" if timer else "calls_scanning"
            metrics.observe_process_stage(stage, namespace, seconds)


def _unexpected(exc: BaseException) -> bool:
    """Whether a failure deserves a traceback in the log (a lost connection does not)."""
    return not isinstance(exc, CONNECTION_ERRORS)
