"""A long, resumable ETL load, run by the service processes of `test_checkpoints.py` (loaded
with `DL_PIPELINE_MODULES=tests.integration_tests.etl_task`).

It writes `rows` rows into `etl_target` in chunks, each chunk in a transaction of its own, and
saves a checkpoint after each chunk is committed. The upsert counts how often a row was
written (`writes`), so the test can tell how much work a resumed attempt repeated. Each
attempt also notes where it started (`etl_starts`).
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated

from pydantic import BaseModel, Field
from sqlalchemy import text

import dataloader
from dataloader import JobContext

TASK = "etl.load_rows"
QUEUE = "etl"

#: The test creates these tables before it starts a process.
TABLES = (
    "CREATE TABLE etl_target (id int PRIMARY KEY, value bigint NOT NULL, writes int NOT NULL)",
    "CREATE TABLE etl_starts (attempt int NOT NULL, pid int NOT NULL, resume_from int NOT NULL,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp())",
)

UPSERT_CHUNK = text("""
INSERT INTO etl_target (id, value, writes)
SELECT g, g::bigint * 7, 1 FROM generate_series(CAST(:first AS int), CAST(:last AS int)) AS g
ON CONFLICT (id) DO UPDATE SET value = EXCLUDED.value, writes = etl_target.writes + 1
""")

RECORD_START = text(
    "INSERT INTO etl_starts (attempt, pid, resume_from) VALUES (:attempt, :pid, :resume_from)"
)


class LoadArgs(BaseModel):
    rows: Annotated[int, Field(ge=1)]
    chunk: Annotated[int, Field(ge=1)]
    #: Pauses after each chunk's commit and after its checkpoint: the load's pace, so that a
    #: test can stop it half-way, on either side of a checkpoint.
    commit_pause_sec: Annotated[float, Field(ge=0)] = 0.0
    pause_sec: Annotated[float, Field(ge=0)] = 0.0


def expected_value(row_id: int) -> int:
    """The value the load writes for a row."""
    return row_id * 7


@dataloader.task(TASK, queue=QUEUE, args=LoadArgs, lease_ttl=3, max_attempts=10)
async def load_rows(ctx: JobContext[LoadArgs]) -> dict[str, int]:
    args = ctx.args
    start = 0 if ctx.resume_from is None else int(ctx.resume_from["next"])
    async with ctx.engine.begin() as conn:
        await conn.execute(
            RECORD_START, {"attempt": ctx.attempt, "pid": os.getpid(), "resume_from": start}
        )
    for first in range(start, args.rows, args.chunk):
        last = min(first + args.chunk, args.rows) - 1
        async with ctx.engine.begin() as conn:
            await conn.execute(UPSERT_CHUNK, {"first": first, "last": last})
        await asyncio.sleep(args.commit_pause_sec)
        # only once the chunk is committed: resuming repeats at most this one chunk
        await ctx.checkpoint({"next": last + 1})
        await asyncio.sleep(args.pause_sec)
    return {"rows": args.rows, "resumed_from": start}
