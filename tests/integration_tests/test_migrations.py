"""Schema migrations in-process: fresh databases, re-runs, replicas migrating at once, adoption
of a database prepared with the spec's DDL by hand, and refusal of a half-present schema."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from dataloader.exceptions import DataloaderError
from dataloader.storage import db, queries
from dataloader.storage.migrate import load_migrations, migrate

from .helpers import schema_definitions, wait_until

MIGRATIONS = load_migrations()
VERSIONS = [m.version for m in MIGRATIONS]
SPEC_DDL = next(m for m in MIGRATIONS if m.version == 1).sql
SPEC_TABLES = ("dl_jobs", "dl_job_events")

ADVISORY_LOCKS = """
SELECT count(*) FILTER (WHERE granted) AS held, count(*) FILTER (WHERE NOT granted) AS waiting
FROM pg_locks
WHERE locktype = 'advisory'
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


@pytest.fixture
async def empty_conn(empty_db_dsn: str) -> AsyncIterator[db.Connection]:
    """A connection to a database without any dataloader object."""
    conn = await db.connect(empty_db_dsn, "test-migrations")
    yield conn
    await conn.close()


async def recorded(conn: db.Connection) -> list[tuple[int, str, bool]]:
    rows = await conn.fetch("SELECT version, name, adopted FROM dl_schema_migrations ORDER BY 1")
    return [(r["version"], r["name"], r["adopted"]) for r in rows]


async def public_objects(conn: db.Connection) -> set[str]:
    """Relations and types in the public schema."""
    rows = await conn.fetch(
        "SELECT relname AS name FROM pg_class WHERE relnamespace = 'public'::regnamespace"
        " UNION SELECT typname FROM pg_type WHERE typnamespace = 'public'::regnamespace"
    )
    return {r["name"] for r in rows}


async def columns(conn: db.Connection) -> dict[tuple[str, str], tuple[object, ...]]:
    rows = await conn.fetch(
        "SELECT table_name, column_name, data_type, udt_name, is_nullable, column_default"
        " FROM information_schema.columns"
        " WHERE table_schema = 'public' AND table_name = ANY($1::text[])",
        list(SPEC_TABLES),
    )
    return {(r["table_name"], r["column_name"]): tuple(r.values())[2:] for r in rows}


def test_packaged_migrations_are_numbered_from_one_without_gaps() -> None:
    assert list(range(1, len(VERSIONS) + 1)) == VERSIONS
    assert MIGRATIONS[0].name == "spec_schema"
    assert all(m.sql.strip() for m in MIGRATIONS)


async def test_empty_database_gets_every_migration(empty_conn: db.Connection) -> None:
    report = await migrate(empty_conn)

    assert report.applied == VERSIONS
    assert report.adopted == []
    assert report.current == VERSIONS[-1]
    assert await recorded(empty_conn) == [(m.version, m.name, False) for m in MIGRATIONS]
    for name in (*SPEC_TABLES, "ix_dl_jobs_claim", "ix_dl_jobs_claim_ready"):
        assert await empty_conn.fetchval("SELECT to_regclass($1) IS NOT NULL", name), name
    assert (await empty_conn.fetchrow(ADVISORY_LOCKS))["held"] == 0  # migration lock released


async def test_second_run_applies_nothing(empty_conn: db.Connection) -> None:
    await migrate(empty_conn)
    before = await empty_conn.fetch("SELECT * FROM dl_schema_migrations ORDER BY version")
    schema_before = await schema_definitions(empty_conn)

    report = await migrate(empty_conn)

    assert report.applied == []
    assert report.adopted == []
    assert report.current == VERSIONS[-1]
    assert await empty_conn.fetch("SELECT * FROM dl_schema_migrations ORDER BY version") == before
    assert await schema_definitions(empty_conn) == schema_before


async def test_replicas_migrating_at_once_are_serialised(
    empty_db_dsn: str, empty_conn: db.Connection
) -> None:
    # Hold the migration lock so that both replicas are provably inside migrate() together.
    await empty_conn.execute(queries.MIGRATION_LOCK)
    first = await db.connect(empty_db_dsn, "replica-1")
    second = await db.connect(empty_db_dsn, "replica-2")
    try:
        runs = asyncio.gather(migrate(first), migrate(second))

        async def both_waiting() -> bool:
            return (await empty_conn.fetchrow(ADVISORY_LOCKS))["waiting"] == 2

        try:
            await wait_until(both_waiting, timeout=10, what="both replicas to wait for the lock")
        finally:
            await empty_conn.execute(queries.MIGRATION_UNLOCK)
            reports = await asyncio.wait_for(runs, timeout=30)
    finally:
        await first.close()
        await second.close()

    assert sorted(r.applied for r in reports) == [[], VERSIONS]  # one did the work, once
    assert all(r.current == VERSIONS[-1] for r in reports)
    assert await recorded(empty_conn) == [(m.version, m.name, False) for m in MIGRATIONS]
    assert (
        await empty_conn.fetchval("SELECT count(*) FROM pg_type WHERE typname = 'dl_status'") == 1
    )


