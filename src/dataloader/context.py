"""AppContext: opens and closes every resource of the process in one ordered place: the
embedded PostgreSQL (when `DL_DB_DSN` is unset), migrations, the asyncpg pool of the queue,
the client, a SQLAlchemy async engine/sessionmaker offered to tasks (on `DL_TARGET_DSN`, or
the queue's database), and what the user's startup hook builds."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from dataloader.config import Settings
from dataloader.exceptions import ConfigError, DatabaseUnavailable, DataloaderError
from dataloader.logger.utils import mask_dsn
from dataloader.storage import db, queries
from dataloader.storage.admin import AdminStore
from dataloader.storage.connections import GuardedPool
from dataloader.storage.embedded import start_embedded
from dataloader.storage.migrate import MigrationReport, check_schema, migrate
from dataloader.storage.pooling import Pooling, probe

if TYPE_CHECKING:
    from dataloader.client import Client
    from dataloader.tasks import TaskRegistry

log = logging.getLogger(__name__)


#: The oldest PostgreSQL dataloader runs on (`gen_random_uuid()` is built in from 13 on).
MIN_SERVER_VERSION = 13


async def resolve_dsn(settings: Settings) -> str:
    """`DL_DB_DSN`, or the embedded server's DSN (started on demand)."""
    if settings.asyncpg_dsn is not None:
        return settings.asyncpg_dsn
    return await asyncio.to_thread(start_embedded, settings.data_dir)


#: The variable naming the queue's database, the one naming the tasks' database, and the one
#: naming the queue's database straight (past a transaction pooler).
QUEUE_DSN_VARIABLE = "DL_DB_DSN"
TARGET_DSN_VARIABLE = "DL_TARGET_DSN"
DIRECT_DSN_VARIABLE = "DL_DB_DIRECT_DSN"

#: Longest wait for the probe of a DSN's pooling (two connections, a few short statements).
PROBE_TIMEOUT_SEC = 10.0


@dataclass(frozen=True, slots=True)
class Routes:
    """Where the queue's connections go. `dsn`: the pools of short statements (DL_DB_DSN, a
    pooler's maybe); `session_dsn`: what needs a server session of its own for longer than a
    transaction (the lock holder's session advisory locks, LISTEN, the migration lock):
    DL_DB_DIRECT_DSN when set, else `dsn`; `pooling`: how `dsn` reaches the server."""

    dsn: str
    session_dsn: str
    pooling: Pooling = Pooling.none

    @property
    def statement_cache(self) -> bool:
        """Whether connections to `dsn` may keep named prepared statements."""
        return self.pooling is not Pooling.transaction

    @property
    def split(self) -> bool:
        """Whether session-bound needs go elsewhere than the pools."""
        return self.session_dsn != self.dsn


async def _probe(dsn: str, variable: str) -> Pooling:
    """The pooling of `dsn`, a failure to reach it one line naming `variable`."""
    with _explained(dsn, variable):
        return await probe(dsn, PROBE_TIMEOUT_SEC)


async def resolve_routes(settings: Settings, dsn: str) -> Routes:
    """Where the queue's connections go, for the queue's DSN `dsn` (resolved: the embedded
    server's when DL_DB_DSN is unset). ConfigError, one line naming both variables, when
    `dsn` goes through a transaction pooler and DL_DB_DIRECT_DSN is unset (session advisory
    locks, LISTEN and the migration lock would land on server connections lent to others),
    or when DL_DB_DIRECT_DSN is transaction-pooled too or reaches another database."""
    if settings.asyncpg_dsn is None:  # the embedded server: a socket of its own, no pooler
        return Routes(dsn, dsn)
    pooling = await _probe(dsn, QUEUE_DSN_VARIABLE)
    direct = None if settings.db_direct_dsn is None else db.libpq_dsn(settings.db_direct_dsn)
    if direct is None:
        if pooling is Pooling.transaction:
            raise ConfigError(
                f"{QUEUE_DSN_VARIABLE} ({mask_dsn(dsn)}) goes through a transaction pooler"
                f" (PgBouncer pool_mode=transaction): set {DIRECT_DSN_VARIABLE} to a DSN"
                " straight to the server, for what needs a session of its own (the locks of"
                " lock_keys, LISTEN, migrations)"
            )
        return Routes(dsn, dsn, pooling)
    if await _probe(direct, DIRECT_DSN_VARIABLE) is Pooling.transaction:
        raise ConfigError(
            f"{DIRECT_DSN_VARIABLE} ({mask_dsn(direct)}) goes through a transaction pooler"
            f" too: it must reach the server straight (or through a session pooler)"
        )
    await _check_same_database(dsn, direct)
    return Routes(dsn, direct, pooling)


