"""Run dataloader inside your own asyncio program (the service's lifespan uses it too).

async with Runner(Settings(db_dsn=dsn, workers=[WorkerSpec(queue="etl", concurrency=4)])) as dl:
    await dl.repo.enqueue(NewJob(queue="etl", task="etl.load", lock_key="day:1", args={}))
    await dl.run_until_empty()      # drain mode: return once no ready job is left
"""

from __future__ import annotations

from types import TracebackType

from dataloader.config import Settings
from dataloader.context import AppContext
from dataloader.storage.repositories import JobRepository
from dataloader.workers.manager import WorkerManager
from dataloader.workers.pipelines.registry import PipelineRegistry
from dataloader.workers.pipelines.registry import registry as default_registry


class Runner:
    """Opens the AppContext and, unless `run_workers` is False, runs the WorkerManager."""

    def __init__(
        self,
        settings: Settings,
        registry: PipelineRegistry | None = None,
        *,
        run_workers: bool = True,
    ) -> None:
        self.settings = settings
        self.registry = registry if registry is not None else default_registry
        self._run_workers = run_workers
        self._context: AppContext | None = None
        self._manager: WorkerManager | None = None

    @property
    def context(self) -> AppContext:
        """Pool, engine/sessionmaker and repository (open between enter and exit)."""
        if self._context is None:
            raise RuntimeError("the Runner is not started")
        return self._context

    @property
    def repo(self) -> JobRepository:
        """Enqueue, read and cancel jobs."""
        return self.context.repo

    @property
    def manager(self) -> WorkerManager | None:
        """The workers, or None when only the context runs."""
        return self._manager

    async def start(self) -> None:
        """Connect (migrating when configured) and start the workers."""
        self._context = await AppContext.open(self.settings)
        if self._run_workers:
            self._manager = WorkerManager(self._context, self.registry)
            try:
                await self._manager.start()
            except BaseException:
                await self._context.close()
                raise

    async def stop(self) -> None:
        """Stop the workers gracefully (see `WorkerManager.stop`) and close connections."""
        try:
            if self._manager is not None:
                await self._manager.stop(self.settings.shutdown_timeout_sec)
        finally:
            if self._context is not None:
                await self._context.close()

    def hurry(self) -> None:
        """Cut the grace period of a stop in progress (or to come) short: unfinished jobs are
        handed back at once. Safe to call from a signal handler."""
        if self._manager is not None:
            self._manager.hurry()

    async def run_until_empty(self) -> None:
        """Return once every served queue has no ready job and nothing running."""
        if self._manager is None:
            raise RuntimeError("run_until_empty needs the workers (run_workers=True)")
        await self._manager.wait_idle()

    async def __aenter__(self) -> Runner:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()
