"""Why a job is not running: the answer to an operator's daily question, decided from facts
read elsewhere (the job, its queue, the running jobs in its way, the live processes), without
I/O, so that every face that asks gets the same reasons in the same words.

A reason that is held by running jobs (the queue's slots or limits, a partition's limit, a
lock_key) names them and the processes that run them, so that an operator can open them."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from dataloader.base import JobStatus
from dataloader.core.display import stamp
from dataloader.core.models import JobState, QueueStats

#: The running jobs a reason names, at most (it counts the others).
HOLDERS_NAMED: Final = 10


@dataclass(frozen=True, slots=True)
class Holder:
    """A running job in a waiting job's way, and the process that runs it (its host and pid
    when it is live, else its worker id)."""

    job_id: str
    process: str | None


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason a job waits; `holders`: the running jobs it waits behind (HOLDERS_NAMED at
    most; `more`: how many others)."""

    text: str
    holders: tuple[Holder, ...] = ()
    more: int = 0


@dataclass(frozen=True, slots=True)
class ServingProcess:
    """A live process serving the job's queue: its id, how it is named to people (host and
    pid), and the slots it gives the queue."""

    worker_id: str
    name: str
    slots: int


def why_not_running(
    job: JobState,
    *,
    now: datetime,
    queue: QueueStats | None,
    holder: JobState | None,
    served_queues: Collection[str],
    known_tasks: Collection[str],
    partition_running: Sequence[JobState] | None = None,
    running: Sequence[JobState] = (),
    serving: Sequence[ServingProcess] = (),
) -> list[Reason]:
    """Every reason the queued `job` is not running now (empty for a job that is not
    queued: it runs, or it has ended). `queue`: its queue's statistics (None: the queue holds
    nothing else and nobody serves it); `holder`: the running job of its lock_key, if any;
    `served_queues`, `known_tasks`: what the live processes serve and know;
    `partition_running`: the running jobs of its partition_key in its queue (None: unknown);
    `running`: its queue's running jobs; `serving`: the live processes serving its queue."""
    if job.status is not JobStatus.QUEUED:
        return []
    names = {process.worker_id: process.name for process in serving}
    reasons = []
    if job.available_at > now:
        reasons.append(Reason(f"it is delayed until {stamp(job.available_at)}"))
    if queue is not None and queue.paused:
        by = f" by {queue.paused_by}" if queue.paused_by else ""
        since = f" since {stamp(queue.paused_at)}" if queue.paused_at else ""
        reasons.append(Reason(f"its queue {job.queue!r} is paused{by}{since}"))
    limit = None if queue is None else queue.limits.max_running
    if queue is not None and limit is not None and queue.running >= limit:
        reasons.append(
            held_by(
                f"its queue runs {queue.running} job(s), its limit (max_running {limit})",
                running,
                names,
                queue.running,
            )
        )
    per_partition = None if queue is None else queue.limits.max_running_per_partition
    if (
        per_partition is not None
        and partition_running is not None
        and len(partition_running) >= per_partition
    ):
        reasons.append(
            held_by(
                f"its partition runs {len(partition_running)} job(s), its queue's limit"
                f" (max_running_per_partition {per_partition})",
                partition_running,
                names,
            )
        )
    busy = busy_slots(running, serving)
    if busy is not None:
        in_slots, slots = busy
        reasons.append(
            held_by(
                f"every slot serving its queue is busy: {len(in_slots)} of its jobs run in"
                f" the {slots} slot(s) of {len(serving)} live process(es)",
                in_slots,
                names,
            )
        )
    if holder is not None and holder.job_id != job.job_id:
        reasons.append(
            held_by(
                f"its lock_key {job.lock_key!r} is held by job {holder.job_id}", [holder], names
            )
        )
    if job.queue not in served_queues:
        reasons.append(Reason(f"no live process serves its queue {job.queue!r}"))
    elif job.task not in known_tasks:
        reasons.append(Reason(f"no live process knows its task {job.task!r}"))
    if not reasons:
        reasons.append(
            Reason("nothing holds it back: a worker should claim it within a poll interval")
        )
    return reasons


def busy_slots(
    running: Sequence[JobState], serving: Sequence[ServingProcess]
) -> tuple[list[JobState], int] | None:
    """The queue's running jobs that fill the slots live processes give it, and those slots'
    number, when they are all busy (None: a slot is free, or nobody serves the queue). Jobs
    of a process that is not live hold no slot (the reaper takes them back); slots a process
    shares among several queues count the jobs of this queue only."""
    slots = sum(process.slots for process in serving)
    live = {process.worker_id for process in serving}
    in_slots = [job for job in running if job.worker_id in live]
    if slots <= 0 or len(in_slots) < slots:
        return None
    return in_slots, slots


def held_by(
    text: str,
    jobs: Sequence[JobState],
    names: Mapping[str, str],
    count: int | None = None,
) -> Reason:
    """The reason `text`, held by the running `jobs` (`count` of them in all, when more are
    known than read), each named with the process that runs it."""
    shown = tuple(
        Holder(str(job.job_id), names.get(job.worker_id or "", job.worker_id))
        for job in jobs[:HOLDERS_NAMED]
    )
    total = len(jobs) if count is None else max(count, len(jobs))
    return Reason(text, shown, total - len(shown))
