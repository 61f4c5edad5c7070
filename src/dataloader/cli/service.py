"""The service's commands: `serve` (the HTTP API, the workers and maintenance; the default
when no command is given), `worker` (the workers without the HTTP API) and `migrate`.

Start-up problems (bad settings, unreachable database, unknown pipeline module) end the process
with one line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

import typer
import uvicorn

from dataloader.cli.common import fail, import_pipelines, inspected, load
from dataloader.clusters import check_clusters
from dataloader.config import Settings
from dataloader.context import (
    check_database,
    check_target,
    resolve_dsn,
    resolve_routes,
    run_migrations,
)
from dataloader.contract import ContractError
from dataloader.exceptions import ConfigError, DataloaderError
from dataloader.logger import configure_logging
from dataloader.logger.utils import mask_dsn
from dataloader.logger.uvicorn_logging_config import build_uvicorn_log_config
from dataloader.maintenance.cron import configured_schedules
from dataloader.storage.migrate import MigrationReport
from dataloader.storage.pooling import Pooling
from dataloader.tasks import registry as default_registry
from dataloader.workers.destinations import check_at_start

if TYPE_CHECKING:
    from fastapi import FastAPI

    from dataloader.runner import Runner
    from dataloader.workers.manager import WorkerManager

#: The start-up lines keep the name they have always had (the README shows one).
log = logging.getLogger("dataloader.cli")


def _stopped_by_signal(signum: int, frame: FrameType | None) -> NoReturn:
    """uvicorn re-raises the signal that stopped it once its graceful shutdown is complete;
    with the default handlers SIGTERM would then kill the process (exit code -15) and SIGINT
    end in click's "Aborted!" (exit code 1). A gracefully stopped service exits 0."""
    raise SystemExit(0)


class _Server(uvicorn.Server):
    """uvicorn's server, where a second SIGTERM or SIGINT only cuts the grace period of running
    jobs short: they are handed back at once instead of after DL_SHUTDOWN_TIMEOUT_SEC.

    uvicorn itself answers a second SIGINT with `force_exit`, which skips the application's
    shutdown altogether: the workers would be torn down by the event loop's end, leaving their
    jobs `running` with a live lease. So later signals never reach uvicorn's handler; the
    shutdown always runs (requests in flight still get uvicorn's bounded drain first)."""

    def __init__(self, config: uvicorn.Config, hurry: Callable[[], None]) -> None:
        super().__init__(config)
        self._hurry = hurry

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            super().handle_exit(sig, frame)
            return
        log.warning("second stop signal: handing running jobs back now")
        self._hurry()


