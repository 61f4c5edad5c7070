"""`dataloader.Client` over each source of connections it takes, for the client's tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import create_async_engine

from dataloader import Client

#: How a client gets its connections: a pool of its own (`Client.connect`), an application's
#: asyncpg pool created without dataloader's json codecs, a SQLAlchemy AsyncEngine (whose
#: dialect installs json codecs of its own).
SOURCES = ("connect", "pool", "engine")

#: Sessions of the test's database LISTENing for ended jobs: a session's `query` is its last
#: statement, and the listening connection runs nothing after its LISTEN until it UNLISTENs.
FINISHED_LISTENERS = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND query LIKE 'LISTEN %dl_job_finished%'
"""


def sqlalchemy_url(dsn: str) -> str:
    """SQLAlchemy's spelling of a libpq DSN, as an application builds its engine."""
    return "postgresql+asyncpg://" + dsn.split("://", 1)[1]


@asynccontextmanager
async def open_client(source: str, dsn: str, **options: Any) -> AsyncIterator[Client]:
    """A client on `source` (one of SOURCES) to `dsn`, closed (with its pool or engine)
    afterwards."""
    if source == "connect":
        async with Client.connect(dsn, **options) as client:
            yield client
    elif source == "pool":
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4, command_timeout=10)
        try:
            async with Client(pool=pool, **options) as client:
                yield client
        finally:
            await pool.close()
    elif source == "engine":
        # no overflow: connections given back are kept (an overflow one would be closed)
        engine = create_async_engine(sqlalchemy_url(dsn), pool_size=4, max_overflow=0)
        try:
            async with Client(engine=engine, **options) as client:
                yield client
        finally:
            await engine.dispose()
    else:
        raise AssertionError(f"unknown source {source!r}")


def listen_tasks() -> list[asyncio.Task[Any]]:
    """The clients' listener tasks still alive in this event loop."""
    return [
        task
        for task in asyncio.all_tasks()
        if task.get_name() == "dataloader-client-listen" and not task.done()
    ]
