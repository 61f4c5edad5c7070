"""Why a job is not running, decided from facts alone."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from dataloader.base import JobStatus
from dataloader.core.models import JobState, QueueStats
from dataloader.core.queues import QueueLimits
from dataloader.core.waiting import why_not_running

NOW = datetime(2026, 11, 26, 12, tzinfo=UTC)


def job(**changes: object) -> JobState:
    base = JobState(
        job_id=uuid.uuid4(), status=JobStatus.QUEUED, attempt=0, started_at=None,
        finished_at=None, heartbeat_at=None, error=None, progress={}, queue="q", task="t",
        max_attempts=3, cancel_requested=False, created_at=NOW, available_at=NOW,
        lock_key="k", idempotency_key=None, priority=100, result=None, duration_ms=None,
        worker_id=None, checkpoint=None, rerun_requested=False,
    )  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def queue(**changes: object) -> QueueStats:
    base = QueueStats("q", 1, 0, 0, 0, 0, 0, 0.0)
    return replace(base, **changes)  # type: ignore[arg-type]


def reasons(j: JobState, **facts: object) -> list[str]:
    given: dict[str, object] = {
        "now": NOW,
        "queue": queue(),
        "holder": None,
        "served_queues": {"q"},
        "known_tasks": {"t"},
    } | facts
    return [r.text for r in why_not_running(j, **given)]  # type: ignore[arg-type]


def test_a_job_that_runs_or_ended_waits_for_nothing() -> None:
    for status in (JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED):
        assert reasons(job(status=status), queue=queue(paused=True)) == []


def test_a_queued_job_with_nothing_in_its_way_says_so() -> None:
    assert reasons(job()) == [
        "nothing holds it back: a worker should claim it within a poll interval"
    ]


def test_each_fact_that_holds_a_job_back_is_a_reason() -> None:
    holder = job(status=JobStatus.RUNNING)
    later = NOW + timedelta(hours=1)
    found = why_not_running(
        job(available_at=later),
        now=NOW,
        queue=queue(
            paused=True,
            paused_by="token:ops",
            running=5,
            limits=QueueLimits(max_running=5, max_running_per_partition=2),
        ),
        holder=holder,
        served_queues=set(),
        known_tasks=set(),
        partition_running=2,
    )
    assert [r.text for r in found] == [
        f"it is delayed until {later.isoformat()}",
        "its queue 'q' is paused by token:ops",
        "its queue runs 5 job(s), its limit (max_running 5)",
        "its partition runs 2 job(s), its queue's limit (max_running_per_partition 2)",
        f"its lock_key 'k' is held by job {holder.job_id}",
        "no live process serves its queue 'q'",
    ]
    assert found[4].job_id == str(holder.job_id)


def test_a_served_queue_whose_task_nobody_knows() -> None:
    assert reasons(job(), known_tasks={"other"}) == ["no live process knows its task 't'"]


def test_limits_not_reached_hold_nothing_back() -> None:
    limited = queue(running=4, limits=QueueLimits(max_running=5, max_running_per_partition=2))
    assert reasons(job(), queue=limited, partition_running=1) == [
        "nothing holds it back: a worker should claim it within a poll interval"
    ]