async def _check_same_database(dsn: str, direct: str) -> None:
    """DL_DB_DIRECT_DSN must reach DL_DB_DSN's database: locks, wake-ups and migrations
    elsewhere would guard nothing."""
    identities = []
    for url, variable in ((dsn, QUEUE_DSN_VARIABLE), (direct, DIRECT_DSN_VARIABLE)):
        with _explained(url, variable):
            conn = await db.connect(url, "dataloader-check", statement_cache=False)
            try:
                identities.append(await conn.fetchrow(queries.DATABASE_IDENTITY))
            finally:
                await conn.close()
    ours, direct_one = identities
    _refuse_another_database(
        ours,
        direct_one,
        lambda our_database, theirs, where: (
            f"{DIRECT_DSN_VARIABLE} ({mask_dsn(direct)}) reaches database"
            f" {theirs!r}{where}, {QUEUE_DSN_VARIABLE} ({mask_dsn(dsn)}) database"
            f" {our_database!r}: both must reach the same database"
        ),
    )


def _refuse_another_database(
    ours: asyncpg.Record | None,
    theirs: asyncpg.Record | None,
    message: Callable[[str, str, str], str],
) -> None:
    """ConfigError (`message(our database, theirs, " on another server" or "")`) unless both
    identities (`queries.DATABASE_IDENTITY`) are one database."""
    assert ours is not None  # a SELECT without FROM returns its row
    assert theirs is not None
    if tuple(ours) != tuple(theirs):
        where = "" if ours["database"] != theirs["database"] else " on another server"
        raise ConfigError(message(ours["database"], theirs["database"], where))


#: How long closing a pool may wait for connections still in use before they are cut.
POOL_CLOSE_SEC = 10.0


@contextmanager
def _explained(dsn: str, variable: str = QUEUE_DSN_VARIABLE) -> Iterator[None]:
    """Turn what a user's database setup can do wrong into one line naming `variable` (the
    password masked); anything else stays a bug with its traceback."""
    where = mask_dsn(dsn)
    try:
        yield
    except (
        asyncpg.InvalidCatalogNameError,  # no such database
        asyncpg.InvalidAuthorizationSpecificationError,  # no such role, wrong password
    ) as exc:
        raise DatabaseUnavailable(f"{variable} ({where}): {exc}") from None
    except asyncpg.InsufficientPrivilegeError as exc:
        if variable != QUEUE_DSN_VARIABLE:  # only the queue's tables are dataloader's to create
            raise DatabaseUnavailable(f"{variable} ({where}): {exc}") from None
        raise DataloaderError(
            f"{variable} ({where}): {exc}: the user must be allowed to create and change"
            " dataloader's tables; grant it CREATE on the schema, or run `dataloader migrate`"
            " once as a user who may"
        ) from None
    except asyncpg.ReadOnlySQLTransactionError as exc:
        raise DataloaderError(
            f"{variable} ({where}): {exc}: the database is read-only (a standby?);"
            " dataloader writes to it, so name the primary"
        ) from None
    except db.CONNECTION_ERRORS as exc:
        raise DatabaseUnavailable(f"{variable}: cannot connect to {where}: {exc}") from None


async def _connect(dsn: str, application_name: str) -> db.Connection:
    """A dedicated connection to a server dataloader can run on."""
    with _explained(dsn):
        conn = await db.connect(dsn, application_name)
    if conn.get_server_version().major < MIN_SERVER_VERSION:
        announced = conn.get_settings().server_version
        await conn.close()
        raise DataloaderError(
            f"DL_DB_DSN ({mask_dsn(dsn)}): PostgreSQL {announced} is too old:"
            f" dataloader needs {MIN_SERVER_VERSION} or later"
        )
    return conn