async def test_adopts_a_database_with_the_spec_ddl_applied_by_hand(
    empty_conn: db.Connection,
) -> None:
    await empty_conn.execute(SPEC_DDL)
    job_id = await empty_conn.fetchval(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, args)"
        " VALUES (gen_random_uuid(), 'q', 'legacy.task', 'k', '{\"a\": 1}') RETURNING job_id"
    )
    await empty_conn.execute(
        "INSERT INTO dl_job_events (job_id, queue, kind) VALUES ($1, 'q', 'queued')", job_id
    )
    spec_before = await schema_definitions(empty_conn)

    report = await migrate(empty_conn)  # re-running 0001 would fail: the type exists

    assert report.adopted == [1]
    assert report.applied == VERSIONS[1:]
    assert await recorded(empty_conn) == [(m.version, m.name, m.version == 1) for m in MIGRATIONS]
    row = await empty_conn.fetchrow("SELECT task, args, status::text FROM dl_jobs")
    assert tuple(row.values()) == ("legacy.task", {"a": 1}, "queued")
    assert await empty_conn.fetchval("SELECT count(*) FROM dl_job_events") == 1
    after = await schema_definitions(empty_conn)
    assert {key: after.get(key) for key in spec_before} == spec_before

    again = await migrate(empty_conn)
    assert (again.applied, again.adopted) == ([], [])


async def test_jobs_delayed_before_the_upgrade_are_parked_by_it(
    empty_conn: db.Connection,
) -> None:
    await empty_conn.execute(SPEC_DDL)
    await empty_conn.execute(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, available_at) VALUES"
        " (gen_random_uuid(), 'q', 't', 'now', now()),"
        " (gen_random_uuid(), 'q', 't', 'later', now() + interval '1 day')"
    )
    await migrate(empty_conn)
    rows = await empty_conn.fetch("SELECT lock_key, parked FROM dl_jobs ORDER BY lock_key")
    assert [tuple(r.values()) for r in rows] == [("later", "delayed"), ("now", None)]


@pytest.mark.parametrize(
    ("ddl", "missing"),
    [
        (
            "CREATE TYPE dl_status AS ENUM ('queued', 'running')",
            "table dl_jobs, table dl_job_events",
        ),
        ("CREATE TABLE dl_jobs (job_id uuid PRIMARY KEY)", "table dl_job_events, type dl_status"),
        (SPEC_DDL + "; DROP TABLE dl_job_events", "table dl_job_events"),
    ],
    ids=["only-the-type", "only-dl_jobs", "no-journal"],
)
async def test_refuses_a_half_present_spec_schema(
    empty_conn: db.Connection, ddl: str, missing: str
) -> None:
    await empty_conn.execute(ddl)
    objects_before = await public_objects(empty_conn)

    with pytest.raises(DataloaderError, match="part of the dataloader schema") as caught:
        await migrate(empty_conn)

    assert f"missing: {missing})" in str(caught.value)
    assert "refusing" in str(caught.value)
    assert await recorded(empty_conn) == []
    # nothing but the (empty) record table was created; the migration lock was released
    added = await public_objects(empty_conn) - objects_before
    assert {name for name in added if "dl_schema_migrations" not in name} == set()
    assert (await empty_conn.fetchrow(ADVISORY_LOCKS))["held"] == 0


async def test_migrated_schema_has_every_object_of_the_spec_ddl(
    db_dsn: str, empty_conn: db.Connection
) -> None:
    await empty_conn.execute(SPEC_DDL)  # the customer's database, prepared by hand
    migrated = await db.connect(db_dsn, "test-migrations")  # prepared by migrate()
    try:
        spec_columns, our_columns = await columns(empty_conn), await columns(migrated)
        spec_defs, our_defs = (
            await schema_definitions(empty_conn),
            await schema_definitions(migrated),
        )
    finally:
        await migrated.close()

    assert len(spec_columns) == 23 + 6  # dl_jobs + dl_job_events
    assert {key: our_columns.get(key) for key in spec_columns} == spec_columns
    assert {
        "index ix_dl_jobs_claim",
        "index ix_dl_jobs_running_lease",
        "index ix_dl_jobs_status_queue",
        "trigger dl_jobs_notify_ins",
        "trigger dl_jobs_notify_upd",
        "constraint dl_jobs_chk_positive",
    } <= spec_defs.keys()
    assert {key: our_defs.get(key) for key in spec_defs} == spec_defs
    # later migrations only add: nothing nullable became NOT NULL, nothing was renamed
    added = our_columns.keys() - spec_columns.keys()
    assert all(our_columns[key][2] == "YES" or our_columns[key][3] for key in added), added
