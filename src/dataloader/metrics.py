"""Prometheus metrics of this process (`GET /metrics`), in prometheus_client's default registry.

The workers' metrics keep the names a queue system generated from contracts gives them, with
the queue's name as the `queue` label:

    queue_job_processor_cycle_duration_seconds{queue}  a slot's cycle: claim, run, settle
    queue_tasks_in_progress{queue}                     jobs this process runs now
    queue_running_workers                              worker managers running in this process
    queue_running_job_processors                       slots (job processors) running
    queue_handler_{processed,errors,retried}_total{queue,task}   batch handlers' settlements
    queue_handler_duration_seconds{queue,task}         one call of a batch handler

Several worker managers in one process (tests, an embedding program) add up: the gauges move
by what each one starts and stops.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

from dataloader.workers.batches import HandlerStats

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


def observe_batch(queue: str, task: str, stats: HandlerStats) -> None:
    """Count what one call of a batch handler did."""
    HANDLER_PROCESSED.labels(queue, task).inc(stats.processed)
    HANDLER_ERRORS.labels(queue, task).inc(stats.errors)
    HANDLER_RETRIED.labels(queue, task).inc(stats.retried)
    HANDLER_DURATION.labels(queue, task).observe(stats.duration_sec)


def exposition() -> tuple[bytes, str]:
    """The registry's text exposition and its content type."""
    return generate_latest(), CONTENT_TYPE_LATEST
