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
* two clients A and B stay connected; in each round A reads its server's pid, then B, inside
  a transaction, reads its own and what A's server connection is doing. Under a session
  pooler A keeps its server connection for as long as it is connected: B never gets it,
  nobody else runs anything on it (it sits idle, A's statement its last), and A's pid never
  changes. Under a transaction pooler A's server connection went back to the pool after A's
  statement: B gets it (PgBouncer lends the most recently freed one first), or another client
  ran something on it meanwhile (a busy pool), or A lands on another one in the next round
  (B's, freed at its commit). Any of these sightings proves transaction pooling; none in a few
  rounds reads as session pooling.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Final

import asyncpg

#: Rounds of the probe before a pooler that never showed transaction pooling counts as a
#: session pooler.
PROBE_ROUNDS: Final = 5

#: The probe's own statement: what A's server connection shows as its last one while nobody
#: else used it.
PROBE_PID: Final = "SELECT pg_backend_pid() AS pid"
#: What a server connection is doing (state NULL: not ours to see; `disabled`: not tracked).
SERVER_ACTIVITY: Final = "SELECT state, query FROM pg_stat_activity WHERE pid = $1"


class Pooling(enum.StrEnum):
    """How a DSN reaches the server (see the module's doc)."""

    none = "none"
    session = "session"
    transaction = "transaction"


async def _pid(conn: asyncpg.Connection[asyncpg.Record]) -> int:
    pid: int = await conn.fetchval(PROBE_PID)
    return pid


async def _used_by_another(conn: asyncpg.Connection[asyncpg.Record], pid: int) -> bool:
    """Whether the server connection `pid`, idle behind a client of ours since its probe
    statement, is gone, busy or ran another statement since: lent to someone else."""
    row = await conn.fetchrow(SERVER_ACTIVITY, pid)
    if row is None:  # closed by the pooler while its client stayed connected
        return True
    if row["state"] in (None, "disabled"):  # another role's, or track_activities off
        return False
    return bool(row["state"] != "idle" or row["query"] != PROBE_PID)


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
            second = await _connect(dsn, timeout)
            try:
                return await _rounds(first, second)
            finally:
                await second.close(timeout=timeout)
        finally:
            await first.close(timeout=timeout)


async def _rounds(
    first: asyncpg.Connection[asyncpg.Record], second: asyncpg.Connection[asyncpg.Record]
) -> Pooling:
    """Up to PROBE_ROUNDS rounds of: `first` reads its server's pid, then `second`, in a
    transaction, reads its own and what `first`'s server connection does. Both stay connected
    throughout: under transaction pooling the server connection `second` frees at its commit is
    the one the pooler lends next, so `first` lands on it in the next round even when other
    clients' statements keep `second` off `first`'s."""
    pooled = False
    last: int | None = None
    for _ in range(PROBE_ROUNDS):
        pid = await _pid(first)
        pooled = pooled or first.get_server_pid() != pid
        if last is not None and pid != last:  # `first` moved while connected
            return Pooling.transaction
        last = pid
        async with second.transaction():
            if await _pid(second) == pid or await _used_by_another(second, pid):
                return Pooling.transaction
    return Pooling.session if pooled else Pooling.none
