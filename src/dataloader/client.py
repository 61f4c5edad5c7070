"""`dataloader.Client`: enqueue, read, list, cancel, retry and wait for jobs from any asyncio
code. The HTTP API and the CLI go through it too, so one set of rules applies everywhere.

    async with dataloader.Client.connect("postgresql://…/db") as client:
        job = await client.enqueue("etl.load_day", {"day": "2026-01-01"}, lock_key="day:1")
        state = await client.wait(job.job_id, timeout=600)
        print(state.status, state.result, state.duration_ms)

A client runs on its own pool (`Client.connect`), on an application's asyncpg pool
(`Client(pool=…)`) or SQLAlchemy `AsyncEngine` (`Client(engine=…)`, driver asyncpg), and
`enqueue(…, connection=…)` joins the caller's transaction: the job exists if and only if the
caller commits.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import copy
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import asyncpg
from pydantic import BaseModel

from dataloader import metrics
from dataloader.base import JobStatus
from dataloader.config import Settings, load_settings
from dataloader.core import limits
from dataloader.core.models import (
    EnqueueResult,
    JobDefaults,
    JobEvent,
    JobFilter,
    JobOptions,
    JobState,
    NewJob,
    QueueStats,
)
from dataloader.core.queues import QueueEvent, QueueLimits, QueueSettings, ThroughputPoint
from dataloader.core.routing import KnownTasks, check_route
from dataloader.exceptions import ConfigError, DatabaseUnavailable, InvalidJob, JobNotFound
from dataloader.health import MaintenanceState, SystemStatus, maintenance_state, system_status
from dataloader.logger.utils import mask_dsn
from dataloader.processes import Processes
from dataloader.storage import db
from dataloader.storage.admin import AdminStore, StatusCounts, read_counts, read_status
from dataloader.storage.connections import (
    CallerConnections,
    Connections,
    EngineConnections,
    GuardedPool,
    OnConnections,
    OutageReporting,
)
from dataloader.storage.maintenance import MaintenanceStore
from dataloader.storage.migrate import check_schema
from dataloader.storage.pooling import Pooling, probe
from dataloader.storage.presence import LiveWorker, PresenceStore, PublishedTask
from dataloader.storage.replica import OnPrimary, Reads, Replica
from dataloader.storage.repositories import (
    BulkResult,
    JobPage,
    JobRepository,
    enqueue,
    enqueue_many,
    listen_for_ended_jobs,
    stop_listening_for_ended_jobs,
)
from dataloader.tasks import Task, TaskRegistry
from dataloader.tasks import registry as default_registry

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

    from dataloader.storage.db import AnyConnection, Pool

    CallerConnection = AnyConnection | AsyncSession | AsyncConnection

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Channel on which the database announces that jobs ended (payload: their ids, comma-separated;
#: `queries.SET_JOB_STATES` sends it with every transition to a final status).
#: A waiter reads its job again at least this often, whatever it hears: a notification can be
#: missed while the listening connection is replaced.
WAIT_RECHECK_SEC: Final = 30.0
#: How long the client keeps listening for ended jobs after its last wait: a client that waits
#: again and again (a caller of processes, say) does not LISTEN and UNLISTEN for each wait.
LISTEN_LINGER_SEC: Final = 10.0
#: What a wait pending when its client closes raises.
CLOSED_MESSAGE: Final = "the client is closed"
#: How often `follow` reads a running job's journal and progress.
FOLLOW_POLL_SEC: Final = 0.5


@dataclasses.dataclass(frozen=True, slots=True)
class JobUpdate:
    """One update of `Client.follow`: a journal entry (`event`), a change of progress or the
    end (`state`: the job as it is then), or nothing for a while (`idle`)."""

    kind: Literal["event", "progress", "end", "idle"]
    event: JobEvent | None = None
    state: JobState | None = None


#: Clients kept per actor by `acting_as` (beyond this, the cache starts again).
MAX_ACTORS: Final = 256


class Client:
    """Producers' and readers' access to the queue.

    On one source of connections: `Client.connect(dsn)` opens a pool of its own (closed on
    exit); `Client(pool=…)` shares an application's asyncpg pool and `Client(engine=…)` a
    SQLAlchemy `AsyncEngine`'s (driver asyncpg), whatever JSON codecs their connections have
    (JSON travels as text). On an asyncpg pool a statement cut short (cancelled, timed out)
    closes its connection, which the pool replaces, rather than hand back a connection that may
    still be busy; give such a pool a `command_timeout`, so that no statement waits forever
    for a connection that went silent. While anyone `wait`s, one connection of the source
    LISTENs for ended jobs (the pool needs room for one more); it is given back 10 s after the
    last wait ends (LISTEN_LINGER_SEC: a client that waits again soon keeps it), or at `close`.
    Through a transaction pooler (PgBouncer `pool_mode=transaction`), where a LISTEN is lost
    with its transaction, give `listen_pool`: a pool reaching the same database straight,
    which that connection then comes from (`Client.connect(dsn, direct_dsn=…)` opens one).
    """

    def __init__(
        self,
        pool: Pool | None = None,
        engine: AsyncEngine | None = None,
        *,
        settings: Settings | None = None,
        registry: TaskRegistry | None = None,
        actor: str = "client",
        listen_pool: Pool | None = None,
    ) -> None:
        settings = settings if settings is not None else load_settings()
        # one place where a connection refused or lost becomes DatabaseUnavailable
        self._connections = OutageReporting(_connections(pool, engine, settings.db_timeout_sec))
        self.settings = settings
        self.registry = registry if registry is not None else default_registry
        self._repo = JobRepository(self._connections, actor, metrics.count_ended)
        self._admin = AdminStore(self._connections)
        #: Where the reads that may be stale run (see "reads that may be stale" below).
        self._reads: Reads = (
            OnPrimary(self._connections)
            if settings.db_read_dsn is None
            else Replica(
                settings.db_read_dsn,
                self._connections,
                max_lag_sec=settings.db_read_max_lag_sec,
                timeout=settings.db_timeout_sec,
            )
        )
        self._presence = PresenceStore(OnConnections(self._connections))
        self._maintenance = MaintenanceStore(OnConnections(self._connections))
        self._defaults = JobDefaults(
            max_attempts=settings.default_max_attempts,
            lease_ttl_sec=settings.default_lease_ttl_sec,
        )
        #: Each known task's options, computed once per task definition (see `_options_of`).
        self._task_options: dict[str, tuple[Task, JobOptions]] = {}
        self._unknown_task_options = JobOptions.of(None, self._defaults)
        listening = (
            self._connections
            if listen_pool is None
            else OutageReporting(_connections(listen_pool, None, settings.db_timeout_sec))
        )
        self._finished = _FinishedJobs(listening, settings.db_timeout_sec)
        self._owned_pool: Pool | None = None
        self._owned_listen_pool: Pool | None = None
        #: How the pool `connect` opened reaches the server (`none` for a given source).
        self.pooling = Pooling.none
        #: The client this one acts for (`acting_as`), which owns what they share.
        self._origin: Client | None = None
        self._actors: dict[str, Client] = {}
        #: Durable processes: start, call, repair, remove, read (`dataloader.processes`).
        self.processes = Processes(self)

    @property
    def actor(self) -> str:
        """Who this client's changes are recorded as done by (the journal's `by`)."""
        return self._repo.actor

    def acting_as(self, actor: str) -> Client:
        """This client, its changes recorded as done by `actor` (a person, a token's name, a
        program): triggers, cancels, retries, pauses and resumes name it in the job's journal
        or the queue's audit log. It shares this client's connections; closing it closes
        nothing."""
        actor = _name("actor", actor)
        origin = self._origin or self
        view = origin._actors.get(actor)
        if view is None:
            if len(origin._actors) >= MAX_ACTORS:
                origin._actors.clear()
            view = copy.copy(origin)
            view._repo = JobRepository(origin._connections, actor, metrics.count_ended)
            view._origin, view._owned_pool, view._owned_listen_pool = origin, None, None
            view._actors = {}
            view.processes = Processes(view)
            origin._actors[actor] = view
        return view if self._reads is origin._reads else view.exact()  # an exact() stays so

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        dsn: str,
        *,
        settings: Settings | None = None,
        registry: TaskRegistry | None = None,
        pool_size: int = 4,
        direct_dsn: str | None = None,
    ) -> AsyncIterator[Client]:
        """A client on a pool of its own to `dsn` (`postgresql://…`, or SQLAlchemy's
        `postgresql+asyncpg://…`), closed on exit. The schema must be there (`dataloader
        migrate`, or any dataloader service started against the database). A DSN that cannot
        be used raises one line naming it (the password masked): ValueError when it is
        malformed, DatabaseUnavailable when the server or the database cannot be reached or
        refuses us, DataloaderError when the schema is missing.

        Through a transaction pooler (found by a probe at connect), the pool keeps no
        prepared statements, and waits LISTEN on a connection of `direct_dsn` (default:
        `settings.db_direct_dsn`, DL_DB_DIRECT_DSN), which must then reach the same database
        straight: ConfigError without one."""
        settings = settings if settings is not None else load_settings()
        direct_dsn = direct_dsn if direct_dsn is not None else settings.db_direct_dsn
        pooling = await _probe(dsn, direct_dsn, settings.db_timeout_sec)
        cache = pooling is not Pooling.transaction
        pool = await _open_pool(dsn, max(2, pool_size), settings.db_timeout_sec, cache)
        listen_pool = None
        try:
            if not cache:
                assert direct_dsn is not None  # `_probe` refused to go on without it
                listen_pool = await _open_pool(direct_dsn, 2, settings.db_timeout_sec, True, 0)
            client = cls(pool, settings=settings, registry=registry, listen_pool=listen_pool)
        except BaseException:
            await pool.close()
            if listen_pool is not None:
                await listen_pool.close()
            raise
        client._owned_pool, client._owned_listen_pool = pool, listen_pool
        client.pooling = pooling
        async with client:
            yield client

    async def close(self) -> None:
        """Stop listening for ended jobs (a wait still pending raises RuntimeError); close the
        pool if `connect` opened it. (A client made by `acting_as` closes nothing.)"""
        if self._origin is not None:
            return
        try:
            try:
                await self._finished.close()
            finally:
                await self._reads.close()
        finally:
            try:
                if self._owned_listen_pool is not None:
                    await self._owned_listen_pool.close()
            finally:
                if self._owned_pool is not None:
                    await self._owned_pool.close()

    # producers -------------------------------------------------------------------------------

    def job(
        self,
        task: str | Task,
        args: dict[str, Any] | BaseModel | None = None,
        *,
        lock_key: str | None = None,
        queue: str | None = None,
        idempotency_key: str | None = None,
        partition_key: str = "",
        priority: int | None = None,
        available_at: datetime | timedelta | None = None,
        max_attempts: int | None = None,
        lease_ttl: int | timedelta | None = None,
        producer: str | None = None,
        consumer_group: str | None = None,
        rerun: bool = False,
    ) -> NewJob:
        """A new job, checked and with its defaults filled (see `enqueue`); for
        `enqueue_many`. InvalidJob or InvalidJobArgs name what is wrong."""
        known = task if isinstance(task, Task) else self.registry.get(task)
        filled = self._options_of(task if isinstance(task, str) else task.name, known)
        at, delay = _when(available_at)
        lease_ttl_sec = _lease_seconds(lease_ttl)
        new = NewJob(
            task=task.name if isinstance(task, Task) else task,
            args=args if args is not None else {},  # type: ignore[arg-type]
            lock_key=lock_key,
            queue=queue if queue is not None else filled.queue,
            idempotency_key=idempotency_key,
            partition_key=partition_key,
            priority=priority if priority is not None else filled.priority,
            available_at=at,
            delay=delay,
            max_attempts=max_attempts if max_attempts is not None else filled.max_attempts,
            lease_ttl_sec=lease_ttl_sec if lease_ttl_sec is not None else filled.lease_ttl_sec,
            producer=producer,
            consumer_group=consumer_group,
            rerun=rerun,
        )
        new.check_queue(filled)
        if known is not None:
            _check_own_queue(known, new.queue)
            known.check_args(new.args)
        return new

    async def enqueue(
        self,
        task: str | Task | NewJob,
        args: dict[str, Any] | BaseModel | None = None,
        *,
        lock_key: str | None = None,
        connection: CallerConnection | None = None,
        **options: Any,
    ) -> EnqueueResult:
        """Enqueue one job of `task` with `args` (a dict or the task's model), or one
        `NewJob` built beforehand.

        Jobs sharing a `lock_key` never run at the same time, on any replica (one entity's
        jobs, a table's loads). Without one the job excludes no other: it takes no lock, and
        waits for none.

        Options: queue, idempotency_key, partition_key, priority, available_at (a datetime,
        or a timedelta counted from the database's clock), max_attempts, lease_ttl, producer,
        consumer_group, and `rerun=True`: when the idempotency key already names a job, run it
        again with these args (a finished job now, a running one once more after it ends, a
        queued one with these args when its turn comes). Options left out come from the task's
        definition, then the settings (`DL_DEFAULT_MAX_ATTEMPTS`, `DL_DEFAULT_LEASE_TTL_SEC`).
        The same idempotency key with other fields raises IdempotencyConflict. With
        `connection` (an asyncpg connection, or a SQLAlchemy AsyncSession/AsyncConnection)
        the job is written in the caller's transaction (begun if it was not)."""
        if isinstance(task, NewJob):
            if args is not None or lock_key is not None or options:
                raise TypeError("enqueue(NewJob) takes no other job fields")
            new = task
            filled = self._options([new]).get(new.task)
        else:
            new, filled = self.job(task, args, lock_key=lock_key, **options), None
        async with self._writing_on(connection).connection() as conn:
            result = await enqueue(conn, new, actor=self._repo.actor, options=filled)
        _count_enqueued([new], [result], {new.task: filled} if filled else {})
        return result

    async def enqueue_many(
        self, jobs: Iterable[NewJob], *, connection: CallerConnection | None = None
    ) -> list[EnqueueResult]:
        """Enqueue many jobs in one statement (thousands at a time), results in input order.
        Each job's idempotency key works as in `enqueue` (a key repeated in the batch names
        the job its first occurrence created); a conflicting one writes nothing of the batch.
        Build the jobs with `client.job(…)` or `NewJob(…)`."""
        batch = list(jobs)
        options = self._options(batch)
        async with self._writing_on(connection).connection() as conn:
            results = await enqueue_many(conn, batch, actor=self._repo.actor, options=options)
        _count_enqueued(batch, results, options)
        return results

    def _writing_on(self, connection: CallerConnection | None) -> Connections:
        """Where an enqueue writes: the client's connections, or the caller's own (in its
        transaction); either way a refused or lost connection raises DatabaseUnavailable."""
        if connection is None:
            return self._connections
        return OutageReporting(CallerConnections(connection))

    def _options(self, jobs: builtins.list[NewJob]) -> dict[str, JobOptions]:
        """Each task's options for the jobs that leave some out, after checking every job
        (its args against its task's model; a queue named by it or its task). One lookup per
        task, and no copy of the jobs: a batch of thousands stays cheap."""
        options: dict[str, JobOptions] = {}
        tasks: dict[str, Task | None] = {}
        for job in jobs:
            if not isinstance(job, NewJob):
                raise TypeError(f"expected a NewJob (see Client.job), not {type(job).__name__}")
            name = job.task
            if name not in tasks:
                tasks[name] = task = self.registry.get(name)
                options[name] = self._options_of(name, task)
            task = tasks[name]
            if job.queue is None:
                job.check_queue(options[name])
            if task is not None:
                _check_own_queue(task, job.queue)
                task.check_args(job.args)
        return options

    def _options_of(self, name: str, task: Task | None) -> JobOptions:
        """The options that fill what jobs of task `name` leave out (`task`: its definition in
        this process, if any), remembered while that definition stays the same (only of known
        tasks: the names of unknown ones are the callers' to choose, without bound)."""
        if task is None:
            return self._unknown_task_options
        known = self._task_options.get(name)
        if known is None or known[0] is not task:
            known = self._task_options[name] = (task, JobOptions.of(task, self._defaults))
        return known[1]

    # reads that may be stale -------------------------------------------------------------
    #
    # The one place that decides which reads may come from a streaming standby
    # (DL_DB_READ_DSN, up to DL_DB_READ_MAX_LAG_SEC behind): those that show many jobs or
    # processes at once, to a person or a monitor, where a second's delay changes nothing:
    # `list`, `stats`, `throughput`, `status`'s counts, `processes.list`,
    # `processes.counts`. Everything else reads the primary, always: a job's (or process's)
    # own state and journal (its GET right after its trigger must find it), idempotency keys,
    # whatever a change reads before it writes (bulk cancel and retry, `settle`), the live
    # processes and maintenance (their liveness is timed), and the workers, which never read
    # through a client. `exact()` gives a view of the client whose reads are all the
    # primary's, for a caller whose decision depends on them.

    async def _stale(self, read: Callable[[Connections], Awaitable[T]]) -> T:
        """`read` on the connections of reads that may be stale (the standby, or the
        primary when it is unreachable or too far behind, or when none is set)."""
        return await self._reads.read(read)

    def exact(self) -> Client:
        """This client with every read on the primary (a read a decision depends on: whether
        a queue is known before it is paused, say). It shares this client's connections;
        closing it closes nothing."""
        if isinstance(self._reads, OnPrimary):
            return self
        view = copy.copy(self)
        view._reads = OnPrimary(self._connections)
        view._origin, view._owned_pool, view._actors = self._origin or self, None, {}
        view.processes = Processes(view)
        return view

    # readers ---------------------------------------------------------------------------------

    async def get(self, job_id: uuid.UUID | str) -> JobState | None:
        """The job's state (with its result, duration and worker), or None if there is none."""
        return await self._repo.get(_uuid(job_id))

    async def get_many(self, job_ids: Iterable[uuid.UUID | str]) -> dict[uuid.UUID, JobState]:
        """The states of several jobs in one read, by id (a job that does not exist is
        missing)."""
        return await self._repo.get_many([_uuid(job_id) for job_id in job_ids])

    async def stages(self, job_id: uuid.UUID | str, limit: int = 100) -> builtins.list[JobState]:
        """The jobs the successes of `job_id` enqueued as its next stages (a task's `then=`,
        `ctx.then`), oldest first, `limit` (1…1000) at most; a stage names its own parent
        (`dataloader.core.models.stage_parent` of its idempotency_key)."""
        return await self._repo.stages_of(_uuid(job_id), _limit(limit))

    async def find(self, idempotency_key: str) -> JobState | None:
        """The job holding `idempotency_key`, or None."""
        job_id = await self._repo.holder_of(idempotency_key)
        return None if job_id is None else await self._repo.get(job_id)

    async def args(self, job_id: uuid.UUID | str) -> tuple[Any, str | None]:
        """The job's args and its partition_key (None: it has none); JobNotFound if there is
        no such job."""
        found = await self._repo.args(_uuid(job_id))
        if found is None:
            raise JobNotFound(f"job {job_id} not found")
        return found

    async def list(
        self,
        *,
        queue: str | None = None,
        status: JobStatus | str | None = None,
        task: str | None = None,
        lock_key: str | None = None,
        partition_key: str | None = None,
        created_from: datetime | None = None,
        created_until: datetime | None = None,
        finished_from: datetime | None = None,
        finished_until: datetime | None = None,
        args: dict[str, Any] | str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> JobPage:
        """A page of jobs, newest first (by `created_at`), of those matching every filter
        given (`…_from` inclusive, `…_until` exclusive; `args`: a JSON object, or its text,
        that the job's args contain, e.g. `{"day": "2026-01-01"}`); pass `page.next_cursor` as
        `cursor` for the next page (None: this is the last). Pages follow each other by
        keyset: jobs enqueued meanwhile never shift them. ValueError for a limit outside
        1…1000, an unknown status, a time without an offset, args that are not a JSON object
        naming a key, or a cursor this list did not make. May be a little stale (read from
        DL_DB_READ_DSN when set: see `exact`)."""
        _limit(limit)
        where = JobFilter(
            queue=queue,
            status=None if status is None else _status(status),
            task=task,
            lock_key=lock_key,
            partition_key=partition_key,
            created_from=created_from,
            created_until=created_until,
            finished_from=finished_from,
            finished_until=finished_until,
            args=args,
        )
        return await self._stale(lambda on: JobRepository(on).list(where, limit, cursor))

    async def stats(self, queue: str | None = None) -> dict[str, QueueStats]:
        """Per-queue statistics: {queue: QueueStats} for every queue holding jobs that are
        queued, running, failed or lost; with `queue`, that queue only (zeros if it holds
        none). Reads only the jobs in those states: as cheap with millions of finished jobs
        in the table as with none. May be a little stale (DL_DB_READ_DSN)."""
        return await self._stale(lambda on: AdminStore(on).queue_stats(queue))

    # the system ------------------------------------------------------------------------------

    async def status(self) -> SystemStatus:
        """The whole system, as GET /status shows it: each queue's jobs, the live processes,
        who leads maintenance and how its chores last ran, the schedules, the queue table's
        health, and the warnings they call for. Its counts of jobs and processes may be a
        little stale (DL_DB_READ_DSN); the live processes and maintenance are the primary's."""

        async def counts(live: builtins.list[LiveWorker]) -> StatusCounts:
            return await self._stale(lambda on: read_counts(on, live))

        reading = await read_status(self._admin, self._presence, self._maintenance, counts)
        return system_status(reading, self.settings)

    async def throughput(
        self, *, span_sec: int = 3600, step_sec: int = 60, queue: str | None = None
    ) -> builtins.list[ThroughputPoint]:
        """Attempts ended per outcome (succeeded, failed, retried, canceled, lost) in each
        `step_sec` of the last `span_sec` seconds (a day at most: older counts are pruned),
        every queue together or `queue`'s; steps without any are left out. May be a little
        stale (DL_DB_READ_DSN)."""
        if not 10 <= step_sec <= span_sec <= 86_400:
            raise ValueError("throughput: 10 <= step_sec <= span_sec <= 86400")
        named = None if queue is None else _name("queue", queue)
        return await self._stale(
            lambda on: AdminStore(on).throughput_series(span_sec, step_sec, named)
        )

    async def workers(self) -> builtins.list[LiveWorker]:
        """The live worker processes: host, pid, version, the queues they serve with their
        slots, the tasks they know, when each was last seen."""
        return await self._presence.live_workers()

    async def maintenance(self) -> MaintenanceState:
        """Who leads maintenance, how the reaper, pruner and cron scheduler last ran, and
        each schedule's last slot."""
        return maintenance_state(
            await self._maintenance.leases(),
            await self._maintenance.runs(),
            await self._maintenance.cron_state(),
        )

    async def published_tasks(self) -> builtins.list[PublishedTask]:
        """Every task contract live processes publish, with the processes that publish it."""
        return await self._presence.live_task_specs()

    async def awaited_tasks(self) -> dict[str, builtins.list[str]]:
        """{task: its queues} for each task with queued jobs that no live process knows."""
        known = (await self._presence.known_tasks()).tasks()
        queued = await self._presence.queued_tasks()
        return {task: queues for task, queues in queued.items() if task not in known}

    async def known_tasks(self) -> KnownTasks:
        """The tasks live processes know, each with the queues its definitions name, and the
        queues live processes serve."""
        return await self._presence.known_tasks()

    async def events(
        self, job_id: uuid.UUID | str, *, after: int = 0, limit: int | None = None
    ) -> builtins.list[JobEvent]:
        """The job's journal, oldest first (empty if there is no such job): the entries after
        the one whose `event_id` is `after` (to read on from the last one seen), `limit` at
        most (None: all)."""
        _check_page(after, limit)
        return await self._repo.events(_uuid(job_id), after, limit)

    async def wait(self, job_id: uuid.UUID | str, timeout: float | None = None) -> JobState:
        """Return once the job has ended (succeeded, failed, canceled or lost), with its
        result. Woken by the database's notification, not by polling (the job is read again
        every WAIT_RECHECK_SEC all the same); TimeoutError after `timeout` seconds, JobNotFound
        if there is no such job, RuntimeError if the client is closed meanwhile."""
        job_id = _uuid(job_id)
        if self._finished.closed:
            raise RuntimeError(CLOSED_MESSAGE)
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                return await self._wait(job_id)
        except TimeoutError:
            if deadline.expired():  # not a TimeoutError of a statement
                raise TimeoutError(f"job {job_id} has not ended within {timeout} s") from None
            raise

    async def follow(
        self,
        job_id: uuid.UUID | str,
        *,
        after: int = 0,
        poll_sec: float = FOLLOW_POLL_SEC,
        idle_sec: float | None = None,
    ) -> AsyncIterator[JobUpdate]:
        """What happens to a job until it ends, as it happens: each new journal entry (after
        event `after`), each change of its progress, then its final state (the last update).
        The end is heard at once (LISTEN); the journal and progress are read every
        `poll_sec`. With `idle_sec`, an `idle` update comes after that long without one (to
        keep a connection alive). JobNotFound if there is no such job."""
        job_id = _uuid(job_id)
        _check_page(after, None)
        if self._finished.closed:
            raise RuntimeError(CLOSED_MESSAGE)
        # read before listening: a listener waits out an outage, a first read reports it
        if await self._repo.get(job_id) is None:
            raise JobNotFound(f"job {job_id} not found")
        progress: dict[str, Any] | None = None
        quiet_since = time.monotonic()
        async with self._finished.watch(job_id) as ended:
            while True:
                ended.clear()  # before reading: an end announced after the read wakes us
                state = await self._repo.get(job_id)
                if state is None:
                    raise JobNotFound(f"job {job_id} not found")
                updates = [
                    JobUpdate("event", event=e) for e in await self.events(job_id, after=after)
                ]
                if state.progress != progress:
                    progress = state.progress
                    updates.append(JobUpdate("progress", state=state))
                if state.finished:
                    updates.append(JobUpdate("end", state=state))
                for update in updates:
                    if update.event is not None:
                        after = update.event.event_id
                    yield update
                if state.finished:
                    return
                now = time.monotonic()
                if updates:
                    quiet_since = now
                elif idle_sec is not None and now - quiet_since >= idle_sec:
                    quiet_since = now
                    yield JobUpdate("idle")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ended.wait(), poll_sec)
                if self._finished.closed:
                    raise RuntimeError(CLOSED_MESSAGE)

    @contextlib.asynccontextmanager
    async def ends_of(self, job_id: uuid.UUID | str) -> AsyncIterator[asyncio.Event]:
        """An event set when the job may have ended (read it to know), heard on the one
        LISTEN connection this client shares between every wait; set too when that listening
        starts or starts again, as an end may have gone unheard before. For a view that
        follows a job and wants its end at once rather than at its next read."""
        async with self._finished.watch(_uuid(job_id), until_listening=False) as woken:
            yield woken

    async def _wait(self, job_id: uuid.UUID) -> JobState:
        return (await self._wait_heard(job_id))[0]

    async def _wait_heard(
        self, job_id: uuid.UUID, watching: asyncio.Event | None = None
    ) -> tuple[JobState, float | None]:
        """The job once ended, and how long it took from the notification of its end to the
        state in hand (None: it had ended before, or its end went unheard). `watching`: the
        event of a watch of `job_id` entered before the job was created (`_finished.watch`),
        so that nothing is read before its end is heard."""
        if watching is not None:
            return await self._wait_woken(job_id, watching, read_first=False)
        if not self._finished.listening:
            # a listener waits out an outage, a first read reports it; and no need to listen
            # for a job that has ended
            state = await self._ended(job_id)
            if state is not None:
                return state, None
        async with self._finished.watch(job_id) as woken:
            return await self._wait_woken(job_id, woken, read_first=True)

    async def _wait_woken(
        self, job_id: uuid.UUID, woken: asyncio.Event, *, read_first: bool
    ) -> tuple[JobState, float | None]:
        """Read the job each time `woken` is set (and every WAIT_RECHECK_SEC) until it has
        ended; first of all with `read_first`."""
        heard: float | None = None
        if not read_first:
            await self._woken(woken)
            heard = time.perf_counter() if woken.is_set() else None
        while True:
            woken.clear()  # before reading: an end announced after the read wakes us
            state = await self._ended(job_id)
            if state is not None:
                return state, None if heard is None else time.perf_counter() - heard
            await self._woken(woken)
            heard = time.perf_counter() if woken.is_set() else None

    async def _woken(self, woken: asyncio.Event) -> None:
        """Wait until `woken` is set or WAIT_RECHECK_SEC have passed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), WAIT_RECHECK_SEC)
        if self._finished.closed:
            raise RuntimeError(CLOSED_MESSAGE)

    async def _ended(self, job_id: uuid.UUID) -> JobState | None:
        """The job's state if it has ended, else None; JobNotFound if there is no such job."""
        state = await self._repo.get(job_id)
        if state is None:
            raise JobNotFound(f"job {job_id} not found")
        return state if state.finished else None

    # changes ---------------------------------------------------------------------------------

    async def cancel(self, job_id: uuid.UUID | str) -> JobState:
        """Cancel: a queued job ends `canceled` now; a running one is asked to stop (its task
        sees it at its next check); a finished job is left alone. The state after; JobNotFound
        if there is no such job."""
        return await self._repo.cancel(_uuid(job_id))

    async def retry(self, job_id: uuid.UUID | str) -> JobState:
        """Send a failed, lost or canceled job back to the queue with a fresh budget of
        attempts (journaled `retried`); its checkpoint stays, so it resumes. NotRetryable for
        a job in any other state, JobNotFound if there is none. The state after."""
        return await self._repo.retry(_uuid(job_id))

    # queues ----------------------------------------------------------------------------------

    async def pause(self, queue: str) -> QueueSettings:
        """Pause `queue`: from now on no worker of any process claims its jobs (those
        running finish; triggers are still accepted). Recorded in the queue's audit log with
        this client's actor; pausing a paused queue changes nothing. Its settings after."""
        return await self._admin.pause(_name("queue", queue), self.actor)

    async def resume(self, queue: str) -> QueueSettings:
        """Resume a paused `queue` and wake the workers that serve it (audited like
        `pause`); resuming a queue that is not paused changes nothing."""
        return await self._admin.resume(_name("queue", queue), self.actor)

    async def set_limits(
        self,
        queue: str,
        *,
        max_running: int | None = None,
        max_running_per_partition: int | None = None,
        max_per_second: float | None = None,
    ) -> QueueSettings:
        """Set `queue`'s limits, held across every replica (None: no such limit; all None
        removes them): jobs running at once in the queue, and per partition_key, and jobs
        started per second. Claims of a queue with limits take turns across replicas (a
        transaction-level advisory lock), so the limits hold exactly; a queue without limits
        costs nothing of this. Audited like `pause`; ValueError for a bad value."""
        wanted = QueueLimits(max_running, max_running_per_partition, max_per_second)
        return await self._admin.set_limits(_name("queue", queue), wanted, self.actor)

    async def queue_events(
        self, queue: str, *, after: int = 0, limit: int | None = None
    ) -> builtins.list[QueueEvent]:
        """The queue's audit log (who paused and resumed it), oldest first, after the entry
        whose `event_id` is `after`, `limit` entries at most (None: all)."""
        _check_page(after, limit)
        return await self._admin.queue_events(_name("queue", queue), after, limit)

    async def cancel_many(self, *, limit: int = 1000, **where: Any) -> BulkResult:
        """Cancel the jobs matching every filter given (those of `list`: queue, status, task,
        lock_key, partition_key, created_/finished_ ranges, args; at least one), newest first,
        up to `limit` (1…10,000) of them, each as `cancel` would. `BulkResult(matched, changed,
        more)`: `more` says that more jobs match; a filter on a status the change leaves
        (`status="queued"`) lets a next call go on where this one stopped."""
        return await self._repo.cancel_matching(_bulk_filter(where), _bulk_limit(limit))

    async def retry_many(self, *, limit: int = 1000, **where: Any) -> BulkResult:
        """Retry the failed, lost and canceled jobs among those matching every filter given
        (at least one; e.g. `status="failed", queue="etl"`), up to `limit` looked at; the
        others are skipped. As `cancel_many` otherwise."""
        return await self._repo.retry_matching(_bulk_filter(where), _bulk_limit(limit))

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _check_own_queue(task: Task, queue: str | None) -> None:
    """InvalidJob when `queue` is not the one `task` names (`core.routing`): its workers, its
    pause and its limits are there. The library knows only this process's definitions; it
    reads no live process at each enqueue (HTTP and `dataloader enqueue` do)."""
    if queue is not None:
        check_route(task.name, queue, KnownTasks({task.name: frozenset({task.queue})}))


def _connections(pool: object, engine: object, timeout: float) -> Connections:
    """The client's source of connections, from exactly one of `pool` and `engine`."""
    if pool is None and engine is None:
        raise TypeError(
            "Client needs pool= (an asyncpg pool) or engine= (a SQLAlchemy AsyncEngine);"
            " Client.connect(dsn) opens a pool of its own"
        )
    if pool is not None and engine is not None:
        raise TypeError("Client takes pool= or engine=, not both")
    if pool is None:
        return EngineConnections(engine)  # type: ignore[arg-type]  # checks what it is given
    if not isinstance(pool, asyncpg.Pool):
        hint = ""
        if isinstance(pool, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
            hint = " (to write in a connection's transaction, pass it to enqueue(…, connection=…))"
        elif type(pool).__module__.startswith("sqlalchemy"):
            hint = " (pass a SQLAlchemy AsyncEngine as engine=…)"
        raise TypeError(
            f"pool must be an asyncpg pool (asyncpg.create_pool), not {type(pool).__name__}{hint}"
        )
    return GuardedPool(pool, timeout)


@contextlib.contextmanager
def _explained(dsn: str) -> Iterator[None]:
    """A DSN that cannot be used: one line naming it (password masked)."""
    where = mask_dsn(dsn)
    try:
        yield
    except asyncpg.ClientConfigurationError as exc:  # before CONNECTION_ERRORS: an InterfaceError
        raise ValueError(f"not a usable PostgreSQL DSN ({where}): {_line(exc)}") from None
    except asyncpg.PostgresError as exc:  # no such database or role, wrong password …
        raise DatabaseUnavailable(f"cannot use {where}: {_line(exc)}") from None
    except db.CONNECTION_ERRORS as exc:
        raise DatabaseUnavailable(f"cannot connect to {where}: {_line(exc)}") from None


async def _probe(dsn: object, direct_dsn: str | None, timeout: float) -> Pooling:
    """How `dsn` reaches its server; ConfigError when it is transaction-pooled and there is
    no `direct_dsn` for the waits' LISTEN."""
    if not isinstance(dsn, str):
        raise TypeError(f"dsn must be a string, not {type(dsn).__name__}")
    with _explained(dsn):
        pooling = await probe(db.libpq_dsn(dsn), timeout)
    if pooling is Pooling.transaction and direct_dsn is None:
        raise ConfigError(
            f"{mask_dsn(dsn)} goes through a transaction pooler (PgBouncer"
            " pool_mode=transaction): give direct_dsn (DL_DB_DIRECT_DSN), a DSN straight to"
            " the server, for the LISTEN of waits"
        )
    return pooling


async def _open_pool(
    dsn: str, size: int, timeout: float, statement_cache: bool = True, min_size: int = 1
) -> Pool:
    """A pool of the client's own to `dsn`, on a database holding the current schema; one
    line naming the DSN (password masked) when that cannot be."""
    if not isinstance(dsn, str):
        raise TypeError(f"dsn must be a string, not {type(dsn).__name__}")
    where = mask_dsn(dsn)
    with _explained(dsn):
        pool = db.new_pool(
            db.libpq_dsn(dsn),
            size,
            "dataloader-client",
            timeout,
            statement_cache=statement_cache,
            min_size=min_size,
        )
        await pool
    try:
        async with pool.acquire(timeout=timeout) as conn:
            await check_schema(conn, where)
    except BaseException:
        await pool.close()
        raise
    return pool


def _line(exc: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__


class _FinishedJobs:
    """Wakes waiters when their job ends: one connection LISTENs while anyone waits, and is
    given back (UNLISTENed) once nobody has for LISTEN_LINGER_SEC. A connection lost meanwhile
    is replaced, and every waiter then reads its job again: an end may have gone unheard."""

    def __init__(self, connections: Connections, close_timeout: float) -> None:
        self._connections = connections
        self._close_timeout = close_timeout
        self._waiters: dict[uuid.UUID, set[asyncio.Event]] = {}
        #: Set while the LISTEN is active (and once closed, to release whoever waits for it).
        self._listening = asyncio.Event()
        #: Set while nobody waits (and once closed): the listener gives its connection back,
        #: unless someone comes to wait within LISTEN_LINGER_SEC.
        self._idle = asyncio.Event()
        #: Set when someone comes to wait (and once closed): ends the listener's lingering.
        self._wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.closed = False

    @contextlib.asynccontextmanager
    async def watch(
        self, job_id: uuid.UUID, *, until_listening: bool = True
    ) -> AsyncIterator[asyncio.Event]:
        """An event set when `job_id` may have ended; entered once the LISTEN is active, or
        at once without `until_listening` (the event is then set when the LISTEN starts, as
        an end may have gone unheard before)."""
        if self.closed:
            raise RuntimeError(CLOSED_MESSAGE)
        woken = asyncio.Event()
        self._waiters.setdefault(job_id, set()).add(woken)
        self._idle.clear()
        self._wanted.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen(), name="dataloader-client-listen")
        try:
            if until_listening:
                await self._listening.wait()
            if self.closed:
                raise RuntimeError(CLOSED_MESSAGE)
            yield woken
        finally:
            waiting = self._waiters.get(job_id)
            if waiting is not None:
                waiting.discard(woken)
                if not waiting:
                    del self._waiters[job_id]
            if not self._waiters:
                self._idle.set()

    @property
    def listening(self) -> bool:
        """Whether the LISTEN is active: a watch entered now hears every end from now on."""
        return self._listening.is_set() and not self.closed

    async def _listen(self) -> None:
        """LISTEN while anyone waits, on a new connection whenever one is lost."""
        delay = 0.1
        while self._waiters and not self.closed:
            try:
                await self._listen_once()
                delay = 0.1
            except Exception as exc:  # waiters still read their job every WAIT_RECHECK_SEC
                log.warning("listening for ended jobs failed: %s", _line(exc))
                with contextlib.suppress(TimeoutError):  # a pause, cut short by close
                    await asyncio.wait_for(self._idle.wait(), delay)
                delay = min(delay * 2, 5.0)

    async def _listen_once(self) -> None:
        """LISTEN on one connection until nobody waits (for LISTEN_LINGER_SEC) or the
        connection is lost."""
        lost = asyncio.Event()

        def on_lost(_conn: object) -> None:
            lost.set()

        async with self._connections.connection() as conn:
            # removed below: a pool keeps a connection's termination listeners across uses
            conn.add_termination_listener(on_lost)
            try:
                await listen_for_ended_jobs(conn, self._notified)
                try:
                    self._listening.set()
                    self._wake_all()  # anything may have ended while nobody listened
                    await self._until_unwanted(lost)
                finally:
                    if not self.closed:  # closing keeps it set: no wait may block on it
                        self._listening.clear()
                    if not _gone(conn):
                        await stop_listening_for_ended_jobs(conn, self._notified)
            finally:
                if not _gone(conn):
                    conn.remove_termination_listener(on_lost)

    async def _until_unwanted(self, lost: asyncio.Event) -> None:
        """Return once the connection is lost, the client closes, or nobody has waited for
        LISTEN_LINGER_SEC."""
        while True:
            await _either(self._idle, lost)
            if lost.is_set() or self.closed:
                return
            self._wanted.clear()
            if not self._waiters:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_either(self._wanted, lost), LISTEN_LINGER_SEC)
            if lost.is_set() or self.closed or not self._waiters:
                return

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        for text in str(payload).split(","):
            try:
                job_id = uuid.UUID(text)
            except ValueError:
                continue
            for woken in self._waiters.get(job_id, ()):
                woken.set()

    def _wake_all(self) -> None:
        for waiting in self._waiters.values():
            for woken in waiting:
                woken.set()

    async def close(self) -> None:
        """Give the listening connection back (cleanly: it may be an application's) and
        make every pending wait raise RuntimeError."""
        self.closed = True
        self._idle.set()
        self._wanted.set()
        self._listening.set()
        self._wake_all()
        task = self._task
        if task is None or task.done():
            return
        done, _ = await asyncio.wait({task}, timeout=self._close_timeout)
        if not done:  # stuck on an unanswered statement: cut it short
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _gone(conn: Any) -> bool:
    """Whether `conn` was lost (a failover, a restart, a terminated session): closed, or, a
    pool's connection, already taken back by its pool, which asyncpg does the moment the
    connection closes under it, so that every further call on it raises InterfaceError.
    Nothing is left to undo on such a connection."""
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:
        return True


async def _either(*events: asyncio.Event) -> None:
    """Return once any of `events` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _status(value: JobStatus | str) -> JobStatus:
    try:
        return JobStatus(value)
    except ValueError:
        known = ", ".join(s.value for s in JobStatus)
        raise ValueError(f"status must be one of {known}, not {value!r}") from None


def _when(value: object) -> tuple[datetime | None, timedelta | None]:
    """`available_at` as NewJob takes it: (an instant, None) or (None, a delay)."""
    if value is None or isinstance(value, datetime):
        return value, None
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise InvalidJob("available_at", f"a delay must be 0 or more, not {value}")
        return None, value
    raise InvalidJob(
        "available_at", f"must be a datetime or a timedelta, not {type(value).__name__}"
    )


def _count_enqueued(
    jobs: Iterable[NewJob], results: Iterable[EnqueueResult], options: dict[str, JobOptions]
) -> None:
    """Count the jobs an enqueue created (metrics), by queue and task: one increment of each
    counter per call, however many jobs it counts."""
    created: collections.Counter[tuple[str, str]] = collections.Counter()
    for job, result in zip(jobs, results, strict=True):
        if result.created:
            filled = options.get(job.task)
            queue = job.queue if job.queue is not None or filled is None else filled.queue
            created[queue or "", job.task] += 1
    for (queue, task), count in created.items():
        metrics.of(metrics.JOBS_ENQUEUED, queue, task).inc(count)


#: Jobs a cancel or retry by filter looks at, at most.
MAX_BULK = 10_000


def _bulk_filter(where: dict[str, Any]) -> JobFilter:
    """The filter of a bulk change; ValueError with none (that would be every job)."""
    given = {name: value for name, value in where.items() if value is not None}
    if not given:
        raise ValueError("give at least one filter (a change of every job is not offered)")
    try:
        return JobFilter(**given)
    except TypeError:
        unknown = sorted(set(given) - {f.name for f in dataclasses.fields(JobFilter)})
        raise ValueError(f"unknown filter: {', '.join(unknown)}") from None


def _bulk_limit(limit: int) -> int:
    return _limit(limit, MAX_BULK)


def _limit(limit: int, most: int = 1000) -> int:
    """`limit` if it is an integer from 1 to `most`; ValueError otherwise."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= most:
        raise ValueError(f"limit must be an integer between 1 and {most}, not {limit!r}")
    return limit


def _check_page(after: int, limit: int | None) -> None:
    """ValueError unless `after` is an integer and `limit` None or a positive integer."""
    for name, value in (("after", after), ("limit", limit)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{name} must be an integer, not {value!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")


def _name(argument: str, value: object) -> str:
    """`value` if it can be a name (of a queue, an actor); else ValueError naming
    `argument`."""
    try:
        return limits.check_name(value)
    except ValueError as exc:
        raise ValueError(f"{argument}: {exc}") from None


def _uuid(value: uuid.UUID | str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        raise JobNotFound(f"not a job id: {value!r}") from None


def _lease_seconds(value: int | timedelta | None) -> int | None:
    if value is None or not isinstance(value, timedelta):
        return value
    seconds = value.total_seconds()
    if not seconds.is_integer():
        raise InvalidJob("lease_ttl", f"must be whole seconds, not {seconds}")
    return int(seconds)