def _tune_gc() -> None:
    """Keep the cyclic garbage collector off the request path. The long-lived objects of
    start-up (modules, FastAPI routes, pydantic schemas) are frozen out of its scans, and it
    runs every 20,000 allocations instead of 700: measured with `wrk -c32` on the trigger
    endpoint, p99 64 → 26 ms and 1,970 → 2,330 requests/s (docs/benchmarks.md)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 50)


def _listen(host: str, port: int, reuse_port: bool) -> socket.socket:
    """The API's listening socket, taken before anything else starts: a port in use must stop
    the start before the database is touched or a worker claims a job (uvicorn would bind only
    after the application's start-up, workers included). With `reuse_port`, processes that all
    ask for it share the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server(
            (host, port), family=family, backlog=2048, reuse_port=reuse_port
        )
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        fail(f"cannot listen on {_address(host, port)} (DL_HTTP_HOST, DL_HTTP_PORT): {reason}", 1)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _prepare_database(settings: Settings) -> Settings:
    """Resolve the DSN (start the embedded server if unset), check the database and the
    tasks' database (DL_TARGET_DSN) when set (one line on failure, not a traceback from the
    application's start-up), migrate when configured, and say which servers they are and how
    to reach them (passwords masked)."""
    dsn = await resolve_dsn(settings)
    # first: a transaction pooler without DL_DB_DIRECT_DSN is refused before anything runs
    routes = await resolve_routes(settings, dsn)
    version = await check_database(routes.session_dsn, migrated=not settings.auto_migrate)
    target = None if settings.target_dsn is None else await check_target(settings.target_dsn)
    if settings.auto_migrate:
        await run_migrations(routes.session_dsn)
    # DL_CLUSTERS: every other cluster too; one not answering is migrated when it is joined
    unreached = await check_clusters(settings, default_registry) if settings.clusters else []
    if settings.workers:
        await _check_destinations(dsn, settings)
    embedded = settings.asyncpg_dsn is None
    shown = mask_dsn(dsn)  # the embedded server's DSN has no password: psql takes it as it is
    log.info(
        "PostgreSQL %s (%s) at %s",
        version,
        "embedded" if embedded else "DL_DB_DSN",
        shown,
        extra={"server_version": version, "embedded": embedded, "dsn": shown},
    )
    if routes.pooling is not Pooling.none or routes.split:
        shown_direct = mask_dsn(routes.session_dsn)
        how = (
            "reaches the server straight"
            if routes.pooling is Pooling.none
            else f"goes through a {routes.pooling}-pooling pooler"
        )
        log.info(
            "DL_DB_DSN %s; the locks of lock_keys, LISTEN and migrations connect to %s",
            how,
            shown_direct,
            extra={"pooling": str(routes.pooling), "direct_dsn": shown_direct},
        )
    if settings.target_dsn is not None:
        shown_target = mask_dsn(settings.target_dsn)
        log.info(
            "tasks' database (DL_TARGET_DSN): %s at %s",
            target,
            shown_target,
            extra={"target_database": target, "target_dsn": shown_target},
        )
    if settings.db_read_dsn is not None:
        shown_reads = mask_dsn(settings.db_read_dsn)
        log.info(
            "reads that may be stale (DL_DB_READ_DSN): %s, while at most %gs behind",
            shown_reads,
            settings.db_read_max_lag_sec,
            extra={"read_dsn": shown_reads},
        )
    return settings.model_copy(
        update={"db_dsn": dsn, "auto_migrate": settings.auto_migrate and bool(unreached)}
    )


async def _check_destinations(dsn: str, settings: Settings) -> None:
    """ConfigError for a schedule or stage certainly wrong, as the workers check them at their
    start (`workers.destinations`, which warns of the rest), here so that a mistake is one
    line, not a traceback from the application's start-up."""
    # the client checks the schema first: an unmigrated database is its one line
    async with inspected(settings.model_copy(update={"db_dsn": dsn})) as (client, _):
        await check_at_start(
            configured_schedules(settings.cron, default_registry),
            default_registry,
            client,
            [queue for spec in settings.workers for queue in spec.served],
            allow_unknown=settings.allow_unknown_tasks,
        )


def _hurry_workers(application: FastAPI) -> None:
    clusters = getattr(application.state, "clusters", None)
    if clusters is not None:  # DL_CLUSTERS: every cluster's workers
        clusters.hurry()
        return
    manager: WorkerManager | None = application.state.manager
    if manager is not None:
        manager.hurry()


def serve() -> None:
    """Run the HTTP API, the workers and the reaper in this process."""
    from dataloader.api import create_app  # FastAPI is only needed to serve

    settings = load()
    configure_logging(settings.log_level)
    listening = _listen(settings.http_host, settings.http_port, settings.http_reuse_port)
    try:
        import_pipelines(settings.pipeline_modules)
        # before the database and the port: a schedule the tasks refuse stops the start here
        configured_schedules(settings.cron, default_registry)
        settings = asyncio.run(_prepare_database(settings))
    except ConfigError as exc:
        fail(f"invalid configuration: {exc}", 2)
    except DataloaderError as exc:
        fail(str(exc), 1)
    try:
        application = create_app(settings)
    except ContractError as exc:
        fail(f"invalid configuration: DL_CONTRACT_FILE: {exc}", 2)
    server = _Server(
        uvicorn.Config(
            application,
            host=settings.http_host,
            port=settings.http_port,
            log_config=build_uvicorn_log_config(settings.log_level),
            timeout_graceful_shutdown=5,
            access_log=False,  # RequestContextMiddleware logs each request with its id
            proxy_headers=False,
        ),
        hurry=lambda: _hurry_workers(application),
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stopped_by_signal)
    _tune_gc()
    # uvicorn announces its address only when it binds the socket itself
    log.info("API on http://%s", _address(settings.http_host, settings.http_port))
    server.run(sockets=[listening])
    if not server.started:
        fail("the service failed to start (see the log above)", 1)


def worker(
    drain: bool = typer.Option(
        False,
        "--drain",
        help="Exit (code 0) once no job is ready to run and none is running, instead of"
        " waiting for new ones. Jobs due later (a retry's delay, available_at) are left for"
        " the next run. A stop signal before the queues are empty exits with code 1.",
    ),
) -> None:
    """Run the workers without the HTTP API: claim and run jobs, keep their leases, requeue
    jobs of crashed processes.

    Configured like `serve`: DL_DB_DSN (unset: the embedded PostgreSQL under DL_DATA_DIR),
    WORKERS_JSON (the queues served and their parallel slots), DL_PIPELINE_MODULES (the
    modules that register your tasks), DL_TARGET_DSN (the database tasks get as ctx.engine).
    Jobs are enqueued by other processes: the service's API, a dataloader.Client, SQL.

    Example: DL_DB_DSN=postgresql://etl@db/etl WORKERS_JSON='[{"queue":"etl","concurrency":4}]'
    DL_PIPELINE_MODULES=myproject.tasks dataloader worker

    SIGTERM or Ctrl+C stops it gracefully: no new job is claimed, running jobs get
    DL_SHUTDOWN_TIMEOUT_SEC to finish, the rest are handed back to the queue for another
    worker; a second signal hands them back at once.
    """
    # A worker serves no HTTP: the API's own settings must not stop it (an open
    # DL_HTTP_HOST without tokens is a concern of `serve` only).
    settings = load(allow_unauthenticated=True)
    configure_logging(settings.log_level)
    if not settings.workers:
        fail("invalid configuration: WORKERS_JSON: lists no queue, so there is no work", 2)
    try:
        import_pipelines(settings.pipeline_modules)
        configured_schedules(settings.cron, default_registry)  # before the database, as serve
        drained = asyncio.run(_work(settings, drain))
    except ConfigError as exc:
        fail(f"invalid configuration: {exc}", 2)
    except DataloaderError as exc:
        fail(str(exc), 1)
    if drain and not drained:
        fail("stopped by a signal before the queues were drained", 1)


class _StopSignals:
    """SIGTERM and SIGINT of the `worker` command: the first one asks the workers to stop
    gracefully, a later one cuts the grace period short (running jobs are handed back at
    once, as `serve` does)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.hurried = False
        self.runner: Runner | None = None
        self._loop = asyncio.get_running_loop()

    def __enter__(self) -> _StopSignals:
        for signum in self.SIGNALS:
            self._loop.add_signal_handler(signum, self._received, signum)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum in self.SIGNALS:
            self._loop.remove_signal_handler(signum)

    def _received(self, signum: int) -> None:
        if not self.requested.is_set():
            log.info("%s: stopping the workers", signal.Signals(signum).name)
            self.requested.set()
            return
        log.warning("second stop signal: handing running jobs back now")
        self.hurried = True
        if self.runner is not None:
            self.runner.hurry()


async def _work(settings: Settings, drain: bool) -> bool:
    """The `worker` command: run the workers until a stop signal (or, with `drain`, until the
    queues are drained); True when they were drained."""
    from dataloader.runner import Runner  # the workers are only needed to run them

    with _StopSignals() as stop:
        settings = await _prepare_database(settings)
        if stop.requested.is_set():  # stopped while the database was prepared
            return False
        runner = Runner(settings)
        await runner.start()
        stop.runner = runner
        if stop.hurried:  # a second signal came while the workers started
            runner.hurry()
        try:
            return await _until_stopped(runner, stop, drain)
        finally:
            await runner.stop()


async def _until_stopped(runner: Runner, stop: _StopSignals, drain: bool) -> bool:
    """Wait for a stop signal or, with `drain`, for the queues to be drained, whichever comes
    first; True when they were drained."""
    if not drain:
        await stop.requested.wait()
        return False
    log.info("draining: the workers stop once no job is ready and none is running")
    drained = asyncio.ensure_future(runner.run_until_empty())
    stopped = asyncio.ensure_future(stop.requested.wait())
    await asyncio.wait({drained, stopped}, return_when=asyncio.FIRST_COMPLETED)
    for waiting in (drained, stopped):
        waiting.cancel()
    await asyncio.gather(drained, stopped, return_exceptions=True)
    if drained.cancelled():
        return False
    drained.result()  # a failure of the drain itself is a bug: let it show
    log.info("queues drained")
    return True


def migrate() -> None:
    """Bring the database schema up to date (idempotent, safe to run from several replicas)."""
    settings = load()
    configure_logging(settings.log_level)
    try:
        report = asyncio.run(_migrate(settings))
    except DataloaderError as exc:
        fail(str(exc), 1)
    typer.echo(
        f"schema at version {report.current}"
        f" (applied: {report.applied or 'none'}, adopted: {report.adopted or 'none'})"
    )


async def _migrate(settings: Settings) -> MigrationReport:
    routes = await resolve_routes(settings, await resolve_dsn(settings))
    return await run_migrations(routes.session_dsn)
