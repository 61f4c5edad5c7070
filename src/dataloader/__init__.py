"""dataloader: a PostgreSQL-only job queue and job runner for asyncio.

    import dataloader

    @dataloader.task("etl.load_day", queue="etl", retry=dataloader.Exponential(base=5))
    async def load_day(ctx: dataloader.JobContext[dict]) -> dict:
        ...
        return {"rows": 1234}                    # the job's result

    async with dataloader.Client.connect(dsn) as client:
        job = await client.enqueue("etl.load_day", {"day": "2026-01-01"}, lock_key="day:1")
        state = await client.wait(job.job_id)

Run the workers with `dataloader worker` (or the service, `dataloader serve`), or inside your
own program with `dataloader.Runner`. docs/reference.md lists the public API.
"""

from dataloader.base import JobStatus
from dataloader.client import Client
from dataloader.config import Settings, WorkerSpec
from dataloader.core.handler_stats import HandlerStats
from dataloader.core.models import EnqueueResult, JobEvent, JobState, NewJob, QueueStats, Stage
from dataloader.core.processes import (
    Event,
    NewEvent,
    Process,
    ProcessResult,
    ProcessStatus,
    ProcessTask,
    Remove,
    SetTimer,
    TaskKind,
    Timer,
    UnsetTimer,
)
from dataloader.core.queues import QueueEvent, QueueLimits, QueueSettings, Throughput
from dataloader.core.retry import Exponential, Fixed, Linear, RetryPolicy
from dataloader.exceptions import (
    ConfigError,
    DatabaseUnavailable,
    DataloaderError,
    IdempotencyConflict,
    InvalidJob,
    InvalidJobArgs,
    JobCanceled,
    JobLost,
    JobNotFound,
    NonRetryableError,
    NotRetryable,
    ProcessConflict,
    ProcessNotFound,
    ProcessTaskFailed,
    ProcessTimeout,
    Retry,
    TaskTimeout,
)
from dataloader.runner import Runner
from dataloader.storage.repositories import JobPage
from dataloader.tasks import Task, TaskRegistry, process, registry, task
from dataloader.workers.batches import Batch, BatchItem
from dataloader.workers.job_context import JobContext
from dataloader.workers.pipelines.registry import PipelineRegistry, pipeline
from dataloader.workers.threaded import ThreadContext

__all__ = [
    "Batch",
    "BatchItem",
    "Client",
    "ConfigError",
    "DatabaseUnavailable",
    "DataloaderError",
    "EnqueueResult",
    "Event",
    "Exponential",
    "Fixed",
    "HandlerStats",
    "IdempotencyConflict",
    "InvalidJob",
    "InvalidJobArgs",
    "JobCanceled",
    "JobContext",
    "JobEvent",
    "JobLost",
    "JobNotFound",
    "JobPage",
    "JobState",
    "JobStatus",
    "Linear",
    "NewEvent",
    "NewJob",
    "NonRetryableError",
    "NotRetryable",
    "PipelineRegistry",
    "Process",
    "ProcessConflict",
    "ProcessNotFound",
    "ProcessResult",
    "ProcessStatus",
    "ProcessTask",
    "ProcessTaskFailed",
    "ProcessTimeout",
    "QueueEvent",
    "QueueLimits",
    "QueueSettings",
    "QueueStats",
    "Remove",
    "Retry",
    "RetryPolicy",
    "Runner",
    "SetTimer",
    "Settings",
    "Stage",
    "Task",
    "TaskKind",
    "TaskRegistry",
    "TaskTimeout",
    "ThreadContext",
    "Throughput",
    "Timer",
    "UnsetTimer",
    "WorkerSpec",
    "pipeline",
    "process",
    "registry",
    "task",
]
