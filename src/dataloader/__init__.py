"""dataloader: a PostgreSQL-only job queue and job runner for asyncio.

Library use::

    from dataloader import JobContext, pipeline

    @pipeline("etl.load_day")
    async def load_day(ctx: JobContext[dict]) -> None:
        ...

    # enqueue inside your own transaction (asyncpg connection):
    from dataloader import NewJob, enqueue
    await enqueue(conn, NewJob(queue="etl", task="etl.load_day", lock_key="day:2026-01-01",
                               args={"day": "2026-01-01"}))
"""

from dataloader.base import JobStatus
from dataloader.config import Settings, WorkerSpec
from dataloader.exceptions import (
    ConfigError,
    DataloaderError,
    JobCanceled,
    JobLost,
    NonRetryableError,
)
from dataloader.runner import Runner
from dataloader.storage.repositories import (
    JobRepository,
    JobState,
    NewJob,
    enqueue,
    enqueue_many,
)
from dataloader.workers.job_context import JobContext
from dataloader.workers.pipelines.registry import PipelineRegistry, pipeline, registry

__all__ = [
    "ConfigError",
    "DataloaderError",
    "JobCanceled",
    "JobContext",
    "JobLost",
    "JobRepository",
    "JobState",
    "JobStatus",
    "NewJob",
    "NonRetryableError",
    "PipelineRegistry",
    "Runner",
    "Settings",
    "WorkerSpec",
    "enqueue",
    "enqueue_many",
    "pipeline",
    "registry",
]
