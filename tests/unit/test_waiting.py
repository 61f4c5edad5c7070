"""Why a job is not running, decided from facts alone."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from dataloader.base import JobStatus
from dataloader.core.models import JobState, QueueStats
from dataloader.core.queues import QueueLimits
from dataloader.core.waiting import HOLDERS_NAMED, Holder, ServingProcess, why_not_running

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
    holder = job(status=JobStatus.RUNNING, worker_id="w1")
    later = NOW + timedelta(hours=1, microseconds=123)
    found = why_not_running(
        job(available_at=later),
        now=NOW,
        queue=queue(
            paused=True,
            paused_by="token:ops",
            paused_at=NOW,
            running=5,
            limits=QueueLimits(max_running=5, max_running_per_partition=2),
        ),
        holder=holder,
        served_queues=set(),
        known_tasks=set(),
        partition_running=[holder, holder],
    )
    assert [r.text for r in found] == [
        "it is delayed until 2026-11-26 13:00:00 UTC",
        "its queue 'q' is paused by token:ops since 2026-11-26 12:00:00 UTC",
        "its queue runs 5 job(s), its limit (max_running 5)",
        "its partition runs 2 job(s), its queue's limit (max_running_per_partition 2)",
        f"its lock_key 'k' is held by job {holder.job_id}",
        "no live process serves its queue 'q'",
    ]
    assert found[4].holders == (Holder(str(holder.job_id), "w1"),)


def running_on(*workers: str) -> list[JobState]:
    return [job(status=JobStatus.RUNNING, worker_id=w) for w in workers]


SERVING = [ServingProcess("w1", "host-a pid 10", 2), ServingProcess("w2", "host-b pid 20", 1)]


def test_busy_slots_are_a_reason_naming_their_jobs_and_processes() -> None:
    held = running_on("w1", "w2", "w1")
    [busy] = why_not_running(
        job(),
        now=NOW,
        queue=queue(running=3),
        holder=None,
        served_queues={"q"},
        known_tasks={"t"},
        running=held,
        serving=SERVING,
    )
    assert busy.text == (
        "every slot serving its queue is busy: 3 of its jobs run in the 3 slot(s)"
        " of 2 live process(es)"
    )
    assert busy.holders == tuple(
        Holder(str(j.job_id), name)
        for j, name in zip(held, ["host-a pid 10", "host-b pid 20", "host-a pid 10"], strict=True)
    )
    assert busy.more == 0


def test_a_free_slot_or_jobs_of_a_gone_process_hold_nothing_back() -> None:
    facts = {"now": NOW, "queue": queue(running=3), "holder": None, "serving": SERVING}
    nothing = ["nothing holds it back: a worker should claim it within a poll interval"]
    assert reasons(job(), running=running_on("w1", "w2"), **facts) == nothing
    assert reasons(job(), running=running_on("w1", "w2", "gone"), **facts) == nothing
    assert reasons(
        job(), running=running_on("w1"), queue=queue(running=1), serving=[], served_queues=set()
    ) == ["no live process serves its queue 'q'"]


def test_busy_slots_are_said_beside_a_pause_a_limit_and_a_lock_key() -> None:
    held = running_on("w1", "w1", "w2")
    lock_holder = held[0]
    found = reasons(
        job(),
        queue=queue(running=3, paused=True, limits=QueueLimits(max_running=3)),
        holder=lock_holder,
        running=held,
        serving=SERVING,
    )
    assert found == [
        "its queue 'q' is paused",
        "its queue runs 3 job(s), its limit (max_running 3)",
        "every slot serving its queue is busy: 3 of its jobs run in the 3 slot(s)"
        " of 2 live process(es)",
        f"its lock_key 'k' is held by job {lock_holder.job_id}",
    ]


def test_a_limit_names_the_running_jobs_that_reach_it_and_counts_the_rest() -> None:
    held = running_on(*["w1"] * (HOLDERS_NAMED + 2))
    [limit] = why_not_running(
        job(),
        now=NOW,
        queue=queue(running=40, limits=QueueLimits(max_running=40)),
        holder=None,
        served_queues={"q"},
        known_tasks={"t"},
        running=held,
        serving=[ServingProcess("w1", "host-a pid 10", 100)],
    )
    assert [h.job_id for h in limit.holders] == [str(j.job_id) for j in held[:HOLDERS_NAMED]]
    assert {h.process for h in limit.holders} == {"host-a pid 10"}
    assert limit.more == 40 - HOLDERS_NAMED


def test_a_served_queue_whose_task_nobody_knows() -> None:
    assert reasons(job(), known_tasks={"other"}) == ["no live process knows its task 't'"]


def test_limits_not_reached_hold_nothing_back() -> None:
    limited = queue(running=4, limits=QueueLimits(max_running=5, max_running_per_partition=2))
    assert reasons(job(), queue=limited, partition_running=running_on("w1")) == [
        "nothing holds it back: a worker should claim it within a poll interval"
    ]
