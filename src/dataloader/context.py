"""AppContext (spec §3): opens and closes every resource of the process in one ordered place:
the embedded PostgreSQL (when `DL_DB_DSN` is unset), migrations, the asyncpg pool of the queue,
and the SQLAlchemy async engine/sessionmaker offered to pipelines."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from dataloader.config import Settings
from dataloader.exceptions import DatabaseUnavailable
from dataloader.logger.utils import mask_dsn
from dataloader.storage import db
from dataloader.storage.embedded import start_embedded
from dataloader.storage.migrate import MigrationReport, migrate
from dataloader.storage.repositories import JobRepository

log = logging.getLogger(__name__)


async def resolve_dsn(settings: Settings) -> str:
    """`DL_DB_DSN`, or the embedded server's DSN (started on demand)."""
    if settings.asyncpg_dsn is not None:
        return settings.asyncpg_dsn
    return await asyncio.to_thread(start_embedded, settings.data_dir)


async def run_migrations(dsn: str) -> MigrationReport:
    """Apply pending migrations on a dedicated connection."""
    try:
        conn = await db.connect(dsn, "dataloader-migrate")
    except db.CONNECTION_ERRORS as exc:
        raise DatabaseUnavailable(f"cannot connect to {mask_dsn(dsn)}: {exc}") from exc
    try:
        return await migrate(conn)
    finally:
        await conn.close()


@dataclass(eq=False)
class AppContext:
    """Resources shared by the API, the workers and pipelines."""

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
        try:
            pool = await db.create_pool(
                dsn, settings.db_pool_size, "dataloader", settings.db_timeout_sec
            )
        except db.CONNECTION_ERRORS as exc:
            raise DatabaseUnavailable(f"cannot connect to {mask_dsn(dsn)}: {exc}") from exc
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
