"""Run dataloader inside your own asyncio program (the service's lifespan uses it too).

    async with Runner(Settings(db_dsn=dsn, workers=[WorkerSpec(queue="etl", concurrency=4)])) as dl:
        await dl.client.enqueue("etl.load", {"day": "2026-01-01"}, lock_key="day:1")
        await dl.run_until_empty()      # drain mode: return once no ready job is left

Inside another FastAPI app, sharing its pool (the workers still hold a few connections of
their own: a lock connection, a listener and a small pool for claims and heartbeats):

    @asynccontextmanager
    async def lifespan(app):
        async with asyncpg.create_pool(dsn) as pool, Runner(settings, pool=pool) as dl:
            app.state.jobs = dl.client
            yield

What tasks need beyond the databases comes from a startup hook, given the AppContext: an
`async def` returning the resources, or an async context manager yielding them (exited at
shutdown, once the workers have stopped); tasks read them as `ctx.resources`:

    @asynccontextmanager
    async def resources(app: AppContext):
        async with httpx.AsyncClient() as http:
            yield {"http": http}

    async with Runner(settings, startup=resources) as dl: ...
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from dataloader.client import Client
from dataloader.config import Settings
from dataloader.context import AppContext, StartupHook
from dataloader.exceptions import ConfigError
from dataloader.storage.db import Pool
from dataloader.tasks import TaskRegistry
from dataloader.tasks import registry as default_registry
from dataloader.workers.manager import WorkerManager

if TYPE_CHECKING:
    from dataloader.clusters import ClusterRuntime


class Runner:
    """Opens the AppContext and, unless `run_workers` is False, runs the WorkerManager.

    `pool`: an asyncpg pool of the application to share (its owner closes it; `settings`
    must name the same database in `db_dsn`). `startup`: a hook building what tasks need,
    given the AppContext; it returns the resources (`ctx.resources`), or an async context
    manager giving them and closed at shutdown.
    """

    def __init__(
        self,
        settings: Settings,
        registry: TaskRegistry | None = None,
        *,
        run_workers: bool = True,
        pool: Pool | None = None,
        startup: StartupHook | None = None,
    ) -> None:
        if pool is not None and settings.db_dsn is None:
            raise ConfigError(
                "Runner(pool=…) needs settings.db_dsn (DL_DB_DSN) naming the pool's database:"
                " the workers open connections of their own to it"
            )
        self.settings = settings
        self.registry = registry if registry is not None else default_registry
        self._run_workers = run_workers
        self._pool = pool
        self._startup = startup
        self._context: AppContext | None = None
        self._manager: WorkerManager | None = None
        #: With DL_CLUSTERS: a context and workers per cluster (`dataloader.clusters`).
        self.clusters: ClusterRuntime | None = None

    @property
    def context(self) -> AppContext:
        """Pool, client, engine/sessionmaker and resources (open between enter and exit)."""
        if self._context is None:
            raise RuntimeError("the Runner is not started")
        return self._context

    @property
    def client(self) -> Client:
        """Enqueue, read, cancel, retry and wait for jobs (on every cluster, routed)."""
        return self.context.client

    @property
    def manager(self) -> WorkerManager | None:
        """The workers, or None when only the context runs."""
        return self._manager

    async def start(self) -> None:
        """Connect (migrating when configured), run the startup hook and start the workers.
        If any of it fails, whatever was opened is closed again before the error propagates."""
        if self._context is not None:
            raise RuntimeError("the Runner is already started")
        if self.settings.clusters:
            await self._start_clusters()
            return
        context = await AppContext.open(
            self.settings, self.registry, pool=self._pool, startup=self._startup
        )
        if self._run_workers:
            try:
                manager = WorkerManager(context, self.registry)
                await manager.start()
            except BaseException:
                await context.close()
                raise
            self._manager = manager
        self._context = context

    async def _start_clusters(self) -> None:
        """A context per cluster, the default's as `context`, its workers (or the first
        cluster's) as `manager`."""
        from dataloader.clusters import ClusterRuntime

        clusters = ClusterRuntime(
            self.settings,
            self.registry,
            run_workers=self._run_workers,
            pool=self._pool,
            startup=self._startup,
        )
        await clusters.start()
        self.clusters, self._context = clusters, clusters.contexts["default"]
        self._manager = clusters.managers.get("default") or next(
            iter(clusters.managers.values()), None
        )

    async def stop(self) -> None:
        """Stop the workers gracefully (see `WorkerManager.stop`; `hurry` cuts the grace
        short), then close the context: the startup hook's resources, the client, the engine,
        and the pool unless it was given. Stopping a Runner that is not running does nothing."""
        if self.clusters is not None:
            try:  # `hurry` reaches every cluster's workers until they have stopped
                await self.clusters.stop(self.settings.shutdown_timeout_sec)
            finally:
                self.clusters = self._manager = self._context = None
            return
        try:
            if self._manager is not None:
                await self._manager.stop(self.settings.shutdown_timeout_sec)
        finally:
            try:
                if self._context is not None:
                    await self._context.close()
            finally:
                self._manager = self._context = None

    def hurry(self) -> None:
        """Cut the grace period of a stop in progress (or to come) short: unfinished jobs are
        handed back at once. Safe to call from a signal handler."""
        if self.clusters is not None:
            self.clusters.hurry()
        elif self._manager is not None:
            self._manager.hurry()

    async def run_until_empty(self) -> None:
        """Return once every served queue has nothing it may claim (no ready job, or the
        queue is paused) and nothing running."""
        if self._manager is None:
            raise RuntimeError("run_until_empty needs the workers (run_workers=True)")
        if self.clusters is not None:
            await self.clusters.wait_idle()
            return
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
