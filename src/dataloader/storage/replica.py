"""Reads that may be a little stale, on a streaming standby (`DL_DB_READ_DSN`) while it is
reachable and close behind the primary, on the primary otherwise: a read the primary could
answer never fails for the standby's sake.

The standby's lag is measured at most every LAG_CHECK_SEC, by the first read that needs it
(`core.staleness.LagTracker`: WAL positions, not replay timestamps). A standby that cannot be
reached is tried again RETRY_AFTER_SEC later (backing off while it stays away); a read it
fails is read again on the primary.
Each change of source is logged once (the DSN's password masked).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final, Protocol, TypeVar

import asyncpg

from dataloader.core.staleness import Freshness, LagTracker, note_read
from dataloader.exceptions import DatabaseUnavailable, DataloaderError
from dataloader.logger.utils import mask_dsn
from dataloader.storage import db
from dataloader.storage.connections import Connections, GuardedPool
from dataloader.storage.migrate import check_schema

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The primary's current WAL position, in bytes.
PRIMARY_POSITION: Final = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"

#: How far the standby has replayed (NULL on a server that is no standby), and how long ago
#: the primary committed the last transaction it replayed (NULL: none since it started).
REPLICA_POSITION: Final = """
SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')::bigint AS replayed,
       extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8
           AS replay_age_sec
