"""The FastAPI application: routes, middleware, error handlers, and a lifespan that opens the
AppContext and runs the WorkerManager in the same process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi_offline import FastAPIOffline

from dataloader.api.auth import Authenticator
from dataloader.api.live import LiveTasks
from dataloader.api.middleware import (
    READ_FROM_HEADER,
    REQUEST_ID_HEADER,
    BodyLimitMiddleware,
    ReadFreshnessMiddleware,
    RequestContextMiddleware,
)
from dataloader.api.openapi import install_openapi
from dataloader.api.origins import CrossSiteGuard
from dataloader.api.os_router import package_version
from dataloader.api.os_router import router as os_router
from dataloader.api.v1.exceptions import install_exception_handlers
from dataloader.api.v1.processes import router as processes_router
from dataloader.api.v1.processes import tasks_router as process_tasks_router
from dataloader.api.v1.queues import audit_router as queue_events_router
from dataloader.api.v1.queues import router as queues_router
from dataloader.api.v1.router import router as v1_router
from dataloader.api.v1.service import JobsService
from dataloader.api.v1.tasks import router as tasks_router
from dataloader.config import Settings
from dataloader.contract import ContractGuard, load_contract_file
from dataloader.logger.summary import Summary, request_summary
from dataloader.runner import Runner
from dataloader.storage.connections import GuardedPool
from dataloader.storage.secrets import SecretStore
from dataloader.tasks import TaskRegistry
from dataloader.tasks import registry as default_registry

#: Where the files of the docs pages are served (open, like the pages: they hold no data).
DOCS_ASSETS_URL = "/docs/assets"


def create_app(
    settings: Settings, registry: TaskRegistry | None = None, *, run_workers: bool = True
) -> FastAPI:
    """Build the service. `run_workers=False` serves the API only. ContractError when
    `settings.contract_file` cannot be read."""
    pipelines = registry if registry is not None else default_registry
    live_tasks = LiveTasks()
    requests = request_summary(settings.log_summary_sec)
    contract = (
        None
        if settings.contract_file is None
        else ContractGuard(load_contract_file(settings.contract_file))
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with (
            Runner(settings, pipelines, run_workers=run_workers) as runner,
            _running(requests),
        ):
            app.state.app_context = runner.context
            live_tasks.store = runner.client
            app.state.jobs_service = JobsService(runner.client, settings, live_tasks, contract)
            app.state.manager = runner.manager
            app.state.clusters = runner.clusters
            app.state.client = runner.client
            app.state.session_secret = await _session_secret(settings, runner)
            yield

    # /docs and /redoc load Swagger UI and ReDoc from files installed with the service, so
    # they work where the service runs without internet
    app = FastAPIOffline(
        title="dataloader",
        version=package_version(),
        description="PostgreSQL job queue: trigger, watch and cancel long-running jobs.",
        lifespan=lifespan,
        static_url=DOCS_ASSETS_URL,
    )
    app.state.manager = None
    app.state.request_summary = requests
    app.state.authenticator = Authenticator(settings.api_tokens)
    if settings.db_read_dsn is not None:
        # only a standby serves reads that may be stale: without one, no answer says where
        # it read (and no request pays for watching)
        app.add_middleware(ReadFreshnessMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.http_max_body_bytes)
    if settings.http_allowed_origins:
        # the front-ends allowed to change things may read the answers too
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.http_allowed_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=[REQUEST_ID_HEADER, READ_FROM_HEADER],
        )
    app.add_middleware(CrossSiteGuard, allowed_origins=settings.http_allowed_origins)
    app.add_middleware(
        RequestContextMiddleware, summary=requests, log_every_request=settings.access_log
    )
    install_exception_handlers(app)
    install_openapi(app, secured=bool(settings.api_tokens), registry=pipelines)
    app.include_router(os_router)
    app.include_router(v1_router)
    app.include_router(queues_router)
    app.include_router(queue_events_router)
    app.include_router(tasks_router)
    app.include_router(processes_router)
    app.include_router(process_tasks_router)
    # imported here: the dashboard signs in with the API's tokens (`api.auth`), and importing
    # it at the top would import this package from itself
    from dataloader.dashboard import install_dashboard

    install_dashboard(
        app, lambda: app.state.client, app.state.authenticator, lambda: app.state.session_secret
    )
    return app


#: The name in `dl_secrets` of the secret the dashboard's sessions are signed with.
SESSION_SECRET_NAME = "dashboard-sessions"


async def _session_secret(settings: Settings, runner: Runner) -> bytes:
    """The secret of the dashboard's sessions: DL_SESSION_SECRET, or the deployment's own,
    made by the first process that asked and kept in the database (every replica, and every
    restart, signs alike)."""
    if settings.session_secret is not None:
        return settings.session_secret.get_secret_value().strip().encode()
    store = SecretStore(GuardedPool(runner.context.pool, settings.db_timeout_sec))
    return await store.shared(SESSION_SECRET_NAME)


@asynccontextmanager
async def _running(summary: Summary) -> AsyncIterator[None]:
    """Log `summary` every period while the application runs, and once more at its end."""
    stop = asyncio.Event()
    task = asyncio.create_task(summary.run(stop), name="dataloader-request-summary")
    try:
        yield
    finally:
        stop.set()
        await task
