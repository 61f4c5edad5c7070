"""In-process services for integration tests: the real app (API + workers) on a real database.

Timings are shortened (heartbeat 0.2 s), and the safety poll is set to minutes so that a test
passing proves the wake-up path it exercises (NOTIFY, the delayed-job timer, a finished job).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import httpx
import pytest
from fastapi import FastAPI

import dataloader.workers.pipelines.demo  # noqa: F401 - registers demo.* in the default registry
from dataloader.api import create_app
from dataloader.client import Client
from dataloader.config import Settings
from dataloader.context import AppContext
from dataloader.runner import Runner
from dataloader.tasks import TaskRegistry
from dataloader.tasks import registry as default_registry
from dataloader.workers.manager import WorkerManager

from .browser import browser  # noqa: F401 - the dashboard tests' chromium, a fixture
from .helpers import ADVISORY_LOCKS, JobsApi, wait_until
from .operators import Cli
from .procs import Launcher, launched

__all__ = ["ADVISORY_LOCKS", "Service", "StartService", "wait_until"]

T = TypeVar("T")

TEST_DEFAULTS: dict[str, Any] = {
    "workers": [{"queue": "default", "concurrency": 4}],
    "heartbeat_sec": 0.2,
    "default_lease_ttl_sec": 5,
    "reaper_period_sec": 0.2,
    "leader_lease_sec": 1,
    "claim_backoff_sec": 0.3,
    "retry_base_sec": 0,
    "poll_interval_sec": 300,
    "shutdown_timeout_sec": 5,
    "auto_migrate": False,
    "db_pool_size": 5,
}


@pytest.fixture
def registry() -> TaskRegistry:
    """The demo pipelines, in a registry the test may extend."""
    return default_registry.copy()


@pytest.fixture
def make_settings(db_dsn: str) -> Callable[..., Settings]:
    def build(**overrides: Any) -> Settings:
        return Settings(_env_file=None, db_dsn=db_dsn, **(TEST_DEFAULTS | overrides))  # type: ignore[call-arg]

    return build


@dataclass
class Service(JobsApi):
    """A running in-process service."""

    settings: Settings
    app: FastAPI
    client: httpx.AsyncClient

    @property
    def manager(self) -> WorkerManager:
        manager: WorkerManager = self.app.state.manager
        return manager

    @property
    def context(self) -> AppContext:
        context: AppContext = self.app.state.app_context
        return context

    @property
    def dl(self) -> Client:
        """The service's dataloader client."""
        return self.context.client


StartService = Callable[..., Awaitable[Service]]


@pytest.fixture
async def start_service(
    make_settings: Callable[..., Settings], registry: TaskRegistry
) -> AsyncIterator[StartService]:
    """Start services (API + workers) in this event loop; all are stopped after the test."""
    async with AsyncExitStack() as stack:

        async def start(
            *, run_workers: bool = True, tasks: TaskRegistry | None = None, **overrides: Any
        ) -> Service:
            """A service with the test's registry (or `tasks`) and settings `overrides`."""
            # A service without workers stands for an API replica whose workers are elsewhere
            # and not part of the test: it accepts tasks no live process knows even on queues
            # the test's other processes serve, unless the test says otherwise (the check
            # itself is tested in test_presence.py).
            overrides.setdefault("allow_unknown_tasks", not run_workers)
            settings = make_settings(**overrides)
            app = create_app(settings, tasks or registry, run_workers=run_workers)
            await stack.enter_async_context(app.router.lifespan_context(app))
            client = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://dataloader.test"
            )
            stack.push_async_callback(client.aclose)
            return Service(settings, app, client)

        yield start


@pytest.fixture
async def launcher(tmp_path: Path) -> AsyncIterator[Launcher]:
    """Starts service processes in `tmp_path`; every one still running is killed afterwards."""
    async with launched(tmp_path) as started:
        yield started


@pytest.fixture
async def conn(db_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection to the test database, for assertions."""
    connection = await asyncpg.connect(db_dsn)
    yield connection
    await connection.close()


# --- the operators' commands (test_cli_*.py) -----------------------------------------------------


@pytest.fixture
def cli(db_dsn: str, tmp_path: Path) -> Cli:
    """`dataloader …` on the test's database, in the test's own working directory."""
    return Cli(db_dsn, tmp_path)


@pytest.fixture
async def client(db_dsn: str) -> AsyncIterator[Client]:
    """A library client on the test database, to prepare and check what the commands did
    (a test module may define a `client` of its own)."""
    async with Client.connect(db_dsn, settings=Settings(_env_file=None, db_dsn=db_dsn)) as c:  # type: ignore[call-arg]
        yield c


@pytest.fixture
def workers(make_settings: Callable[..., Settings]) -> Callable[[], Runner]:
    """Workers in this process serving the queue `default` (the demo tasks registered)."""
    return lambda: Runner(make_settings(workers=[{"queue": "default", "concurrency": 2}]))
