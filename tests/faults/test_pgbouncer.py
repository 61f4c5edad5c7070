"""Replicas behind a transaction-pooling PgBouncer (DL_DB_DSN through it, DL_DB_DIRECT_DSN
straight to the server for the locks of lock_keys, LISTEN and migrations), killed with
SIGKILL at random moments under load: every job succeeds once, no two runs of one lock_key
overlap, no lock is left (the ledger's checker)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import asyncpg
import pytest

from ..engines.pgbouncer import PgBouncer, pgbouncer
from ..integration_tests.helpers import wait_until
from ..integration_tests.procs import Launcher, ServiceProcess
from .conftest import Scenario, rounds
from .test_processes import runs_open_on


@pytest.fixture
async def transaction_pooler(db_dsn: str) -> AsyncIterator[PgBouncer]:
    async with pgbouncer(db_dsn, "transaction") as bouncer:
        yield bouncer


async def test_kill_9_under_load_behind_a_transaction_pooler(
    launcher: Launcher, db_dsn: str, conn: asyncpg.Connection, transaction_pooler: PgBouncer
) -> None:
    scenario = Scenario(
        "kill_9_behind_pgbouncer", launcher, transaction_pooler.through(db_dsn), conn
    )
    # the ledger's own pool keeps asyncpg's prepared statements: straight to the server
    direct = {"DL_DB_DIRECT_DSN": db_dsn, "FAULT_LEDGER_DSN": db_dsn}

    async def start(count: int) -> list[ServiceProcess]:
        started = await scenario.start(count, concurrency=4, **direct)
        for replica in started:  # each found the pooler's mode on its own, under load
            assert "DL_DB_DSN goes through a transaction-pooling pooler" in replica.logs()
        return started

    replicas = await start(2)
    shuffle = random.Random(20261128)
    total = rounds(3)
    for round_no in range(total):
        await scenario.enqueue(60, steps=3, step_sec=0.03)
        victim = replicas[round_no % len(replicas)]
        await wait_until(
            lambda v=victim: runs_open_on(scenario, v), what="the victim to run a job", timeout=30
        )
        await asyncio.sleep(shuffle.uniform(0, 0.05))  # the fault's timing, not a wait
        await scenario.kill(victim)
        replicas[round_no % len(replicas)] = (await start(1))[0]
    report = await scenario.check(total, await scenario.settle())
    assert report.runs > report.jobs  # the kills did interrupt runs that were redone
