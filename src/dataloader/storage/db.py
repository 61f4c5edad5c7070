"""Connections: the asyncpg pool and dedicated connections of the queue, and the SQLAlchemy
async engine/sessionmaker the AppContext offers to pipelines (on the queue's database too)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TypeAlias

import asyncpg
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

if TYPE_CHECKING:  # asyncpg's classes are generic only in its type stubs
    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record]
    Pool: TypeAlias = asyncpg.Pool[asyncpg.Record]
    #: A plain connection or one acquired from a pool.
    AnyConnection: TypeAlias = (
        asyncpg.Connection[asyncpg.Record] | asyncpg.pool.PoolConnectionProxy[asyncpg.Record]
    )
else:
    Connection = asyncpg.Connection
    Pool = asyncpg.Pool
    AnyConnection = asyncpg.Connection

#: Errors that mean "the database or the connection is gone", as opposed to a bad statement.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
    # asyncpg's protocol left in a bad state by a connection cut mid-statement ("cannot switch
    # to state …"): that connection is unusable, another one works
    asyncpg.InternalClientError,
    TimeoutError,
    # a server that no longer takes writes: a primary demoted to standby under a connection
    # (a switchover); a new connection reaches the new primary (`target_session_attrs`)
    asyncpg.ReadOnlySQLTransactionError,
)


#: Default of DL_DB_TIMEOUT_SEC: the longest wait for an answer to one of our statements.
DEFAULT_TIMEOUT_SEC = 10.0


def storable_text(text: str) -> str:
    """`text` as PostgreSQL can store it: NUL and lone surrogates written as escapes."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


async def _init_connection(conn: Connection) -> None:
    """jsonb in and out as Python objects (asyncpg's default is text)."""
    for type_name in ("json", "jsonb"):
        await conn.set_type_codec(
            type_name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )


async def _skip_reset(conn: Connection) -> None:
    """Released pool connections skip asyncpg's reset query (`pg_advisory_unlock_all(); CLOSE
    ALL; UNLISTEN *; RESET ALL`): a round trip per statement, for state our statements never
    leave. asyncpg still ends any open transaction first."""


#: asyncpg's default number of prepared statements kept per connection.
STATEMENT_CACHE_SIZE = 100
#: The longest statement asyncpg keeps prepared (its default, 15 KiB, would leave the finish of
#: a durable process's step out: sent unnamed, it was parsed and planned again at every call,
#: 2-3 ms of the server's time each). Every statement of `storage` fits (a test checks).
MAX_CACHEABLE_STATEMENT_BYTES = 64 * 1024


def _cache_size(statement_cache: bool) -> int:
    """Named prepared statements outlive a transaction: through a transaction pooler the next
    statement may land on a server connection that never prepared them (PgBouncer 1.18 does
    not track them). Without the cache asyncpg uses the unnamed statement, sent with each
    query."""
    return STATEMENT_CACHE_SIZE if statement_cache else 0


async def connect(
    dsn: str, application_name: str, timeout: float = 10.0, *, statement_cache: bool = True
) -> Connection:
    """A dedicated connection (listener, lock holder, migrations); `statement_cache=False`
    through a transaction pooler."""
    conn: Connection = await asyncpg.connect(
        dsn,
        timeout=timeout,
        statement_cache_size=_cache_size(statement_cache),
        max_cacheable_statement_size=MAX_CACHEABLE_STATEMENT_BYTES,
        server_settings={"application_name": application_name},
    )
    await _init_connection(conn)
    return conn


def new_pool(
    dsn: str,
    size: int,
    application_name: str,
    timeout: float = DEFAULT_TIMEOUT_SEC,
    *,
    statement_cache: bool = True,
    min_size: int = 1,
) -> Pool:
    """A pool for the queue's short statements, opened by `await pool`. Its connections must
    not be left with session state (session advisory locks, LISTEN, SET): they are not reset.
    `statement_cache=False` through a transaction pooler. `min_size=0`: no connection kept
    open, nor reopened in the background while the server is away."""
    pool: Pool = asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=size,
        init=_init_connection,
        reset=_skip_reset,
        timeout=10.0,
        # No queue statement takes long; one that hangs (a half-open socket) must fail.
        command_timeout=timeout,
        statement_cache_size=_cache_size(statement_cache),
        max_cacheable_statement_size=MAX_CACHEABLE_STATEMENT_BYTES,
        server_settings={"application_name": application_name},
    )
    return pool


async def create_pool(
    dsn: str,
    size: int,
    application_name: str,
    timeout: float = DEFAULT_TIMEOUT_SEC,
    *,
    statement_cache: bool = True,
    min_size: int = 1,
) -> Pool:
    """The pool behind the API (and what pipelines are given), open."""
    pool = new_pool(
        dsn, size, application_name, timeout, statement_cache=statement_cache, min_size=min_size
    )
    await pool
    return pool


def libpq_dsn(dsn: str) -> str:
    """asyncpg's spelling of a DSN (SQLAlchemy's `postgresql+asyncpg://` is accepted too)."""
    scheme, rest = dsn.split("://", 1) if "://" in dsn else ("postgresql", dsn)
    return f"postgresql://{rest}" if scheme.startswith("postgresql+") else dsn


def create_engine(dsn: str, **kwargs: Any) -> AsyncEngine:
    """The AppContext's async engine on `dsn` (libpq or SQLAlchemy spelling); it connects
    lazily, so an unused engine costs no connection.

    asyncpg reads the DSN itself, exactly as for the queue's connections: SQLAlchemy would
    pass each query parameter to asyncpg as a keyword, and libpq's (`sslmode=require`,
    `application_name=…`, `connect_timeout=…`) are not asyncpg's keywords."""
    libpq = libpq_dsn(dsn)

    async def connect() -> Any:
        return await asyncpg.connect(libpq)

    return create_async_engine(
        "postgresql+asyncpg://", async_creator=connect, pool_pre_ping=True, **kwargs
    )


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions of `engine`, for pipelines writing to tables beside the queue."""
    return async_sessionmaker(engine, expire_on_commit=False)
