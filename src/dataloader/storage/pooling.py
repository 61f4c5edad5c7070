"""Whether a DSN reaches PostgreSQL straight or through a pooler (PgBouncer), and in which
pool mode: what dataloader may leave on a connection depends on it.

* `none`: a server session of our own per connection (a TCP proxy in between changes nothing).
* `session`: a pooler that lends one server connection per client connection for as long as
  the client stays (PgBouncer's `pool_mode = session`): session state works, but the server
  session outlives our connection (the pooler resets it and lends it to someone else), so it
  is never ours to end.
* `transaction`: a pooler that lends a server connection for one transaction only
  (`pool_mode = transaction`, or `statement`): nothing of a session survives between
  transactions (session advisory locks, LISTEN, SET, named prepared statements).

The probe needs no setting and leaves nothing behind (it only reads `pg_backend_pid()`):

* a pooler answers a client's connection with a cancel key of its own, so the pid the
  connection announced differs from the server's `pg_backend_pid()` (a plain TCP proxy
  passes the server's through): pooled or not;
* a client A reads its server's pid; a second client B, inside a transaction, reads its own,
  then A reads again while B's transaction is open. Under a session pooler A keeps its server
  connection for as long as it is connected, so B never gets A's and A's never changes; under
  a transaction pooler A's server connection went back to the pool after its statement: B gets
  it (PgBouncer lends the most recently used one first) or A gets another one. Either sighting
  proves transaction pooling; neither in a few rounds (a busy pool lending A's connection to a
  third client each time) reads as session pooling.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Final

import asyncpg

from dataloader.storage import queries

#: Rounds of the probe before a pooler that never showed transaction pooling counts as a
#: session pooler.
PROBE_ROUNDS: Final = 3


class Pooling(enum.StrEnum):
    """How a DSN reaches the server (see the module's doc)."""

    none = "none"
    session = "session"
    transaction = "transaction"


async def _pid(conn: asyncpg.Connection[asyncpg.Record]) -> int:
    row = await conn.fetchrow(queries.SESSION_IDENTITY)
    assert row is not None  # our own session is always in pg_stat_activity
    pid: int = row["pid"]
    return pid


async def _connect(dsn: str, timeout: float) -> asyncpg.Connection[asyncpg.Record]:
    # no named prepared statements: they would fail through a transaction pooler
    conn: asyncpg.Connection[asyncpg.Record] = await asyncpg.connect(
        dsn,
        timeout=timeout,
        statement_cache_size=0,
        server_settings={"application_name": "dataloader-probe"},
    )
    return conn


async def probe(dsn: str, timeout: float = 5.0) -> Pooling:
    """How `dsn` (libpq form) reaches its server; TimeoutError if the probe does not end
    within `timeout` seconds, the driver's error if it cannot connect."""
    async with asyncio.timeout(timeout):
        first = await _connect(dsn, timeout)
        try:
            pid = await _pid(first)
            pooled = first.get_server_pid() != pid
            for _ in range(PROBE_ROUNDS):
                if await _lent_away(dsn, first, pid, timeout):
                    return Pooling.transaction
        finally:
            await first.close(timeout=timeout)
    return Pooling.session if pooled else Pooling.none


async def _lent_away(
    dsn: str, first: asyncpg.Connection[asyncpg.Record], pid: int, timeout: float
) -> bool:
    """One round: whether `first`'s server connection (`pid`) was seen lent to another client
    while `first` stayed connected, or `first` on another server connection."""
    second = await _connect(dsn, timeout)
    try:
        async with second.transaction():
            if await _pid(second) == pid:
                return True
            return await _pid(first) != pid
    finally:
        await second.close(timeout=timeout)
