"""Typed operations on the queue; each runs one named statement from `queries`."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import asyncpg
from asyncpg import Record

from dataloader.base import JobStatus
from dataloader.core import limits
from dataloader.exceptions import IdempotencyConflict, InvalidJob
from dataloader.storage import queries
from dataloader.storage.db import DEFAULT_TIMEOUT_SEC, AnyConnection, Connection, Pool

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy


@dataclass(frozen=True, slots=True)
class NewJob:
    """What a producer asks for (spec §5 trigger input, plus optional per-job limits).

    Checked when built, against the same bounds as the HTTP API (`dataloader.core.limits`):
    a field out of bounds raises `InvalidJob` naming it, before anything is sent.
    """

    queue: str
    task: str
    lock_key: str
    args: dict[str, Any]
    idempotency_key: str | None = None
    partition_key: str = ""
    priority: int = 100
    available_at: datetime | None = None
    max_attempts: int = 5
    lease_ttl_sec: int = 60
    producer: str | None = None
    consumer_group: str | None = None
    #: `args` as JSON text, as checked and as sent (PostgreSQL casts it to jsonb).
    args_json: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, check in limits.JOB_FIELD_CHECKS.items():
            value = getattr(self, name)
            if value is None and name in limits.OPTIONAL_JOB_FIELDS:
                continue
            try:
                checked = check(value)
            except ValueError as exc:
                raise InvalidJob(name, str(exc)) from None
            if name == "args":
                object.__setattr__(self, "args_json", checked)


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """The job a trigger created or found by its idempotency key."""

    job_id: uuid.UUID
    status: JobStatus
    created: bool


@dataclass(frozen=True, slots=True)
class JobState:
    """A job's public state (spec §5 status output, plus a few columns)."""

    job_id: uuid.UUID
    queue: str
    task: str
    status: JobStatus
    attempt: int
    max_attempts: int
    cancel_requested: bool
    created_at: datetime
    available_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    error: str | None
    progress: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job this worker now runs; `claim_token` fences every later write (unlike `attempt`,
    it is never given to another claim, even when this one is handed back with a refund, nor
    after a failover that lost the last claims; `claim_seq` counts the job's claims)."""

    job_id: uuid.UUID
    queue: str
    task: str
    args: dict[str, Any]
    lock_key: str
    lock_hash: int
    partition_key: str
    priority: int
    attempt: int
    max_attempts: int
    lease_ttl_sec: int
    cancel_requested: bool
    claim_seq: int
    claim_token: uuid.UUID


@dataclass(frozen=True, slots=True)
class Beat:
    """What a heartbeat learnt of one job that is still ours."""

    cancel_requested: bool
    #: False when the row was locked by someone else: the lease was not extended this time.
    extended: bool


#: The kind of a `Written` whose row someone else held: nothing was written, the job is ours.
BUSY: Final = "busy"


@dataclass(frozen=True, slots=True)
class Written:
    """A fenced outcome write that found its job still ours."""

    #: The journal kind written (done, requeue, failed, canceled, lost, backoff).
    kind: str
    #: Whether the job woken next had waited because its lock_key collides with this job's.
    collision: bool = False


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One row of the journal."""

    event_id: int
    kind: str
    ts: datetime
    payload: dict[str, Any] | None


class GuardedPool:
    """A pool whose statements cannot hang nor leave a bad connection behind.

    Every statement waits at most `timeout` seconds for its connection and for its answer (the
    pool's command timeout). A statement that timed out or was cancelled (a pipeline being
    stopped) closes its connection at once: asyncpg would otherwise wait for the server to
    confirm the cancel before handing the connection back, which a half-open socket never
    does, and a stopped pipeline must stop now, not after that wait. Its server session, which
    outlives a half-open socket, is ended from the next connection (see `AbandonedSessions`).
    """

    def __init__(self, pool: Pool, timeout: float = DEFAULT_TIMEOUT_SEC) -> None:
        self._pool = pool
        self._timeout = timeout
        #: Server pid → start of the pool's sessions, learnt on each one's first use.
        self._sessions: dict[int, datetime] = {}
        self._abandoned = AbandonedSessions("pool")

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[PoolConnectionProxy[Record]]:
        """A pool connection, closed instead of reused if a statement was cut short."""
        conn = await self._pool.acquire(timeout=self._timeout)
        try:
            await self._know_session(conn)
            yield conn
        except (asyncio.CancelledError, TimeoutError, asyncpg.InternalClientError):
            # its statement may still be in flight, on a socket that may be half-open (or the
            # driver lost track of it): close it, and end its session from the next connection
            # (if it is still there)
            started = self._sessions.pop(conn.get_server_pid(), None)
            if started is not None:
                self._abandoned.add(conn.get_server_pid(), started)
            conn.terminate()
            raise
        finally:
            await self._pool.release(conn, timeout=self._timeout)

    async def _know_session(self, conn: PoolConnectionProxy[Record]) -> None:
        """Learn a new connection's session identity; end sessions given up on."""
        if conn.get_server_pid() not in self._sessions:
            if len(self._sessions) > 1000:  # forget connections the pool has long replaced
                self._sessions.clear()
            pid, started = await session_identity(conn)  # type: ignore[arg-type]
            self._sessions[pid] = started
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


class JobRepository:
    """Queue operations over a connection pool (with `GuardedPool`'s connection hygiene)."""

    def __init__(self, pool: Pool, timeout: float = DEFAULT_TIMEOUT_SEC) -> None:
        #: The pool with its connection hygiene (for other stores on the same pool).
        self.db = GuardedPool(pool, timeout)
        self._conn = self.db.connection
        self._fetch = self.db.fetch
        self._fetchrow = self.db.fetchrow
        self._fetchval = self.db.fetchval

    # producers ---------------------------------------------------------------------------

    async def enqueue(self, job: NewJob) -> EnqueueResult:
        """Insert `job`, or return the job that already holds its idempotency key."""
        async with self._conn() as conn:
            return await enqueue(conn, job)

    async def enqueue_many(self, jobs: Sequence[NewJob]) -> list[EnqueueResult]:
        """Insert many jobs in one statement; results in input order."""
        async with self._conn() as conn:
            return await enqueue_many(conn, jobs)

    # readers -----------------------------------------------------------------------------

    async def get(self, job_id: uuid.UUID) -> JobState | None:
        """The job's state, or None when there is no such job."""
        row = await self._fetchrow(queries.JOB_STATUS, job_id)
        return None if row is None else _job_state(row)

    async def events(self, job_id: uuid.UUID) -> list[JobEvent]:
        """The job's journal, oldest first."""
        rows = await self._fetch(queries.JOB_EVENTS, job_id)
        return [JobEvent(r["event_id"], r["kind"], r["ts"], r["payload"]) for r in rows]

    async def queue_counts(self) -> dict[str, dict[str, int]]:
        """{queue: {status: count}} over the whole table."""
        counts: dict[str, dict[str, int]] = {}
        for row in await self._fetch(queries.QUEUE_COUNTS):
            counts.setdefault(row["queue"], {})[row["status"]] = row["n"]
        return counts

    async def maintenance(self) -> dict[str, Any]:
        """The queue table's dead rows, the oldest transaction that may keep vacuum from
        removing them (None when no transaction is open), and recent lock_key collisions."""
        async with self._conn() as conn:
            table = await conn.fetchrow(queries.QUEUE_TABLE_HEALTH)
            oldest = await conn.fetchrow(queries.OLDEST_TRANSACTION)
            collisions = await conn.fetchval(queries.RECENT_LOCK_COLLISIONS)
        return {
            "queue_table": dict(table) if table is not None else None,
            "oldest_transaction": dict(oldest) if oldest is not None else None,
            "lock_key_collisions_last_hour": collisions,
        }

    async def cancel(self, job_id: uuid.UUID) -> JobState | None:
        """Cancel a job (see `queries.CANCEL_JOB`) and return its state after the request."""
        async with self._conn() as conn, conn.transaction():
            new_status = await conn.fetchval(queries.CANCEL_JOB, job_id)
            if new_status == JobStatus.RUNNING:
                await conn.execute(queries.NOTIFY_CANCEL, str(job_id))
            row = await conn.fetchrow(queries.JOB_STATUS, job_id)
        return None if row is None else _job_state(row)

    # workers -----------------------------------------------------------------------------

    async def claim(self, queue: str, limit: int, worker_id: str) -> list[ClaimedJob]:
        """Claim up to `limit` ready jobs of `queue`, at most one per lock_key."""
        rows = await self._fetch(queries.CLAIM_JOBS, queue, limit, worker_id, uuid.uuid4())
        return [
            ClaimedJob(
                job_id=r["job_id"],
                queue=r["queue"],
                task=r["task"],
                args=r["args"],
                lock_key=r["lock_key"],
                lock_hash=r["lock_hash"],
                partition_key=r["partition_key"],
                priority=r["priority"],
                attempt=r["attempt"],
                max_attempts=r["max_attempts"],
                lease_ttl_sec=r["lease_ttl_sec"],
                cancel_requested=r["cancel_requested"],
                claim_seq=r["claim_seq"],
                claim_token=r["claim_token"],
            )
            for r in rows
        ]

    async def next_due_in(self, queue: str) -> float | None:
        """Seconds until the queue's earliest delayed job is due, or None."""
        value: float | None = await self._fetchval(queries.NEXT_DUE_IN, queue)
        return value

    async def backoff(self, job: ClaimedJob, delay_sec: float, worker_id: str) -> str | None:
        """Busy lock: requeue, refunding the attempt (see `queries.BACKOFF_JOB`). Returns who
        holds the key (`none`, `running job`, `outside dataloader`), or None if not ours."""
        holder: str | None = await self._fetchval(
            queries.BACKOFF_JOB, job.job_id, job.claim_token, delay_sec, worker_id
        )
        return holder

    async def heartbeat(
        self, beats: Sequence[tuple[uuid.UUID, uuid.UUID, bool]], worker_id: str
    ) -> dict[uuid.UUID, Beat]:
        """Extend leases of (job_id, claim_token, journal?) triples; the jobs still ours."""
        if not beats:
            return {}
        ids, tokens, journal = zip(*beats, strict=True)
        rows = await self._fetch(
            queries.HEARTBEAT_JOBS, list(ids), list(tokens), list(journal), worker_id
        )
        return {r["job_id"]: Beat(r["cancel_requested"], r["extended"]) for r in rows}

    async def set_progress(
        self, job_id: uuid.UUID, claim_token: uuid.UUID, progress: dict[str, Any]
    ) -> bool | None:
        """Store progress; returns cancel_requested, or None when the job is not ours."""
        value: bool | None = await self._fetchval(
            queries.SET_PROGRESS, job_id, claim_token, progress
        )
        return value

    async def complete_many(
        self, jobs: Sequence[tuple[uuid.UUID, uuid.UUID]], worker_id: str
    ) -> dict[uuid.UUID, Written]:
        """Mark (job_id, claim_token) pairs succeeded; returns the jobs that were still ours:
        `done`, or `busy` when someone else held the row (still ours, not written)."""
        if not jobs:
            return {}
        ids, tokens = zip(*jobs, strict=True)
        rows = await self._fetch(queries.COMPLETE_JOBS, list(ids), list(tokens), worker_id)
        return {
            row["job_id"]: Written(BUSY if row["busy"] else "done", row["collision"])
            for row in rows
        }

    async def fail(
        self,
        job_id: uuid.UUID,
        claim_token: uuid.UUID,
        error: str,
        *,
        retryable: bool,
        retry_base_sec: float,
        worker_id: str,
    ) -> Written | None:
        """Retry or fail (requeue/failed/canceled); None when the job is not ours."""
        row = await self._fetchrow(
            queries.FAIL_JOB, job_id, claim_token, error, retryable, retry_base_sec, worker_id
        )
        return _written(row)

    async def mark_canceled(
        self, job_id: uuid.UUID, claim_token: uuid.UUID, worker_id: str
    ) -> Written | None:
        """The pipeline honoured a cancel request; None when the job is not ours."""
        return _written(
            await self._fetchrow(queries.CANCEL_RUNNING_JOB, job_id, claim_token, worker_id)
        )

    async def release(
        self,
        job_id: uuid.UUID,
        claim_token: uuid.UUID,
        *,
        refund: bool,
        max_refunds: int,
        worker_id: str,
        reason: str,
    ) -> Written | None:
        """Hand a running job back (see `queries.RELEASE_JOB`); None when it is not ours."""
        row = await self._fetchrow(
            queries.RELEASE_JOB, job_id, claim_token, refund, worker_id, reason, max_refunds
        )
        return _written(row)

    async def reap_expired(self, batch: int, reaper_id: str) -> list[tuple[uuid.UUID, str]]:
        """One reaper pass of at most `batch` jobs: [(job_id, new status)]."""
        rows = await self._fetch(queries.REAP_EXPIRED, batch, reaper_id)
        return [(r["job_id"], r["status"]) for r in rows]


def _written(row: Record | None) -> Written | None:
    return None if row is None else Written(row["kind"], row["collision"])


async def enqueue(conn: AnyConnection, job: NewJob) -> EnqueueResult:
    """Insert `job` on `conn` (usable inside the caller's own transaction), or return the job
    that already holds its idempotency key if that job is the same (see
    `queries.JOBS_BY_IDEMPOTENCY`); raise `IdempotencyConflict` if it is not."""
    while True:
        row = await conn.fetchrow(
            queries.INSERT_JOB,
            job.queue,
            job.task,
            job.args_json,
            job.idempotency_key,
            job.lock_key,
            job.partition_key,
            job.priority,
            job.available_at,
            job.max_attempts,
            job.lease_ttl_sec,
            job.producer,
            job.consumer_group,
        )
        if row is not None:
            return EnqueueResult(row["job_id"], JobStatus(row["status"]), True)
        # A concurrent or earlier insert holds the key: it is committed by now (ON CONFLICT
        # waited for it), and a new statement sees it. If it vanished meanwhile, insert again.
        existing = await _holders(conn, [job])
        if job.idempotency_key in existing:
            return existing[job.idempotency_key]


async def enqueue_many(conn: AnyConnection, jobs: Sequence[NewJob]) -> list[EnqueueResult]:
    """Insert `jobs` on `conn` in one statement (usable inside the caller's transaction).

    A job whose idempotency_key already exists (or repeats one earlier in `jobs`) is not
    inserted: its result is the job holding the key, if that job is the same; if it is not,
    `IdempotencyConflict` is raised and nothing of the batch is written (the batch runs in a
    transaction, a savepoint inside the caller's). Results come in input order.
    """
    if not jobs:
        return []
    ids = [uuid.uuid4() for _ in jobs]
    async with conn.transaction():
        inserted = {
            row["job_id"] for row in await conn.fetch(queries.INSERT_JOBS, ids, *_columns(jobs))
        }
        skipped = [j for j, i in zip(jobs, ids, strict=True) if i not in inserted]
        existing = await _holders(conn, skipped) if skipped else {}
    return [
        EnqueueResult(job_id, JobStatus.QUEUED, True)
        if job_id in inserted
        else existing[job.idempotency_key]  # type: ignore[index]  # only keyed jobs are skipped
        for job, job_id in zip(jobs, ids, strict=True)
    ]


async def _holders(conn: AnyConnection, jobs: Sequence[NewJob]) -> dict[str, EnqueueResult]:
    """{idempotency key: the job holding it} for the keys of `jobs` (a key whose holder is
    gone is missing); `IdempotencyConflict` for the first job whose fields differ from its
    holder's."""
    results = {}
    for row in await conn.fetch(queries.JOBS_BY_IDEMPOTENCY, *_columns(jobs)):
        if row["differs"]:
            raise IdempotencyConflict(row["idempotency_key"], row["job_id"], row["differs"])
        results[row["idempotency_key"]] = EnqueueResult(
            row["job_id"], JobStatus(row["status"]), False
        )
    return results


def _columns(jobs: Sequence[NewJob]) -> tuple[list[Any], ...]:
    """The jobs' fields as one array per column, in the order of the statements' parameters."""
    return (
        [j.queue for j in jobs],
        [j.task for j in jobs],
        [j.args_json for j in jobs],
        [j.idempotency_key for j in jobs],
        [j.lock_key for j in jobs],
        [j.partition_key for j in jobs],
        [j.priority for j in jobs],
        [j.available_at for j in jobs],
        [j.max_attempts for j in jobs],
        [j.lease_ttl_sec for j in jobs],
        [j.producer for j in jobs],
        [j.consumer_group for j in jobs],
    )


async def try_advisory_locks(conn: Connection, lock_hashes: Sequence[int]) -> dict[int, bool]:
    """Session-level `pg_try_advisory_lock` of each hash on the lock-holding connection."""
    rows = await conn.fetch(queries.TRY_ADVISORY_LOCKS, list(lock_hashes))
    return {r["lock_hash"]: r["locked"] for r in rows}


async def advisory_unlock(conn: Connection, lock_hashes: Sequence[int]) -> int:
    """Release session-level advisory locks; returns how many this session held."""
    released: int = await conn.fetchval(queries.ADVISORY_UNLOCK, list(lock_hashes))
    return released


async def held_advisory_locks(conn: Connection) -> set[int]:
    """The one-key advisory locks the session behind `conn` holds (each once, however many
    times it took it)."""
    return {r["lock_hash"] for r in await conn.fetch(queries.HELD_ADVISORY_LOCKS)}


async def advisory_unlock_fully(conn: Connection, lock_hashes: Sequence[int]) -> None:
    """Release every level of each hash (a session-level advisory lock taken twice needs two
    releases); hashes the session does not hold are skipped."""
    pending = list(lock_hashes)
    while pending:
        pending = [r["lock_hash"] for r in await conn.fetch(queries.ADVISORY_UNLOCK_HELD, pending)]


async def session_identity(conn: Connection) -> tuple[int, datetime]:
    """(pid, backend_start) of the session behind `conn`."""
    row = await conn.fetchrow(queries.SESSION_IDENTITY)
    assert row is not None  # our own session is always in pg_stat_activity
    return row["pid"], row["backend_start"]


async def end_session(conn: Connection, pid: int, backend_start: datetime) -> bool:
    """Terminate the session (pid, backend_start) if it still exists; whether it did."""
    return bool(await conn.fetchval(queries.END_SESSION, pid, backend_start))


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


def _job_state(row: Any) -> JobState:
    return JobState(
        job_id=row["job_id"],
        queue=row["queue"],
        task=row["task"],
        status=JobStatus(row["status"]),
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        cancel_requested=row["cancel_requested"],
        created_at=row["created_at"],
        available_at=row["available_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        heartbeat_at=row["heartbeat_at"],
        error=row["error"],
        progress=row["progress"],
    )
