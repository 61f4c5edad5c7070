"""Connection hygiene: statements that cannot hang nor leave a bad connection behind, and the
server sessions of connections given up on, ended from a connection that works."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import asyncpg
from asyncpg import Record

from dataloader.exceptions import DatabaseUnavailable
from dataloader.storage import queries
from dataloader.storage.db import (
    CONNECTION_ERRORS,
    DEFAULT_TIMEOUT_SEC,
    AnyConnection,
    Connection,
    Pool,
)

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

log = logging.getLogger(__name__)


class Connections(Protocol):
    """Where the client's statements run: a source of asyncpg connections."""

    def connection(self) -> Any:
        """An async context manager giving an asyncpg connection for a few statements."""
        ...


class Queries(Protocol):
    """Statements run one at a time, each on a connection of its own: a `GuardedPool`, or
    `OnConnections` over a client's connections."""

    async def fetch(self, query: str, *args: Any) -> list[Record]: ...
    async def fetchrow(self, query: str, *args: Any) -> Record | None: ...
    async def fetchval(self, query: str, *args: Any) -> Any: ...
    async def execute(self, query: str, *args: Any) -> str: ...


class OnConnections:
    """`Queries` on `connections` (a client's: what it reads through stores written for a
    pool, with the client's connection hygiene and outage reporting)."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    async def fetch(self, query: str, *args: Any) -> list[Record]:
        async with self._connections.connection() as conn:
            return await conn.fetch(query, *args)  # type: ignore[no-any-return]

    async def fetchrow(self, query: str, *args: Any) -> Record | None:
        async with self._connections.connection() as conn:
            return await conn.fetchrow(query, *args)  # type: ignore[no-any-return]

    async def fetchval(self, query: str, *args: Any) -> Any:
        async with self._connections.connection() as conn:
            return await conn.fetchval(query, *args)

    async def execute(self, query: str, *args: Any) -> str:
        async with self._connections.connection() as conn:
            return await conn.execute(query, *args)  # type: ignore[no-any-return]


class OutageReporting:
    """Connections (`inner`'s) whose refusal or loss raises DatabaseUnavailable, one line, the
    driver's error as its cause, whatever statement was running: a connection refused, lost
    or gone silent (`CONNECTION_ERRORS`: a restarting server, a session terminated, a socket
    cut, a timeout). What the client's callers see, so that they tell an outage, worth
    retrying, from a mistake; the workers, which handle each connection error themselves, use
    their connections directly."""

    def __init__(self, inner: Connections) -> None:
        self._inner = inner

    def connection(self) -> _OutageReported:
        return _OutageReported(self._inner.connection())


def _unavailable(exc: BaseException) -> DatabaseUnavailable:
    message = " ".join(str(exc).split()) or type(exc).__name__
    return DatabaseUnavailable(f"database unavailable: {message}")


class _OutageReported:
    """`OutageReporting.connection`. A class rather than a generator (`asynccontextmanager`):
    it wraps every statement of the client, where a generator's frames cost about 1 % of the
    service's CPU per trigger."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def __aenter__(self) -> Any:
        try:
            return await self._inner.__aenter__()
        except CONNECTION_ERRORS as exc:
            raise _unavailable(exc) from exc

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # the connections wrapped (a pool's, a caller's) never swallow an exception
        try:
            await self._inner.__aexit__(kind, exc, tb)
        except CONNECTION_ERRORS as raised:
            raise _unavailable(raised) from raised
        if isinstance(exc, CONNECTION_ERRORS):
            raise _unavailable(exc) from exc


class GuardedPool:
    """A pool whose statements cannot hang nor leave a bad connection behind.

    Every statement waits at most `timeout` seconds for its connection, and for its answer the
    pool's command timeout (dataloader's pools have `timeout`; an application's pool given to
    the client has whatever its owner chose). A statement that timed out or was cancelled (a
    pipeline being stopped, a caller's own timeout) closes its connection at once, which the
    pool replaces: asyncpg would otherwise wait for the server to confirm the cancel before
    handing the connection back, which a half-open socket never does, and a stopped pipeline
    must stop now, not after that wait. Its server session, which outlives a half-open socket,
    is ended from the next connection (see `AbandonedSessions`). The client's listener, which
    holds a connection with no statement in flight, stops by itself and gives it back
    (UNLISTENed) rather than being cancelled.
    """

    def __init__(self, pool: Pool, timeout: float = DEFAULT_TIMEOUT_SEC) -> None:
        self._pool = pool
        self._timeout = timeout
        #: The pid each connection announced → the start of its server session, learnt on its
        #: first use (None: a pooler's connection, whose server session is never ours to end).
        self._sessions: dict[int, datetime | None] = {}
        self._abandoned = AbandonedSessions("pool")

    def connection(self) -> _GuardedConnection:
        """A pool connection, closed instead of reused if a statement was cut short."""
        return _GuardedConnection(self)

    async def _know_session(self, conn: PoolConnectionProxy[Record]) -> None:
        """Learn a new connection's session identity; end sessions given up on."""
        if conn.get_server_pid() not in self._sessions:
            if len(self._sessions) > 1000:  # forget connections the pool has long replaced
                self._sessions.clear()
            session = await own_session(conn)  # type: ignore[arg-type]
            self._sessions[conn.get_server_pid()] = None if session is None else session[1]
        if self._abandoned:
            await self._abandoned.end(conn, self._timeout)  # type: ignore[arg-type]

    async def fetch(self, query: str, *args: Any) -> list[Record]:
        async with self.connection() as conn:
            return await conn.fetch(query, *args)

    async def fetchrow(self, query: str, *args: Any) -> Record | None:
        async with self.connection() as conn:
            return await conn.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        async with self.connection() as conn:
            return await conn.fetchval(query, *args)

    async def execute(self, query: str, *args: Any) -> str:
        async with self.connection() as conn:
            return await conn.execute(query, *args)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AnyConnection]:
        """A pool connection in a transaction, committed when the block ends."""
        async with self.connection() as conn, conn.transaction():
            yield conn


