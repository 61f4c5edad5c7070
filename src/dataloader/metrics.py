"""Prometheus metrics of this process (`GET /metrics`), in prometheus_client's default registry.

The workers' metrics keep the names a queue system generated from contracts gives them, with
the queue's name as the `queue` label:

    queue_job_processor_cycle_duration_seconds{queue}  a slot's cycle: claim, run, settle
    queue_tasks_in_progress{queue}                     jobs this process runs now
    queue_running_workers                              worker managers running in this process
    queue_running_job_processors                       slots (job processors) running
    queue_handler_{processed,errors,retried}_total{queue,task}   batch handlers' settlements
    queue_handler_duration_seconds{queue,task}         one call of a batch handler

The jobs' own metrics, per queue and task:

    dataloader_jobs_enqueued_total{queue,task}          jobs this process enqueued (created)
    dataloader_jobs_started_total{queue,task}           attempts this process's workers started
    dataloader_jobs_claimed_ahead_total{queue}          jobs claimed ahead of free slots
    dataloader_jobs_ended_total{queue,task,outcome}     attempts ended: succeeded, failed,
                                                        retried, canceled, lost
    dataloader_job_wait_seconds{queue}                  from due (enqueued, or retry time) to start
    dataloader_job_duration_seconds{queue,task}         one attempt's run
    dataloader_claim_duration_seconds{queue}            one claim round (its statements)
    dataloader_maintenance_duration_seconds{task}       one run of the reaper, pruner or cron
    dataloader_queue_ready_jobs{queue}                  ready jobs (refreshed at each scrape)
    dataloader_queue_oldest_ready_age_seconds{queue}    age of the longest-waiting due job (idem)
    dataloader_listener_up                              1 while LISTEN is connected

Durable processes (`dataloader.core.processes`) keep the names of the histograms progressor
publishes, in milliseconds, by `namespace`; each times a stage of ours (docs/processes.md):

    progressor_calls_scanning_duration_ms       the claim round that took a call or repair
    progressor_timers_scanning_duration_ms      the claim round that took a timeout or remove
    progressor_zombie_collection_duration_ms    the write that puts a zombie's process in error
    progressor_request_preparing_duration_ms    a caller's submit (checks, process row, its job)
    progressor_task_processing_duration_ms      the processor's call (all its attempts)
    progressor_task_completion_duration_ms      the save: process, events, timer, the task's end
    progressor_process_removing_duration_ms     the save of a removal
    progressor_notification_duration_ms         from the save's commit to the caller's wake-up
    dataloader_processes{namespace,status}      live processes, read at the scrape

Several worker managers in one process (tests, an embedding program) add up: the gauges move
by what each one starts and stops.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

from dataloader.core.handler_stats import HandlerStats
from dataloader.core.queues import THROUGHPUT_KINDS

if TYPE_CHECKING:
    from dataloader.core.models import QueueStats

M = TypeVar("M", Counter, Gauge, Histogram)


@functools.cache
def of(metric: M, *values: str) -> M:
    """`metric.labels(*values)`, kept: a job's start and end ask for the same few children
    of a handful of metrics, and prometheus-client checks and looks up the labels anew at each
    call (a sixth of the worker's Python time per job). For metrics whose children are never
    removed (the gauges refreshed at a scrape are cleared: not these)."""
    return metric.labels(*values)


#: A cycle is meant to end within 10 s, so that a stop never waits long for one: the buckets
#: resolve the seconds around that mark.
CYCLE_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

CYCLE_DURATION: Final = Histogram(
    "queue_job_processor_cycle_duration_seconds",
    "One cycle of a slot: the claim that took its jobs, their run, their settlement.",
    ["queue"],
    buckets=CYCLE_BUCKETS,
)
TASKS_IN_PROGRESS: Final = Gauge(
    "queue_tasks_in_progress", "Jobs of the queue this process runs now.", ["queue"]
)
RUNNING_WORKERS: Final = Gauge("queue_running_workers", "Worker managers running in this process.")
RUNNING_PROCESSORS: Final = Gauge(
    "queue_running_job_processors", "Slots (job processors) running in this process."
)
HANDLER_PROCESSED: Final = Counter(
    "queue_handler_processed", "Jobs a batch handler settled done.", ["queue", "task"]
)
HANDLER_ERRORS: Final = Counter(
    "queue_handler_errors",
    "Jobs of a batch handler that did not succeed (retried, failed or left unsettled).",
    ["queue", "task"],
)
HANDLER_RETRIED: Final = Counter(
    "queue_handler_retried", "Jobs of a batch handler sent to another attempt.", ["queue", "task"]
)
HANDLER_DURATION: Final = Histogram(
    "queue_handler_duration_seconds",
    "One call of a batch handler.",
    ["queue", "task"],
    buckets=CYCLE_BUCKETS,
)


#: Jobs wait from milliseconds (a hot queue) to hours (a backlog).
WAIT_BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300, 1800, 3600, 21600)
#: Attempts run from milliseconds to hours (long ETL loads).
RUN_BUCKETS: Final = (0.005, 0.025, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 14400, 43200)
#: Statements: a claim or a maintenance pass takes milliseconds, unless something is wrong.
STATEMENT_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30)

JOBS_ENQUEUED: Final = Counter(
    "dataloader_jobs_enqueued", "Jobs this process enqueued (created).", ["queue", "task"]
)
JOBS_STARTED: Final = Counter(
    "dataloader_jobs_started", "Attempts this process's workers started.", ["queue", "task"]
)
JOBS_CLAIMED_AHEAD: Final = Counter(
    "dataloader_jobs_claimed_ahead",
    "Jobs claimed ahead of this process's free slots (started as slots freed).",
    ["queue"],
)
JOBS_ENDED: Final = Counter(
    "dataloader_jobs_ended",
    "Attempts ended, by outcome: succeeded, failed, retried, canceled (a queued job's cancel"
    " included), lost.",
    ["queue", "task", "outcome"],
)
JOB_WAIT: Final = Histogram(
    "dataloader_job_wait_seconds",
    "From the moment a job was due (enqueued, or its retry time) to its start.",
    ["queue"],
    buckets=WAIT_BUCKETS,
)
JOB_DURATION: Final = Histogram(
    "dataloader_job_duration_seconds",
    "One attempt's run, from its start to its end.",
    ["queue", "task"],
    buckets=RUN_BUCKETS,
)
CLAIM_DURATION: Final = Histogram(
    "dataloader_claim_duration_seconds",
    "One claim round of a queue (putting back due jobs, claiming, parking).",
    ["queue"],
    buckets=STATEMENT_BUCKETS,
)
MAINTENANCE_DURATION: Final = Histogram(
    "dataloader_maintenance_duration_seconds",
    "One run of a maintenance task (reaper, pruner, cron) by the process that leads.",
    ["task"],
    buckets=STATEMENT_BUCKETS,
)
QUEUE_READY: Final = Gauge(
    "dataloader_queue_ready_jobs", "Ready jobs of the queue, read at the scrape.", ["queue"]
)
QUEUE_OLDEST_AGE: Final = Gauge(
    "dataloader_queue_oldest_ready_age_seconds",
    "Seconds since the queue's longest-waiting due job became due (0: none), read at the scrape.",
    ["queue"],
)
#: Stages of a process's task, in milliseconds: a statement takes a few, a processor's call
#: anything up to its step timeout.
PROCESS_BUCKETS_MS: Final = (0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 5000, 30000, 300000)
#: Each stage's histogram: progressor's name and help text.
PROCESS_STAGES: Final = {
    "calls_scanning": "Calls (call, repair) scanning durations in millisecond",
    "timers_scanning": "Timers (timeout, remove) scanning durations in millisecond",
    "zombie_collection": "Zombie tasks collecting durations in millisecond",
    "request_preparing": "Preparing request (init, call, repair) durations in millisecond",
    "task_processing": "Task processing durations in millisecond",
    "task_completion": "Task completion durations in millisecond",
    "process_removing": "Process removing durations in millisecond",
    "notification": "Notification durations in millisecond",
}
PROCESS_DURATIONS: Final = {
    stage: Histogram(
        f"progressor_{stage}_duration_ms", help_text, ["namespace"], buckets=PROCESS_BUCKETS_MS
    )
    for stage, help_text in PROCESS_STAGES.items()
}
PROCESSES: Final = Gauge(
    "dataloader_processes",
    "Live durable processes by namespace and status, read at the scrape.",
    ["namespace", "status"],
)
LISTENER_UP: Final = Gauge(
    "dataloader_listener_up", "1 while this process's LISTEN connection is up, else 0."
)


def count_ended(queue: str, task: str, journal: str) -> None:
    """Count a job that ended, or an attempt that did, with journal entry `journal` (other
    kinds: not counted): by a worker, the reaper, or a client (a queued job canceled)."""
    outcome = THROUGHPUT_KINDS.get(journal)
    if outcome is not None:
        of(JOBS_ENDED, queue, task, outcome).inc()


def set_queue_gauges(stats: Iterable[QueueStats]) -> None:
    """The queue gauges as `stats` (read at a scrape) has them; queues gone are dropped."""
    QUEUE_READY.clear()
    QUEUE_OLDEST_AGE.clear()
    for queue in stats:
        QUEUE_READY.labels(queue.queue).set(queue.ready)
        QUEUE_OLDEST_AGE.labels(queue.queue).set(queue.oldest_ready_age_sec or 0)


def observe_batch(queue: str, task: str, stats: HandlerStats) -> None:
    """Count what one call of a batch handler did."""
    HANDLER_PROCESSED.labels(queue, task).inc(stats.processed)
    HANDLER_ERRORS.labels(queue, task).inc(stats.errors)
    HANDLER_RETRIED.labels(queue, task).inc(stats.retried)
    HANDLER_DURATION.labels(queue, task).observe(stats.duration_sec)


def observe_process_stage(stage: str, namespace: str, seconds: float) -> None:
    """Time one stage of a process's task (a key of PROCESS_STAGES), in milliseconds."""
    PROCESS_DURATIONS[stage].labels(namespace).observe(seconds * 1000)


def set_process_gauges(counts: dict[tuple[str, str], int]) -> None:
    """The process gauges as `counts` ((namespace, status) → live processes) has them."""
    PROCESSES.clear()
    for (namespace, status), n in counts.items():
        PROCESSES.labels(namespace, status).set(n)


def exposition() -> tuple[bytes, str]:
    """The registry's text exposition and its content type."""
    return generate_latest(), CONTENT_TYPE_LATEST