"""

#: The standby's lag is measured at most this often (a read between two uses the last one).
LAG_CHECK_SEC: Final = 1.0
#: How long reads go to the primary after the standby could not be reached or refused us;
#: doubled at each failure in a row, up to RETRY_AFTER_MAX_SEC (a check of a standby that
#: does not answer holds its read up to CHECK_TIMEOUT_SEC).
RETRY_AFTER_SEC: Final = 5.0
RETRY_AFTER_MAX_SEC: Final = 60.0
#: The longest a lag check waits for the standby and the primary together.
CHECK_TIMEOUT_SEC: Final = 3.0
#: Connections of the standby's pool, at most.
POOL_SIZE: Final = 4

#: What a read of the standby that the primary may answer can raise.
_REPLICA_FAILURES: Final[tuple[type[BaseException], ...]] = (
    DatabaseUnavailable,
    asyncpg.PostgresError,
    *db.CONNECTION_ERRORS,
)

#: What makes the standby unusable at a check (DataloaderError: it lacks the schema).
_UNUSABLE: Final[tuple[type[BaseException], ...]] = (*_REPLICA_FAILURES, DataloaderError)


class Reads(Protocol):
    """Where the reads that may be stale run."""

    async def read(self, read: Callable[[Connections], Awaitable[T]]) -> T:
        """`read` run on the connections chosen for it."""
        ...

    async def close(self) -> None: ...


class OnPrimary:
    """Every read on the primary (no DL_DB_READ_DSN, or a read that must be exact)."""

    def __init__(self, primary: Connections) -> None:
        self._primary = primary

    async def read(self, read: Callable[[Connections], Awaitable[T]]) -> T:
        return await read(self._primary)

    async def close(self) -> None:
        return None


class Replica:
    """Reads on the standby at `dsn` while it is reachable and at most `max_lag_sec` behind
    the primary (`primary`: the client's connections), on the primary otherwise. Where each
    read was served is told to the answer being made (`core.staleness.note_read`)."""

    def __init__(
        self, dsn: str, primary: Connections, *, max_lag_sec: float, timeout: float
    ) -> None:
        self._dsn = db.libpq_dsn(dsn)
        self._where = mask_dsn(dsn)
        self._primary = primary
        self._max_lag_sec = max_lag_sec
        self._timeout = timeout
        self._pool: db.Pool | None = None
        self._replica: GuardedPool | None = None
        self._tracker = LagTracker()
        self._state = Freshness("primary", fallback="unavailable")
        #: Until when (monotonic) `_state` holds without a new check.
        self._until = float("-inf")
        self._checking = asyncio.Lock()
        #: What was last logged of the standby (None: nothing, or that it serves reads).
        self._reported: str | None = None
        #: Failures to reach the standby in a row (its retries back off).
        self._failures = 0
        self._closed = False

    async def read(self, read: Callable[[Connections], Awaitable[T]]) -> T:
        """`read` on the standby if it may serve it, else (or if it fails there) on the
        primary."""
        state = await self._current()
        if state.source == "replica" and self._replica is None:  # closed meanwhile
            state = Freshness("primary")
        if state.source == "replica" and self._replica is not None:
            try:
                result = await read(self._replica)
            except _REPLICA_FAILURES as exc:
                state = self._failed(exc)
            else:
                note_read(state)
                return result
        result = await read(self._primary)
        note_read(state)
        return result

    async def _current(self) -> Freshness:
        """Where reads go now: the last decision while it holds, else a new check's."""
        if time.monotonic() < self._until:
            return self._state
        async with self._checking:
            if time.monotonic() >= self._until:  # nobody checked while we waited
                self._state, hold = await self._check()
                self._until = time.monotonic() + hold
        return self._state

    async def _check(self) -> tuple[Freshness, float]:
        """Measure the standby's lag: where reads go, and for how long that holds."""
        if self._closed:
            return Freshness("primary"), float("inf")
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_SEC):
                replica = await self._open()
                async with self._primary.connection() as conn:
                    position: int = await conn.fetchval(PRIMARY_POSITION)
                primary_at = time.monotonic()
                row = await replica.fetchrow(REPLICA_POSITION)
        except DatabaseUnavailable:  # the primary's outage: its reads will say so
            return Freshness("primary", fallback="unavailable"), LAG_CHECK_SEC
        except _UNUSABLE as exc:
            self._report("unavailable", f"cannot be used ({_line(exc)})")
            return Freshness("primary", fallback="unavailable"), self._retry_after()
        self._failures = 0
        assert row is not None  # a SELECT without FROM returns its row
        lag = self._tracker.observe(
            position, primary_at, row["replayed"], row["replay_age_sec"], time.monotonic()
        )
        if lag is None or lag > self._max_lag_sec:
            behind = "an unknown time" if lag is None else f"{lag:.1f}s"
            self._report(
                "lagging", f"is {behind} behind (DL_DB_READ_MAX_LAG_SEC={self._max_lag_sec:g})"
            )
            return Freshness("primary", lag, "lagging"), LAG_CHECK_SEC
        if self._reported is not None:
            log.info("reads that may be stale are served by the replica %s again", self._where)
            self._reported = None
        return Freshness("replica", lag), LAG_CHECK_SEC

    async def _open(self) -> GuardedPool:
        """The standby's pool, opened at its first use (a standby holding the schema)."""
        if self._replica is None:
            # no floor of connections: asyncpg would reopen it in the background, warning
            # each time, while the standby is away
            pool = await db.create_pool(
                self._dsn, POOL_SIZE, "dataloader-reads", self._timeout, min_size=0
            )
            try:
                async with pool.acquire(timeout=self._timeout) as conn:
                    await check_schema(conn, f"DL_DB_READ_DSN ({self._where})")
            except BaseException:
                pool.terminate()
                raise
            self._pool, self._replica = pool, GuardedPool(pool, self._timeout)
        return self._replica

    def _failed(self, exc: BaseException) -> Freshness:
        """A read the standby failed: read on the primary; a standby it cannot reach is left
        alone for RETRY_AFTER_SEC (more after failures in a row)."""
        if isinstance(exc, asyncpg.PostgresError) and not isinstance(
            exc, db.CONNECTION_ERRORS
        ):  # e.g. a query cancelled by a conflict with recovery: this read only
            self._report(f"error:{exc.sqlstate}", f"failed a read ({_line(exc)})")
            return Freshness("primary", fallback="error")
        self._report("unavailable", f"cannot be reached ({_line(exc)})")
        self._state = Freshness("primary", fallback="unavailable")
        self._until = time.monotonic() + self._retry_after()
        return self._state

    def _retry_after(self) -> float:
        """How long to leave the standby alone after one more failure to reach it."""
        self._failures += 1
        backoff: float = RETRY_AFTER_SEC * 2.0 ** min(self._failures - 1, 16)
        return min(backoff, RETRY_AFTER_MAX_SEC)

    def _report(self, what: str, message: str) -> None:
        """Log why reads go to the primary, once until it changes."""
        if self._reported != what:
            log.warning(
                "the replica %s %s: reads that may be stale go to the primary",
                self._where,
                message,
            )
            self._reported = what

    async def close(self) -> None:
        """Close the standby's pool (its reads go to the primary from now on)."""
        self._closed = True
        self._until = float("-inf")
        pool, self._pool, self._replica = self._pool, None, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), timeout=self._timeout)
            except TimeoutError:
                pool.terminate()


def _line(exc: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__
