"""The Patroni harness itself: a cluster that replicates synchronously, switches over, and
leaves nothing behind."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import psutil
import pytest

from .patroni import PatroniCluster


@pytest.fixture
async def cluster() -> AsyncIterator[PatroniCluster]:
    async with PatroniCluster() as started:
        yield started


async def test_a_commit_on_the_primary_is_read_on_the_new_one_after_a_switchover(
    cluster: PatroniCluster,
) -> None:
    conn = await asyncpg.connect(cluster.dsn)
    try:
        await conn.execute("CREATE TABLE written (n int); INSERT INTO written VALUES (1)")
        first_port = await conn.fetchval("SELECT inet_server_port()")
    finally:
        await conn.close()
    old, new = await cluster.switchover()
    assert first_port == old.pg_port
    conn = await asyncpg.connect(cluster.dsn)  # the same DSN finds the new primary
    try:
        assert await conn.fetchval("SELECT inet_server_port()") == new.pg_port
        assert not await conn.fetchval("SELECT pg_is_in_recovery()")
        assert await conn.fetchval("SELECT n FROM written") == 1
    finally:
        await conn.close()


async def test_stop_leaves_no_process_and_no_directory_behind() -> None:
    cluster = PatroniCluster()
    await cluster.start()
    pids = [proc.pid for proc in cluster._processes()]
    assert len(pids) >= 5  # etcd, two Patroni, two postmasters (and their backends)
    await cluster.stop()
    assert not [pid for pid in pids if psutil.pid_exists(pid)]
    assert not cluster.root.exists()