async def check_database(dsn: str, *, migrated: bool = False) -> str:
    """Connect once: the database exists, lets us in, runs a recent enough PostgreSQL and,
    with `migrated` (when DL_AUTO_MIGRATE is off), holds dataloader's whole schema. Returns
    the server's version (`server_version`, e.g. "18.4")."""
    conn = await _connect(dsn, "dataloader-check")
    try:
        version: str = conn.get_settings().server_version
        if migrated:
            where = f"{QUEUE_DSN_VARIABLE} ({mask_dsn(dsn)}), with DL_AUTO_MIGRATE=false,"
            await check_schema(conn, where)
    finally:
        await conn.close()
    return version


async def check_target(dsn: str) -> str:
    """Connect once to the tasks' database (`DL_TARGET_DSN`): it exists and lets us in, so a
    mistake there stops the start instead of failing every job that uses `ctx.engine`.
    Returns the database's name."""
    libpq = db.libpq_dsn(dsn)
    with _explained(libpq, TARGET_DSN_VARIABLE):
        conn = await db.connect(libpq, "dataloader-check")
        try:
            identity = await conn.fetchrow(queries.DATABASE_IDENTITY)
        finally:
            await conn.close()
    assert identity is not None  # a SELECT without FROM returns its row
    name: str = identity["database"]
    return name


async def _check_shared_pool(pool: db.Pool, dsn: str) -> None:
    """A pool given to `Runner(pool=…)` must reach the database the workers connect to
    (`settings.db_dsn`): jobs enqueued through it would otherwise never be claimed."""
    conn = await _connect(dsn, "dataloader-check")
    try:
        ours = await conn.fetchrow(queries.DATABASE_IDENTITY)
    finally:
        await conn.close()
    theirs = await pool.fetchrow(queries.DATABASE_IDENTITY)
    _refuse_another_database(
        ours,
        theirs,
        lambda our_database, theirs, where: (
            f"Runner(pool=…): the pool reaches database {theirs!r},"
            f" settings.db_dsn ({mask_dsn(dsn)}) database {our_database!r}{where}:"
            " the pool and db_dsn must reach the same database"
        ),
    )


async def _close_pool(pool: db.Pool) -> None:
    """Close `pool`, waiting for connections in use at most POOL_CLOSE_SEC, then cutting
    them: a stuck statement must not keep the process from ending."""
    try:
        await asyncio.wait_for(pool.close(), timeout=POOL_CLOSE_SEC)
    except TimeoutError:
        log.warning("connections still in use after %.0fs: closing them", POOL_CLOSE_SEC)
        pool.terminate()


async def run_migrations(dsn: str) -> MigrationReport:
    """Apply pending migrations on a dedicated connection."""
    conn = await _connect(dsn, "dataloader-migrate")
    try:
        with _explained(dsn):
            return await migrate(conn)
    finally:
        await conn.close()


#: A startup hook: builds what tasks need (clients, caches …) once per process; it gets the
#: AppContext and may return an async context manager (closed at shutdown) or a plain value.
StartupHook = Callable[["AppContext"], Awaitable[Any] | AbstractAsyncContextManager[Any]]


