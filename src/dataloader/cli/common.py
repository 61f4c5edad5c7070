"""What the commands share: settings, exit codes and one-line errors, the tasks' modules, and
(for the operators' commands) a client on the queue's database with every failure it can meet
turned into one line and an exit code."""

from __future__ import annotations

import asyncio
import importlib
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from enum import IntEnum
from typing import Annotated, Any, Final, NoReturn, TypeVar

import typer

from dataloader.client import Client
from dataloader.config import Settings, env_name, load_settings, unread_variables
from dataloader.context import resolve_dsn
from dataloader.core import limits
from dataloader.core.retry import MAX_DELAY_SEC
from dataloader.exceptions import (
    ConfigError,
    DatabaseUnavailable,
    DataloaderError,
    InvalidJob,
    InvalidJobArgs,
    JobNotFound,
    NotRetryable,
)
from dataloader.logger.utils import mask_text
from dataloader.storage import db
from dataloader.storage.connections import GuardedPool
from dataloader.storage.pooling import Pooling
from dataloader.tasks import TaskRegistry

#: Always registered: used by the README and the tests.
BUILTIN_PIPELINES = ("dataloader.workers.pipelines.demo",)

#: Who the operators' commands record as having acted (the journal's `by`, the queue audit
#: log's `actor`), unless `--as` names someone else.
CLI_ACTOR: Final = "cli"

#: How the operators' connections appear in `pg_stat_activity`.
APPLICATION_NAME: Final = "dataloader-cli"


class ExitCode(IntEnum):
    """What the exit status of a command means (documented in the README)."""

    OK = 0
    #: The request failed: no such job, a job that cannot be retried, a task no live process
    #: knows, a database without dataloader's schema (and every start-up failure of serve,
    #: worker and migrate, which predate the codes below).
    REQUEST = 1
    #: Bad input, refused before anything is written: a usage error (an unknown option, a
    #: missing argument), a value out of bounds (of an option, an argument, a job's field) or
    #: an invalid setting.
    USAGE = 2
    #: The database cannot be reached, or stopped answering.
    DATABASE = 3
    #: `enqueue --wait`, `watch`: the job ended failed, canceled or lost.
    JOB_NOT_SUCCEEDED = 4
    #: `enqueue --wait --timeout`: the job had not ended when the timeout ran out.
    STILL_RUNNING = 5
    #: Ctrl+C (128 + SIGINT, as shells report it).
    INTERRUPTED = 130
    #: SIGTERM (128 + SIGTERM), after the same clean-up as any other exit.
    TERMINATED = 143


JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print one JSON document on stdout (dates in ISO 8601) instead of tables.",
    ),
]
JobIdArgument = Annotated[str, typer.Argument(metavar="JOB_ID", help="The job's id.")]
HeartbeatsOption = Annotated[
    bool, typer.Option("--heartbeats", help="Show the journal's heartbeat entries too.")
]