@asynccontextmanager
async def atomic(conn: AnyConnection) -> AsyncIterator[AnyConnection]:
    """`conn` in a transaction, or in a savepoint when it is in the caller's transaction."""
    if not conn.is_in_transaction():
        async with conn.transaction():
            yield conn
        return
    # SQL savepoints rather than asyncpg's nested transaction, which refuses a transaction
    # begun by a plain BEGIN
    await conn.execute(queries.SAVEPOINT)
    try:
        yield conn
    except BaseException:
        if not conn.is_closed():
            await conn.execute(queries.ROLLBACK_TO_SAVEPOINT)
        raise
    await conn.execute(queries.RELEASE_SAVEPOINT)


async def session_identity(conn: Connection) -> tuple[int, datetime]:
    """(pid, backend_start) of the session behind `conn`."""
    row = await conn.fetchrow(queries.SESSION_IDENTITY)
    assert row is not None  # our own session is always in pg_stat_activity
    return row["pid"], row["backend_start"]


class _GuardedConnection:
    """`GuardedPool.connection`. A class rather than a generator (`asynccontextmanager`): it
    wraps every statement, where a generator's frames cost about 1 % of the service's CPU per
    trigger."""

    __slots__ = ("_conn", "_guarded")

    def __init__(self, guarded: GuardedPool) -> None:
        self._guarded = guarded

    async def __aenter__(self) -> PoolConnectionProxy[Record]:
        guarded = self._guarded
        self._conn = conn = await guarded._pool.acquire(timeout=guarded._timeout)
        try:
            await guarded._know_session(conn)
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return conn

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        guarded, conn = self._guarded, self._conn
        try:
            if isinstance(exc, asyncio.CancelledError | TimeoutError | asyncpg.InternalClientError):
                # its statement may still be in flight, on a socket that may be half-open (or
                # the driver lost track of it): close it, and end its session from the next
                # connection (if it is still there)
                started = guarded._sessions.pop(conn.get_server_pid(), None)
                if started is not None:
                    guarded._abandoned.add(conn.get_server_pid(), started)
                conn.terminate()
            elif isinstance(exc, asyncpg.ReadOnlySQLTransactionError):
                # its server became a standby (a switchover): drop the connection, so that the
                # pool's next one is made with the DSN's `target_session_attrs` and finds the
                # server that now takes writes
                conn.terminate()
        finally:
            await guarded._pool.release(conn, timeout=guarded._timeout)


async def own_session(conn: Connection) -> tuple[int, datetime] | None:
    """(pid, backend_start) of the server session behind `conn` if it is ours alone, None
    through a pooler. A pooler (PgBouncer) announces a pid of its own to each client, never the
    server's; the server connection behind it is shared (in turn, or transaction by
    transaction) and outlives ours: ending it would cut other clients' transactions, so a
    session reached through a pooler is never ended (the pooler closes a server connection
    whose client left mid-statement)."""
    pid, started = await session_identity(conn)
    return (pid, started) if pid == conn.get_server_pid() else None


async def end_session(conn: Connection, pid: int, backend_start: datetime) -> bool:
    """Terminate the session (pid, backend_start) if it still exists; whether it did."""
    return bool(
        await conn.fetchval(*queries.END_SESSION.bind(pid=pid, backend_start=backend_start))
    )