@dataclass(eq=False)
class AppContext:
    """Resources shared by the API, the workers and tasks (as `ctx.app`).

    * `pool`: the queue's asyncpg pool (its connections are not reset between uses: leave no
      session state on them); a pool given to `Runner(pool=…)` is used as it is;
    * `client`: enqueue, read, cancel, retry and wait for jobs (`dataloader.Client`);
    * `engine`, `sessionmaker`: SQLAlchemy async engine and sessions for tasks, on
      `DL_TARGET_DSN` (the database they load into), or the queue's database when unset (the
      engine connects lazily: unused, it costs no connection);
    * `resources`: what the startup hook built (None without one);
    * `dsn`: the queue's DSN (with its password, if it has one: never log it as it is);
    * `routes`: where the queue's connections go (`dsn` for the pools; DL_DB_DIRECT_DSN, when
      set, for what needs a session of its own) and whether `dsn` is pooled.
    """

    settings: Settings
    dsn: str
    pool: db.Pool
    engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]
    client: Client
    admin: AdminStore
    routes: Routes
    resources: Any = None
    _owns_pool: bool = True
    #: The direct pool the client's waits LISTEN on, through a transaction pooler.
    _listen_pool: db.Pool | None = None
    _cleanup: AsyncExitStack | None = None
    _closed: bool = False

    @classmethod
    async def open(
        cls,
        settings: Settings,
        registry: TaskRegistry | None = None,
        *,
        pool: db.Pool | None = None,
        startup: StartupHook | None = None,
    ) -> AppContext:
        """Connect (starting the embedded server if needed), migrate when configured, and run
        the startup hook. With `pool`, the queue's statements and tasks share that pool (its
        owner closes it; it must reach the database of `settings.db_dsn`); the workers still
        open their own connections to `dsn`. Whatever fails, nothing opened here stays open."""
        dsn = await resolve_dsn(settings)
        routes = await resolve_routes(settings, dsn)
        if settings.auto_migrate:
            report = await run_migrations(routes.session_dsn)
            log.info("schema at version %d", report.current)
        else:
            await check_database(routes.session_dsn, migrated=True)
        owns_pool = pool is None
        if pool is None:
            with _explained(dsn):
                pool = await db.create_pool(
                    dsn,
                    settings.db_pool_size,
                    "dataloader",
                    settings.db_timeout_sec,
                    statement_cache=routes.statement_cache,
                )
        else:
            await _check_shared_pool(pool, routes.session_dsn)
        # through a transaction pooler, the client's waits LISTEN on a session of their own:
        # a pool of the direct DSN, opening its connection when a wait first needs it
        listen_pool = None
        if routes.pooling is Pooling.transaction:
            listen_pool = db.new_pool(
                routes.session_dsn, 2, "dataloader-listen", settings.db_timeout_sec, min_size=0
            )
            await listen_pool
        try:
            context = cls._assemble(settings, registry, routes, pool, owns_pool, listen_pool)
        except BaseException:
            if owns_pool:
                await _close_pool(pool)
            if listen_pool is not None:
                await _close_pool(listen_pool)
            raise
        if startup is not None:
            try:
                await context._start(startup)
            except BaseException:
                await context.close()
                raise
        return context

    @classmethod
    def _assemble(
        cls,
        settings: Settings,
        registry: TaskRegistry | None,
        routes: Routes,
        pool: db.Pool,
        owns_pool: bool,
        listen_pool: db.Pool | None = None,
    ) -> AppContext:
        """The context around open pools (nothing here connects yet)."""
        from dataloader.client import Client

        # SQLAlchemy's asyncpg dialect prepares named statements, which a transaction pooler
        # loses between transactions: its engine on the queue's database connects straight
        engine_dsn = routes.dsn if routes.statement_cache else routes.session_dsn
        engine = db.create_engine(settings.target_dsn or engine_dsn)
        return cls(
            settings=settings,
            dsn=routes.dsn,
            pool=pool,
            engine=engine,
            sessionmaker=db.create_sessionmaker(engine),
            client=Client(pool, settings=settings, registry=registry, listen_pool=listen_pool),
            admin=AdminStore(GuardedPool(pool, settings.db_timeout_sec)),
            routes=routes,
            _owns_pool=owns_pool,
            _listen_pool=listen_pool,
        )

    async def _start(self, startup: StartupHook) -> None:
        """Run the startup hook: an async context manager is entered (and exited by `close`),
        an awaitable awaited; either gives `resources`."""
        self._cleanup = AsyncExitStack()
        made = startup(self)
        if isinstance(made, AbstractAsyncContextManager):
            self.resources = await self._cleanup.enter_async_context(made)
        elif inspect.isawaitable(made):
            self.resources = await made
        else:
            raise TypeError(
                "the startup hook must return an awaitable or an async context manager"
                f" (an `async def` function, or one decorated with @asynccontextmanager),"
                f" not {type(made).__name__}"
            )

    async def close(self) -> None:
        """Close, in this order: what the startup hook opened (it may still use the rest),
        the client (its listening task), the engine, and the pool if this context opened it
        (a shared pool is its owner's to close). Every step runs even if one before it fails;
        closing again does nothing. The embedded server stops when the process exits."""
        if self._closed:
            return
        self._closed = True
        async with AsyncExitStack() as closing:  # callbacks run last-pushed first
            if self._owns_pool:
                closing.push_async_callback(_close_pool, self.pool)
            if self._listen_pool is not None:
                closing.push_async_callback(_close_pool, self._listen_pool)
            closing.push_async_callback(self.engine.dispose)
            closing.push_async_callback(self.client.close)
            if self._cleanup is not None:
                closing.push_async_callback(self._cleanup.aclose)
