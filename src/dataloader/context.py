"""AppContext: opens and closes every resource of the process in one ordered place: the
embedded PostgreSQL (when `DL_DB_DSN` is unset), migrations, the asyncpg pool of the queue,
and a SQLAlchemy async engine/sessionmaker offered to pipelines. All of them connect to one
database, the queue's own (`DL_DB_DSN` or the embedded one)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from dataloader.config import Settings
from dataloader.exceptions import DatabaseUnavailable, DataloaderError
from dataloader.logger.utils import mask_dsn
from dataloader.storage import db
from dataloader.storage.embedded import start_embedded
from dataloader.storage.migrate import MigrationReport, migrate
from dataloader.storage.repositories import JobRepository

log = logging.getLogger(__name__)


#: The oldest PostgreSQL dataloader runs on (`gen_random_uuid()` is built in from 13 on).
MIN_SERVER_VERSION = 13


async def resolve_dsn(settings: Settings) -> str:
    """`DL_DB_DSN`, or the embedded server's DSN (started on demand)."""
    if settings.asyncpg_dsn is not None:
        return settings.asyncpg_dsn
    return await asyncio.to_thread(start_embedded, settings.data_dir)


@contextmanager
def _explained(dsn: str) -> Iterator[None]:
    """Turn what a user's database setup can do wrong into one line naming `DL_DB_DSN` (the
    password masked); anything else stays a bug with its traceback."""
    where = mask_dsn(dsn)
    try:
        yield
    except (
        asyncpg.InvalidCatalogNameError,  # no such database
        asyncpg.InvalidAuthorizationSpecificationError,  # no such role, wrong password
    ) as exc:
        raise DatabaseUnavailable(f"DL_DB_DSN ({where}): {exc}") from None
    except asyncpg.InsufficientPrivilegeError as exc:
        raise DataloaderError(
            f"DL_DB_DSN ({where}): {exc}: the user must be allowed to create and change"
            " dataloader's tables; grant it CREATE on the schema, or run `dataloader migrate`"
            " once as a user who may"
        ) from None
    except asyncpg.ReadOnlySQLTransactionError as exc:
        raise DataloaderError(
            f"DL_DB_DSN ({where}): {exc}: the database is read-only (a standby?);"
            " dataloader writes to it, so name the primary"
        ) from None
    except db.CONNECTION_ERRORS as exc:
        raise DatabaseUnavailable(f"DL_DB_DSN: cannot connect to {where}: {exc}") from None


async def _connect(dsn: str, application_name: str) -> db.Connection:
    """A dedicated connection to a server dataloader can run on."""
    with _explained(dsn):
        conn = await db.connect(dsn, application_name)
    if conn.get_server_version().major < MIN_SERVER_VERSION:
        announced = conn.get_settings().server_version
        await conn.close()
        raise DataloaderError(
            f"DL_DB_DSN ({mask_dsn(dsn)}): PostgreSQL {announced} is too old:"
            f" dataloader needs {MIN_SERVER_VERSION} or later"
        )
    return conn


async def check_database(dsn: str) -> str:
    """Connect once: the database exists, lets us in and runs a recent enough PostgreSQL.
    Returns the server's version (`server_version`, e.g. "18.4")."""
    conn = await _connect(dsn, "dataloader-check")
    version: str = conn.get_settings().server_version
    await conn.close()
    return version


async def run_migrations(dsn: str) -> MigrationReport:
    """Apply pending migrations on a dedicated connection."""
    conn = await _connect(dsn, "dataloader-migrate")
    try:
        with _explained(dsn):
            return await migrate(conn)
    finally:
        await conn.close()


@dataclass(eq=False)
class AppContext:
    """Resources shared by the API, the workers and pipelines (as `ctx.app`), every one of them
    on the queue's database.

    * `pool`: the queue's asyncpg pool (its connections are not reset between uses: leave no
      session state on them);
    * `engine`, `sessionmaker`: SQLAlchemy async engine and sessions for a pipeline's own tables
      beside the queue (the engine connects lazily: unused, it costs no connection). A pipeline
      that writes to another database opens its own engine for it;
    * `repo`: enqueue, read and cancel jobs;
    * `dsn`: the database's DSN (with its password, if it has one: never log it as it is).
    """

    settings: Settings
    dsn: str
    pool: db.Pool
    engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]
    repo: JobRepository

    @classmethod
    async def open(cls, settings: Settings) -> AppContext:
        """Connect (starting the embedded server if needed) and migrate when configured."""
        dsn = await resolve_dsn(settings)
        if settings.auto_migrate:
            report = await run_migrations(dsn)
            log.info("schema at version %d", report.current)
        else:
            await check_database(dsn)
        with _explained(dsn):
            pool = await db.create_pool(
                dsn, settings.db_pool_size, "dataloader", settings.db_timeout_sec
            )
        engine = db.create_engine(dsn)
        return cls(
            settings=settings,
            dsn=dsn,
            pool=pool,
            engine=engine,
            sessionmaker=db.create_sessionmaker(engine),
            repo=JobRepository(pool, settings.db_timeout_sec),
        )

    async def close(self) -> None:
        """Release connections (the embedded server stops when the process exits)."""
        await self.engine.dispose()
        await asyncio.wait_for(self.pool.close(), timeout=10)