class AbandonedSessions:
    """Server sessions of ours given up on (no answer within the timeout: a half-open socket),
    to be ended from a connection that works. The server keeps such a session, with its locks
    and its connection slot, until TCP keepalive notices the silence, by default after hours.
    Sessions are matched on pid *and* start time, so a pid reused since is never touched."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._pending: set[tuple[int, datetime]] = set()

    def add(self, pid: int, backend_start: datetime) -> None:
        self._pending.add((pid, backend_start))

    def __bool__(self) -> bool:
        return bool(self._pending)

    async def end(self, conn: Connection, timeout: float) -> None:
        """End every pending session from `conn`. One the server refuses to end is logged and
        dropped; on a connection failure the rest stay pending for the next connection."""
        for pid, started in list(self._pending):
            try:
                ended = await asyncio.wait_for(end_session(conn, pid, started), timeout)
            except asyncpg.PostgresError as exc:  # e.g. a role not allowed to end sessions
                log.warning(
                    "could not end the abandoned %s session (pid %d): %s", self._label, pid, exc
                )
                ended = False
            self._pending.discard((pid, started))
            if ended:
                log.warning("ended the abandoned %s session (pid %d)", self._label, pid)


async def ping(conn: Connection) -> None:
    """Round trip on a dedicated connection; raises if it is dead."""
    await conn.fetchval(queries.PING)


class EngineConnections:
    """The asyncpg connections behind a SQLAlchemy `AsyncEngine` (driver asyncpg): a client
    built on an application's engine shares its pool. Statements run on the driver's
    connection, outside SQLAlchemy's transaction handling, each committing on its own; a
    statement cut short is cancelled by asyncpg, and SQLAlchemy's pool resets (or discards) the
    connection when it comes back, as it does for the application's own statements."""

    def __init__(self, engine: AsyncEngine) -> None:
        from sqlalchemy.ext.asyncio import AsyncEngine

        if not isinstance(engine, AsyncEngine):
            raise TypeError(
                "engine must be a SQLAlchemy AsyncEngine (create_async_engine"
                f"('postgresql+asyncpg://…')), not {type(engine).__name__}"
            )
        _require_asyncpg(engine.dialect.driver, "engine")
        self._engine = engine

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AnyConnection]:
        """The driver's connection of one of the engine's; one that died meanwhile (a
        terminated session, a restarted server) is discarded, not given back to the pool."""
        async with self._engine.connect() as sa_conn:
            raw = await sa_conn.get_raw_connection()
            driver: AnyConnection | None = raw.driver_connection
            assert driver is not None  # an open connection has its driver's
            try:
                yield driver
            finally:
                # SQLAlchemy learns that a connection died from the errors of its own
                # statements; ours run past it, so it would hand this one out again
                if driver.is_closed():
                    await sa_conn.invalidate()


class CallerConnections:
    """The caller's own connection (its transaction) as a source of connections: see
    `caller_connection`."""

    def __init__(self, connection: AnyConnection | AsyncSession | AsyncConnection) -> None:
        self._connection = connection

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AnyConnection]:
        yield await caller_connection(self._connection)


async def caller_connection(
    connection: AnyConnection | AsyncSession | AsyncConnection,
) -> AnyConnection:
    """The asyncpg connection to run statements on inside the caller's transaction: the
    connection itself, or the one behind a SQLAlchemy `AsyncSession` or `AsyncConnection`
    (driver asyncpg). SQLAlchemy begins its transaction with the first statement: if it has
    not sent BEGIN yet (a session or connection that ran nothing so far), a first statement
    is sent through SQLAlchemy, so that ours run inside that transaction and are committed or
    rolled back with it (a connection in AUTOCOMMIT commits each statement, ours too)."""
    if isinstance(connection, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
        return connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(connection, AsyncSession):
        if connection.bind is not None:  # refused before it opens a transaction
            _require_asyncpg(connection.bind.dialect.driver, "session")
        connection = await connection.connection()
    if not isinstance(connection, AsyncConnection):
        raise TypeError(
            "connection must be an asyncpg connection or a SQLAlchemy AsyncSession or"
            f" AsyncConnection, not {type(connection).__name__}"
        )
    _require_asyncpg(connection.dialect.driver, "connection")
    raw = await connection.get_raw_connection()
    driver: AnyConnection = raw.driver_connection  # type: ignore[assignment]
    if not driver.is_in_transaction():
        # begins SQLAlchemy's transaction if it has none yet (as any statement would), and
        # makes it send its BEGIN: without one, ours would commit on their own
        await connection.exec_driver_sql(queries.PING)
    return driver


def _require_asyncpg(driver: str, what: str) -> None:
    if driver != "asyncpg":
        raise TypeError(
            f"the {what}'s driver is {driver!r}: dataloader needs asyncpg (postgresql+asyncpg://…)"
        )
