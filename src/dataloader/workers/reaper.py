"""Reaper (spec §6.5): jobs whose lease expired, or whose owner is gone (its presence lapsed: a
process killed, or cut off from the database, which stopped its jobs itself first), go back to
`queued`, or become `lost` when that happened on their last attempt, or `canceled` when a cancel
was requested (decided by `core.transitions.on_expired`). A job sent back keeps its checkpoint:
the next attempt resumes from it. The reaper also puts back jobs parked behind a lock_key that
nobody holds.

A pass reads the expired jobs with their facts, decides each, and writes the transitions in one
statement (`storage.transitions.settle`), each fenced on the claim it read and on a lease still
expired or an owner still gone: a heartbeat or a presence refresh that got through meanwhile
keeps its job, and of two replicas' reapers only one writes a job's fate. A job whose flags
changed in between (a cancel requested) is decided again on its facts now.

Right after the database was away from this process (a failover, a restart), the reaper waits
until the other processes have had the time to come back (three presence periods): every lease
and every presence ran out in that outage, the live processes' as much as the dead ones', and
the live ones hand their stopped jobs back themselves, refunded.

The next pass comes every DL_REAPER_PERIOD_SEC (at least every three presence periods), or
sooner, when a running job's lease runs out or its owner turns gone unless it refreshes its
presence first: a dead process's jobs are taken back as soon as the database may consider it
dead."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from dataloader import metrics
from dataloader.core.transitions import on_expired
from dataloader.storage.protocol import WorkerProtocol
from dataloader.storage.transitions import settle
from dataloader.workers.fencing import GONE_AFTER_PERIODS, PresenceFence
from dataloader.workers.waiting import jittered

log = logging.getLogger(__name__)

#: Jobs per statement; a pass repeats until fewer come back.
BATCH = 500
#: Decisions of one expired job whose row changes under them, per statement of a pass.
MAX_DECISIONS = 3
#: A pass due when a job becomes reapable comes this long after, so that the database's clock
#: has passed that moment too.
DUE_MARGIN_SEC = 0.1


class Reaper:
    """Sweeps of expired leases."""

    def __init__(
        self,
        protocol: WorkerProtocol,
        reaper_id: str,
        ended: Counter[tuple[str, str]] | None = None,
        presence: PresenceFence | None = None,
    ) -> None:
        self._protocol = protocol
        self._id = reaper_id
        #: This process's presence: whether it just saw the database away (`outage_wait`).
        self._presence = presence
        self._waiting = False  # whether the last pass waited after an outage
        #: Where the attempts it ended are counted (the queues' throughput).
        self._ended = ended if ended is not None else Counter()
        #: Seconds from the last pass to the moment a job next becomes reapable (None: none).
        self.due_in: float | None = None

    async def sweep(self, stopping: asyncio.Event | None = None) -> dict[str, int]:
        """One pass (run by the process that leads maintenance, every DL_REAPER_PERIOD_SEC):
        expired leases, then stranded parked jobs; {new status or `put_back`: jobs}. Right
        after an outage this process saw, expired leases wait (`PresenceFence.outage_wait`):
        the next pass comes when the other processes have had the time to come back."""
        wait = self._presence.outage_wait() if self._presence is not None else 0.0
        if wait > 0:
            if not self._waiting:  # once per outage: passes come every period meanwhile
                log.info("the database was away: expired leases wait for the processes' return")
            swept: dict[str, int] = {"waiting_after_outage": 1}
        else:
            swept = await self.run_once()
        swept["put_back"] = await self.put_back_stranded()
        self.due_in = wait if wait > 0 else await self._protocol.next_reapable_in()
        self._waiting = wait > 0
        return swept

    def next_in_sec(self, period_sec: float, presence_period_sec: float) -> float:
        """When the next pass is due: `period_sec` (jittered) after the last, or as soon as a
        job becomes reapable, if that is sooner (see `next_pass_in`)."""
        return next_pass_in(jittered(period_sec), self.due_in, presence_period_sec)

    async def put_back_stranded(self) -> int:
        """Put back jobs parked behind a lock_key no job holds any more, the first of each
        queue with no job of the key ready (only a change made by hand, or a parked job held
        by another session as an end looked, strands them: the end of a job puts back its
        key's parked jobs); how many."""
        put_back = await self._protocol.put_back_stranded(BATCH)
        for job_id in put_back:
            log.warning("job %s was parked behind a lock_key nobody holds: put back", job_id)
        return len(put_back)

    async def run_once(self) -> dict[str, int]:
        """One full pass; returns {new status: count}."""
        totals: dict[str, int] = {}
        while True:
            expired = await self._protocol.expired(BATCH)
            # a job that changes under us (a cancel requested meanwhile) is decided again
            settled = await settle(
                [job.fence for job in expired],
                lambda fence: on_expired(fence.facts),
                self._protocol.reaper_writer(self._id),
                rounds=MAX_DECISIONS,
            )
            for job in expired:
                if job.job_id not in settled.written:
                    continue
                transition = settled.written[job.job_id].decision
                self._ended[job.queue, transition.journal] += 1
                metrics.count_ended(job.queue, job.task, transition.journal)
                status = transition.status.value
                totals[status] = totals.get(status, 0) + 1
                log.warning("lease expired: job %s is now %s", job.job_id, status)
            if not settled.changing and (len(expired) < BATCH or not settled.written):
                return totals


def next_pass_in(period_sec: float, due_in: float | None, presence_period_sec: float) -> float:
    """The wait before the next pass: the period, or just after the next job known at the last
    pass becomes reapable (`due_in` seconds from it), whichever comes first, and never more
    than the time a process takes to turn gone: a job claimed after the last pass, by a process
    killed at once, is gone no sooner than that, so the pass after it finds out in time."""
    wait = min(period_sec, GONE_AFTER_PERIODS * presence_period_sec)
    return wait if due_in is None else min(wait, max(0.0, due_in) + DUE_MARGIN_SEC)
