"""Why a job is not running: the answer to an operator's daily question, decided from facts
read elsewhere (the job, its queue, the job holding its lock_key, the live processes), without
I/O, so that every face that asks gets the same reasons in the same words."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from dataloader.base import JobStatus
from dataloader.core.models import JobState, QueueStats


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason a job waits; `job_id`: the job it waits behind, if any (to link to)."""

    text: str
    job_id: str | None = None


def why_not_running(
    job: JobState,
    *,
    now: datetime,
    queue: QueueStats | None,
    holder: JobState | None,
    served_queues: Collection[str],
    known_tasks: Collection[str],
    partition_running: int | None = None,
) -> list[Reason]:
    """Every reason the queued `job` is not running now (empty for a job that is not
    queued: it runs, or it has ended). `queue`: its queue's statistics (None: the queue holds
    nothing else and nobody serves it); `holder`: the running job of its lock_key, if any;
    `served_queues`, `known_tasks`: what the live processes serve and know;
    `partition_running`: the running jobs of its partition_key in its queue (None: unknown)."""
    if job.status is not JobStatus.QUEUED:
        return []
    reasons = []
    if job.available_at > now:
        reasons.append(Reason(f"it is delayed until {job.available_at.isoformat()}"))
    if queue is not None and queue.paused:
        by = f" by {queue.paused_by}" if queue.paused_by else ""
        reasons.append(Reason(f"its queue {job.queue!r} is paused{by}"))
    limit = None if queue is None else queue.limits.max_running
    if queue is not None and limit is not None and queue.running >= limit:
        reasons.append(
            Reason(f"its queue runs {queue.running} job(s), its limit (max_running {limit})")
        )
    per_partition = None if queue is None else queue.limits.max_running_per_partition
    if (
        per_partition is not None
        and partition_running is not None
        and partition_running >= per_partition
    ):
        reasons.append(
            Reason(
                f"its partition runs {partition_running} job(s), its queue's limit"
                f" (max_running_per_partition {per_partition})"
            )
        )
    if holder is not None and holder.job_id != job.job_id:
        reasons.append(
            Reason(
                f"its lock_key {job.lock_key!r} is held by job {holder.job_id}", str(holder.job_id)
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