def checked_name(value: str | None) -> str | None:
    """A name given as an argument or an option (a queue, an actor; its callback): refused
    as click refuses a bad value, naming the argument."""
    if value is None:
        return None
    try:
        return limits.check_name(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


ActorOption = Annotated[
    str,
    typer.Option(
        "--as",
        metavar="NAME",
        callback=checked_name,
        help="Who the job's journal or the queue's audit log names as having done it.",
    ),
]


def say(message: str) -> None:
    """One line on stderr, secrets masked: an error or a warning."""
    typer.echo(f"dataloader: {mask_text(message)}", err=True)


def fail(message: str, code: int) -> NoReturn:
    """End the command: one line on stderr (secrets masked) and exit `code`."""
    say(message)
    raise typer.Exit(code)


def seconds(value: float | None) -> float | None:
    """A length of time given in seconds (an option's callback): a finite number from 0 to
    MAX_DELAY_SEC (click's own range check lets NaN and infinity through)."""
    if value is not None and not 0 <= value <= MAX_DELAY_SEC:  # False for NaN
        raise typer.BadParameter(
            f"must be a number of seconds from 0 to {MAX_DELAY_SEC:,.0f} (ten years), not {value:g}"
        )
    return value


def load(**overrides: Any) -> Settings:
    """The settings; a bad value ends the command (exit 2) with one line naming it. A
    variable named like a setting that none reads gets a line of warning."""
    for warning in unread_variables():
        say(f"warning: {warning}")
    try:
        return load_settings(**overrides)
    except ConfigError as exc:
        fail(f"invalid configuration: {exc}", ExitCode.USAGE)


def operator_settings() -> Settings:
    """The settings of an operators' command. It serves no HTTP: the API's own settings (an
    open DL_HTTP_HOST without tokens) must not stop it."""
    return load(allow_unauthenticated=True)


def import_pipelines(modules: list[str]) -> None:
    """Import the modules that register pipelines; ConfigError names the culprit."""
    for module in (*BUILTIN_PIPELINES, *modules):
        try:
            importlib.import_module(module)
        except Exception as exc:  # any import-time failure is a configuration problem here
            raise ConfigError(
                f"DL_PIPELINE_MODULES: cannot import {module!r}: {type(exc).__name__}: {exc}"
            ) from None


def run(operation: Coroutine[Any, Any, int]) -> NoReturn:
    """Run an operators' command and exit with the code it returns. What it raises ends it
    with one line on stderr, never a traceback: an invalid setting (2), an unreachable or
    silent database (3), a refused request (1)."""
    try:
        code = asyncio.run(_unless_terminated(operation))
    except KeyboardInterrupt:
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    except _Terminated:
        raise typer.Exit(ExitCode.TERMINATED) from None
    except ConfigError as exc:
        fail(f"invalid configuration: {exc}", ExitCode.USAGE)
    except DatabaseUnavailable as exc:
        fail(str(exc), ExitCode.DATABASE)
    except db.CONNECTION_ERRORS as exc:  # lost (or silent) after the connection was made
        fail(f"the database stopped answering: {_line(exc)}", ExitCode.DATABASE)
    except (JobNotFound, NotRetryable) as exc:  # a request that names the wrong job
        fail(str(exc), ExitCode.REQUEST)
    except (InvalidJob, InvalidJobArgs, ValueError) as exc:  # bad input: nothing was written
        fail(_line(exc), ExitCode.USAGE)
    except DataloaderError as exc:  # the library's other refusals of a request
        fail(str(exc), ExitCode.REQUEST)
    raise typer.Exit(code)


class _Terminated(Exception):
    """The command was stopped by SIGTERM while it ran its operation."""


async def _unless_terminated(operation: Coroutine[Any, Any, int]) -> int:
    """Await `operation`, cancelled by SIGTERM: the loop takes the signal between callbacks,
    so the stack unwinds as after an error (connections closed, the embedded server let go).
    An exception raised by a signal handler while the loop is inside the database driver's
    compiled code could crash the process instead."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    terminated = asyncio.Event()

    def on_sigterm() -> None:
        terminated.set()
        main.cancel()

    outside = signal.getsignal(signal.SIGTERM)
    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        return await operation
    except asyncio.CancelledError:
        if terminated.is_set():
            raise _Terminated from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, outside)


def _line(exc: BaseException) -> str:
    """An exception's message on one line (its type when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__


async def queue_dsn(settings: Settings) -> str:
    """The queue's database: DL_DB_DSN, or the embedded server whose data lies under
    DL_DATA_DIR (as `migrate` finds it). Without either, ConfigError: an operators' command
    must not create an empty embedded server (initdb) only to find no job in it."""
    if settings.asyncpg_dsn is None and not (settings.data_dir / "pgdata").is_dir():
        raise ConfigError(
            f"{env_name('db_dsn')} is not set, and {env_name('data_dir')}"
            f" ({settings.data_dir}) holds no embedded server: set {env_name('db_dsn')} to"
            " the queue's database"
        )
    return await resolve_dsn(settings)


@asynccontextmanager
async def connected(
    settings: Settings, actor: str = CLI_ACTOR, registry: TaskRegistry | None = None
) -> AsyncIterator[Client]:
    """A client on the queue's database (every cluster's with DL_CLUSTERS), its changes
    recorded as done by `actor`."""
    async with _client(settings, await queue_dsn(settings), 4, registry) as client:
        yield client.acting_as(actor)


def _client(
    settings: Settings, dsn: str, pool_size: int, registry: TaskRegistry | None = None
) -> AbstractAsyncContextManager[Client]:
    """A client on `dsn`, or with DL_CLUSTERS over every cluster (`dsn` the default's)."""
    if not settings.clusters:
        return Client.connect(dsn, settings=settings, registry=registry, pool_size=pool_size)
    from dataloader.clusters import ClusterClient  # the workers' modules: only when needed

    with_dsn = settings.model_copy(update={"db_dsn": dsn})
    return ClusterClient.connect_all(with_dsn, registry=registry, pool_size=pool_size)


_Result = TypeVar("_Result")


async def acting(
    settings: Settings, actor: str, change: Callable[[Client], Awaitable[_Result]]
) -> _Result:
    """Make `change` (a cancel, a retry, a pause…) through a client acting as `actor`; what it
    returns."""
    async with connected(settings, actor) as client:
        return await change(client)


@asynccontextmanager
async def inspected(settings: Settings) -> AsyncIterator[tuple[Client, GuardedPool]]:
    """A client, and a pool for what the client does not read (maintenance's leases and
    runs, live processes, the queue table's health), opened once the client has found the
    database reachable and migrated."""
    dsn = await queue_dsn(settings)
    async with _client(settings, dsn, 2) as client:
        timeout = settings.db_timeout_sec
        pool = await db.create_pool(
            db.libpq_dsn(dsn),
            2,
            APPLICATION_NAME,
            timeout,
            statement_cache=client.pooling is not Pooling.transaction,
        )
        try:
            yield client.acting_as(CLI_ACTOR), GuardedPool(pool, timeout)
        finally:
            await pool.close()
