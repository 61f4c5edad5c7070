"""Schema migrations: numbered SQL files in `migrations/`, recorded in `dl_schema_migrations`.

* idempotent: applied versions are skipped;
* safe when replicas start together: a session-level advisory lock serialises them;
* adopts a database that already has the spec's tables (migration 0001) without touching them.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from dataloader.exceptions import DataloaderError
from dataloader.storage import queries
from dataloader.storage.db import AnyConnection, Connection

log = logging.getLogger(__name__)

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered SQL file."""

    version: int
    name: str
    sql: str


@dataclass(frozen=True, slots=True)
class MigrationReport:
    """What `migrate` did."""

    applied: list[int]
    adopted: list[int]
    current: int


def load_migrations() -> list[Migration]:
    """The packaged migrations in version order."""
    found: list[Migration] = []
    for entry in resources.files("dataloader.storage.migrations").iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


async def migrate(conn: Connection) -> MigrationReport:
    """Bring the database to the latest schema; see the module docstring."""
    await conn.execute(queries.MIGRATION_LOCK)
    try:
        await conn.execute(queries.CREATE_MIGRATIONS_TABLE)
        done = {row["version"] for row in await conn.fetch(queries.APPLIED_MIGRATIONS)}
        applied: list[int] = []
        adopted: list[int] = []
        for migration in load_migrations():
            if migration.version in done:
                continue
            async with conn.transaction():
                if migration.version == 1 and await _spec_schema_present(conn):
                    await conn.execute(*_record(migration, adopted=True))
                    adopted.append(migration.version)
                    log.info("adopted the existing spec schema as migration 0001")
                    continue
                await conn.execute(migration.sql)
                await conn.execute(*_record(migration, adopted=False))
            applied.append(migration.version)
            log.info("applied migration %04d_%s", migration.version, migration.name)
        current = max([*done, *applied, *adopted], default=0)
        return MigrationReport(applied=applied, adopted=adopted, current=current)
    finally:
        await conn.execute(queries.MIGRATION_UNLOCK)


async def check_schema(conn: AnyConnection, where: str) -> None:
    """Refuse a database that lacks migrations (DataloaderError, one line naming `where` and
    what to run). What dataloader does on it would fail statement by statement otherwise."""
    applied: set[int] = set()
    if await conn.fetchval(queries.MIGRATIONS_TABLE_PRESENT):
        applied = {row["version"] for row in await conn.fetch(queries.APPLIED_MIGRATIONS)}
    packaged = load_migrations()
    missing = sorted({m.version for m in packaged} - applied)
    if not missing:
        return
    schema = (
        "has no dataloader schema"
        if len(missing) == len(packaged)
        else f"lacks migrations {', '.join(map(str, missing))} of dataloader's schema"
    )
    raise DataloaderError(
        f"{where} {schema}: run `dataloader migrate` against it, or start a dataloader service"
        " on it, first"
    )


async def _spec_schema_present(conn: Connection) -> bool:
    """True when the spec's DDL was applied by hand; refuse a half-present schema."""
    row = await conn.fetchrow(queries.SPEC_OBJECTS_PRESENT)
    assert row is not None
    labels = {
        "jobs": "table dl_jobs",
        "events": "table dl_job_events",
        "status_type": "type dl_status",
    }
    present = {labels[name]: bool(row[name]) for name in labels}
    if all(present.values()):
        return True
    if any(present.values()):
        missing = ", ".join(name for name, ok in present.items() if not ok)
        raise DataloaderError(
            f"the database holds part of the dataloader schema (missing: {missing}); "
            "refusing to migrate it"
        )
    return False


def _record(migration: Migration, *, adopted: bool) -> tuple[Any, ...]:
    return queries.RECORD_MIGRATION.bind(
        version=migration.version, name=migration.name, adopted=adopted
    )
