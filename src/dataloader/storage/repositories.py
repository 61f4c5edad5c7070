"""The client's operations on the queue: enqueue, read, list, cancel, retry, re-run.

Each runs named statements from `queries` on whatever connections the client was given (the
service's pool, a user's asyncpg pool, a SQLAlchemy engine: see `connections`), or on the
caller's own connection inside its transaction (`enqueue(conn, …)`). JSON is read as text, so
that a connection's codecs do not matter. Decisions (a cancel, a retry, a re-run) are taken by
`dataloader.core.transitions` and written fenced on the facts they were taken on.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import json
import re
import struct
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from asyncpg import Record

from dataloader.base import JobStatus
from dataloader.core import limits
from dataloader.core import transitions as decide
from dataloader.core.models import (
    FILLED_OPTIONS,
    EnqueueResult,
    JobDefaults,
    JobEvent,
    JobFilter,
    JobOptions,
    JobState,
    NewJob,
    new_job_id,
)
from dataloader.core.transitions import JobFacts, Request, Transition
from dataloader.exceptions import IdempotencyConflict, JobNotFound, NotRetryable
from dataloader.storage import queries
from dataloader.storage.connections import Connections, atomic
from dataloader.storage.db import AnyConnection, Connection
from dataloader.storage.transitions import (
    Applied,
    D,
    Fence,
    Reread,
    Settled,
    Write,
    WrittenDecision,
    apply_transitions,
    facts_of,
    settle,
)

#: Tries of a cancel, retry or re-run whose job changes under it (a worker finishing it now).
MAX_DECISIONS: Final = 20
#: Pause before trying again when someone else held the job's row.
BUSY_PAUSE_SEC: Final = 0.02
#: A queue and status matching fewer jobs than this are listed from the (status, queue)
#: index and sorted (a few milliseconds); more, by walking the newest jobs.
NARROW_MATCHES: Final = 5000
#: Jobs a cancel or retry by filter reads at a time.
BULK_PAGE: Final = 500


@dataclass(frozen=True, slots=True)
class BulkResult:
    """What a cancel or retry by filter did: the jobs it looked at (`matched`), those it
    changed, and whether more jobs match beyond its limit."""

    matched: int
    changed: list[uuid.UUID]
    more: bool


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of `list`: jobs newest first, and the cursor of the next page (None: last)."""

    jobs: list[JobState]
    next_cursor: str | None


#: What a repository tells of a transition it wrote: the job's queue and task, the journal kind.
Written = Callable[[str, str, str], None]


class JobRepository:
    """The client's statements over a source of connections."""

    def __init__(
        self, connections: Connections, actor: str = "client", written: Written | None = None
    ) -> None:
        self.connections = connections
        #: Who the journal says acted (`by`).
        self.actor = actor
        #: Told of each transition written (a queued job canceled, say): metrics count them.
        self.written = written

    async def enqueue(self, job: NewJob, options: JobOptions | None = None) -> EnqueueResult:
        """Insert `job` (see `enqueue`)."""
        async with self.connections.connection() as conn:
            return await enqueue(conn, job, actor=self.actor, options=options)

    async def enqueue_many(
        self, jobs: Sequence[NewJob], options: Mapping[str, JobOptions] | None = None
    ) -> list[EnqueueResult]:
        """Insert jobs in one statement (see `enqueue_many`)."""
        async with self.connections.connection() as conn:
            return await enqueue_many(conn, jobs, actor=self.actor, options=options)

    async def get(self, job_id: uuid.UUID) -> JobState | None:
        """The job's state, or None when there is no such job."""
        async with self.connections.connection() as conn:
            row = await conn.fetchrow(*queries.JOB_STATUS.bind(job_id=job_id))
        return None if row is None else job_state(row)

    async def get_many(self, job_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, JobState]:
        """The states of those of `job_ids` that exist."""
        async with self.connections.connection() as conn:
            rows = await conn.fetch(*queries.JOB_STATUSES.bind(job_ids=list(job_ids)))
        return {row["job_id"]: job_state(row) for row in rows}

    async def stages_of(self, parent: uuid.UUID, limit: int) -> builtins.list[JobState]:
        """The jobs `parent`'s successes enqueued as its stages, oldest first."""
        async with self.connections.connection() as conn:
            ids = [
                row["job_id"]
                for row in await conn.fetch(*queries.STAGE_JOB_IDS.bind(parent=parent, limit=limit))
            ]
        found = await self.get_many(ids) if ids else {}
        return [found[job_id] for job_id in ids if job_id in found]

    async def holder_of(self, idempotency_key: str) -> uuid.UUID | None:
        """The job holding `idempotency_key`, if any."""
        async with self.connections.connection() as conn:
            found: uuid.UUID | None = await conn.fetchval(
                *queries.JOB_BY_IDEMPOTENCY_KEY.bind(idempotency_key=idempotency_key)
            )
        return found

    async def args(self, job_id: uuid.UUID) -> tuple[Any, str | None] | None:
        """The job's args and partition_key, or None when there is no such job."""
        async with self.connections.connection() as conn:
            row = await conn.fetchrow(*queries.JOB_ARGS.bind(job_id=job_id))
        return None if row is None else (json.loads(row["args"]), row["partition_key"])

    async def list(self, where: JobFilter, limit: int, cursor: str | None = None) -> JobPage:
        """Jobs newest first, filtered; `cursor` is the `next_cursor` of the previous page."""
        values = where.given()
        if where.status is not None:
            values["status"] = where.status.value
            if where.status in ENDED_BADLY:
                values["ended_badly"] = True
        if where.args is not None:
            values["args"] = limits.args_json(where.args)
        if values.get("partition_key") == "":
            del values["partition_key"]
            values["no_partition_key"] = True
        after_created, after_id = _decode_cursor(cursor)
        if after_created is not None:
            values |= {"after": True, "after_created": after_created, "after_id": after_id}
        filters = frozenset(values.keys() & queries.JOB_FILTERS.keys())
        for flag in ("after", "no_partition_key", "ended_badly"):
            values.pop(flag, None)
        async with self.connections.connection() as conn:
            narrow = False
            if where.queue is not None and where.status is not None:
                probe = queries.STATUS_QUEUE_PROBE.bind(
                    status=values["status"], queue=where.queue, probe=NARROW_MATCHES
                )
                narrow = await conn.fetchval(*probe) < NARROW_MATCHES
            running = None if where.status is None else where.status is JobStatus.RUNNING
            statement = queries.list_jobs(filters, narrow, running)
            # one more than the page: is there another page?
            rows = await conn.fetch(*statement.bind(**values, limit=limit + 1))
        jobs = [job_state(r) for r in rows[:limit]]
        return JobPage(jobs, _cursor(jobs[-1]) if len(rows) > limit else None)

    async def events(
        self, job_id: uuid.UUID, after: int = 0, limit: int | None = None
    ) -> builtins.list[JobEvent]:
        """The job's journal, oldest first: the entries after event `after`, `limit` at most."""
        async with self.connections.connection() as conn:
            rows = await conn.fetch(
                *queries.JOB_EVENTS.bind(job_id=job_id, after=after, limit=limit)
            )
        return [
            JobEvent(
                r["event_id"],
                r["kind"],
                r["ts"],
                None if r["payload"] is None else json.loads(r["payload"]),
            )
            for r in rows
        ]

    async def cancel(self, job_id: uuid.UUID) -> JobState:
        """Cancel: a queued job ends `canceled` at once; a running one is asked to stop; a
        finished one is left as it is. Returns the job's state after the request."""
        await self._decide(job_id, decide.on_cancel)
        return await self._state(job_id)

    async def retry(self, job_id: uuid.UUID) -> JobState:
        """Send a failed, lost or canceled job back to the queue with a fresh budget of
        attempts (journaled `retried`); `NotRetryable` for a job in any other state."""
        await self._decide(job_id, decide.on_retry)
        return await self._state(job_id)

    async def cancel_matching(self, where: JobFilter, limit: int) -> BulkResult:
        """Cancel, one by one, up to `limit` of the jobs matching `where`, newest first."""
        return await self._each_matching(where, limit, decide.on_cancel)

    async def retry_matching(self, where: JobFilter, limit: int) -> BulkResult:
        """Retry, one by one, up to `limit` of the jobs matching `where` that can be retried,
        newest first (the others are skipped)."""
        return await self._each_matching(where, limit, _retry_if_retryable)

    async def _each_matching(self, where: JobFilter, limit: int, rule: Any) -> BulkResult:
        """Decide and write `rule` for each job matching `where`, `limit` at most, each fenced
        on its own facts (a job finishing meanwhile is decided again, or skipped)."""
        changed: builtins.list[uuid.UUID] = []
        matched, cursor = 0, None
        while matched < limit:
            page = await self.list(where, min(BULK_PAGE, limit - matched), cursor)
            for job in page.jobs:
                try:
                    if await self._decide(job.job_id, rule):
                        changed.append(job.job_id)
                except JobNotFound:  # pruned or deleted meanwhile: nothing to change
                    pass
            matched += len(page.jobs)
            cursor = page.next_cursor
            if cursor is None:
                return BulkResult(matched, changed, more=False)
        return BulkResult(matched, changed, more=True)

    async def _state(self, job_id: uuid.UUID) -> JobState:
        state = await self.get(job_id)
        if state is None:
            raise JobNotFound(f"job {job_id} not found")
        return state

    async def _decide(self, job_id: uuid.UUID, rule: Any) -> bool:
        """Read the job's facts, decide with `rule`, write fenced; again if the job changed
        meanwhile (a worker finishing it now). Whether something was written (`rule` may
        decide nothing); JobNotFound if there is no such job."""
        async with self.connections.connection() as conn:
            rows: dict[uuid.UUID, Record] = {}
            read = _reader(conn, rows)
            facts = await read([job_id])
            if job_id not in facts:
                raise JobNotFound(f"job {job_id} not found")
            settled = await settle(
                [Fence(job_id, facts[job_id])],
                lambda fence: rule(fence.facts),
                _client_writer(conn, self.actor),
                rounds=MAX_DECISIONS,
                reread=read,
            )
        written = _settled_one(job_id, settled)
        if written is None:
            return False
        decision = written.decision
        if self.written is not None and isinstance(decision, Transition):
            row = rows[job_id]
            self.written(row["queue"], row["task"], decision.journal)
        return True


def _retry_if_retryable(facts: JobFacts) -> Transition | None:
    """`on_retry`, or nothing for a job that cannot be retried (a bulk retry skips it)."""
    try:
        return decide.on_retry(facts)
    except NotRetryable:
        return None


def _reader(conn: AnyConnection, rows: dict[uuid.UUID, Record]) -> Reread:
    """`settle`'s reread for a client: the jobs' facts now (JOB_FACTS), their rows kept in
    `rows`."""

    async def read(job_ids: builtins.list[uuid.UUID]) -> dict[uuid.UUID, JobFacts]:
        facts = {}
        for job_id in job_ids:
            row = await conn.fetchrow(*queries.JOB_FACTS.bind(job_id=job_id))
            if row is not None:
                rows[job_id] = row
                facts[job_id] = facts_of(row)
        return facts

    return read


def _client_writer(conn: AnyConnection, actor: str) -> Write[Transition | Request]:
    """`settle`'s write for a client's decisions: a transition by `apply_transitions`, a
    request (a running job asked to stop or run again) by REQUEST_ON_JOB, each fenced on the
    facts it was decided on. A request not written comes back `changed` (to be read again)."""

    async def write(
        items: builtins.list[tuple[Fence, Transition | Request]],
    ) -> dict[uuid.UUID, Applied]:
        transitions = [(f, d) for f, d in items if isinstance(d, Transition)]
        applied = await apply_transitions(conn.fetch, transitions, actor_role="by", actor=actor)
        for fence, decision in items:
            if isinstance(decision, Request):
                written = await _request(conn, fence, decision, actor)
                applied[fence.job_id] = Applied("written" if written else "changed")
        if any(a.state == "busy" for a in applied.values()):
            await asyncio.sleep(BUSY_PAUSE_SEC)  # a claim or an outcome holds the row: briefly
        return applied

    return write


async def _request(conn: AnyConnection, fence: Fence, request: Request, actor: str) -> bool:
    """Write a client's request fenced on `fence.facts`; False when the job changed meanwhile."""
    facts = fence.facts
    row = await conn.fetchrow(
        *queries.REQUEST_ON_JOB.bind(
            job_id=fence.job_id,
            expect_status=facts.status.value,
            expect_attempt=facts.attempt,
            expect_cancel=facts.cancel_requested,
            expect_rerun=facts.rerun_requested,
            cancel=request.cancel,
            rerun=request.rerun,
            args=request.args_json,
            journal=request.journal,
            actor=actor,
        )
    )
    return bool(row is not None and row["written"])


def _settled_one(job_id: uuid.UUID, settled: Settled[D]) -> WrittenDecision[D] | None:
    """The decision `settle` wrote for the one job a client settles, or None when its rule
    decided nothing; JobNotFound when the job is gone, RuntimeError when it kept changing."""
    if job_id in settled.written:
        return settled.written[job_id]
    if job_id in settled.undecided:
        return None
    if job_id in settled.gone:
        raise JobNotFound(f"job {job_id} not found")
    raise RuntimeError(f"job {job_id} kept changing; gave up after {MAX_DECISIONS} tries")


#: What asyncpg calls with a notification: connection, sender's pid, channel, payload.
NotificationCallback = Callable[[Any, int, str, object], None]


async def listen_for_ended_jobs(conn: Connection, callback: NotificationCallback) -> None:
    """LISTEN for ended jobs on `conn`: `callback` gets their ids, comma-separated, in batches.
    Ends are announced only while some session listens, so a caller reads the jobs it waits
    for after this returns (an end written just before it is not announced to anyone)."""
    await conn.execute(queries.LISTENER_LOCK)
    await conn.add_listener(queries.FINISHED_CHANNEL, callback)


async def stop_listening_for_ended_jobs(conn: Connection, callback: NotificationCallback) -> None:
    """Undo `listen_for_ended_jobs`, leaving `conn` fit to go back to its pool."""
    await conn.remove_listener(queries.FINISHED_CHANNEL, callback)
    await conn.execute(queries.LISTENER_UNLOCK)


async def enqueue(
    conn: AnyConnection,
    job: NewJob,
    *,
    actor: str = "client",
    options: JobOptions | None = None,
    job_id: uuid.UUID | None = None,
) -> EnqueueResult:
    """Insert `job` on `conn` (usable inside the caller's own transaction), or return the job
    that already holds its idempotency key if that job is the same (see
    `queries.JOBS_BY_IDEMPOTENCY`), or, with `job.rerun`, ask that job to run again; raise
    `IdempotencyConflict` if it is another job. Options the job leaves out come from
    `options` (its task's), else the spec's defaults. `job_id`: the id of the new job (one
    the caller watches for already), else a new one (`new_job_id`)."""
    columns = {name: getattr(job, name) for name in _SINGLE_COLUMNS}
    if not job.is_resolved:
        filled = options if options is not None else _SPEC_OPTIONS
        job.check_queue(filled)
        for name in FILLED_OPTIONS:
            columns[name] = filled.fill(job, name)
    # an id of the caller's may be one another transaction is inserting: the insert would
    # wait for it while it holds its keys' parking locks
    park = job_id is None and job.idempotency_key is None and _commits_at_once(conn)
    if job_id is None:
        job_id = new_job_id()
    while True:
        row = await conn.fetchrow(
            *queries.INSERT_JOB.bind(
                **columns,
                job_id=job_id,
                args=job.args_json,
                actor=actor,
                park_behind_running=park,
            )
        )
        if row is not None:
            return EnqueueResult(row["job_id"], JobStatus(row["status"]), True)
        # A concurrent or earlier insert holds the key: it is committed by now (ON CONFLICT
        # waited for it), and a new statement sees it. If it vanished meanwhile, insert again.
        by_task = None if options is None else {job.task: options}
        existing = await _holders(conn, [job], actor, by_task)
        if job.idempotency_key in existing:
            return existing[job.idempotency_key]


async def enqueue_many(
    conn: AnyConnection,
    jobs: Sequence[NewJob],
    *,
    actor: str = "client",
    options: Mapping[str, JobOptions] | None = None,
) -> list[EnqueueResult]:
    """Insert `jobs` on `conn` in one statement (usable inside the caller's transaction);
    options a job leaves out come from `options` of its task (else the spec's defaults).

    A job whose idempotency_key already exists (or repeats one earlier in `jobs`) is not
    inserted: its result is the job holding the key, if that job is the same (or, with
    `rerun`, that job asked to run again); if it is not, `IdempotencyConflict` is raised and
    nothing of the batch is written (the batch runs in a transaction, a savepoint inside the
    caller's). Results come in input order.
    """
    if not jobs:
        return []
    ids = [new_job_id() for _ in jobs]
    keyed = any(job.idempotency_key is not None for job in jobs)
    park = not keyed and len(jobs) <= PARKING_BATCH_MAX and _commits_at_once(conn)
    # without keys nothing is skipped, and the one statement is atomic on its own
    async with atomic(conn) if keyed else contextlib.nullcontext(conn):
        inserted = {
            row["job_id"]
            for row in await conn.fetch(
                *queries.INSERT_JOBS.bind(
                    job_ids=ids,
                    actor=actor,
                    park_behind_running=park,
                    **_arrays(jobs, options),
                )
            )
        }
        skipped = [j for j, i in zip(jobs, ids, strict=True) if i not in inserted]
        existing = await _holders(conn, skipped, actor, options) if skipped else {}
    return [
        EnqueueResult(job_id, JobStatus.QUEUED, True)
        if job_id in inserted
        else existing[job.idempotency_key]  # type: ignore[index]  # only keyed jobs are skipped
        for job, job_id in zip(jobs, ids, strict=True)
    ]


async def _holders(
    conn: AnyConnection,
    jobs: Sequence[NewJob],
    actor: str,
    options: Mapping[str, JobOptions] | None = None,
) -> dict[str, EnqueueResult]:
    """{idempotency key: the job holding it} for the keys of `jobs` (a key whose holder is
    gone is missing); `IdempotencyConflict` for the first job whose fields differ from its
    holder's (its args may differ when it asks for a re-run, which is then written)."""
    asked = {job.idempotency_key: job for job in jobs}
    arrays = _arrays(jobs, options)
    del arrays["delay_sec"]
    results = {}
    for row in await conn.fetch(*queries.JOBS_BY_IDEMPOTENCY.bind(**arrays)):
        key = row["idempotency_key"]
        job = asked[key]
        differs = [f for f in row["differs"] if not (job.rerun and f == "args")]
        if differs:
            raise IdempotencyConflict(key, row["job_id"], differs)
        status = JobStatus(row["status"])
        if job.rerun:
            status = await _rerun(conn, row["job_id"], facts_of(row), job.args_json, actor)
        results[key] = EnqueueResult(row["job_id"], status, False, rerun=job.rerun)
    return results


async def _rerun(
    conn: AnyConnection, job_id: uuid.UUID, facts: JobFacts, args_json: str, actor: str
) -> JobStatus:
    """Ask the job to run again with `args_json`; its status after that."""
    settled = await settle(
        [Fence(job_id, facts)],
        lambda fence: decide.on_rerun(fence.facts, args_json),
        _client_writer(conn, actor),
        rounds=MAX_DECISIONS,
        reread=_reader(conn, {}),
    )
    written = _settled_one(job_id, settled)
    assert written is not None  # on_rerun always decides
    decision = written.decision
    return decision.status if isinstance(decision, Transition) else written.fence.facts.status


#: The most jobs an insert parks behind their running keys: the end of a running job waits for
#: an insert that holds its key's parking lock, as long as the insert's statement lasts.
PARKING_BATCH_MAX: Final = 1000


def _commits_at_once(conn: AnyConnection) -> bool:
    """Whether an insert on `conn` commits as soon as it is written (no caller's transaction
    is open): only then may it park its jobs behind their running lock_keys, holding the
    keys' parking locks until it commits (see Parking at insert in `queries`). Inside a
    caller's transaction they are parked by the first claim that meets them instead."""
    return not conn.is_in_transaction()


#: INSERT_JOB's and INSERT_JOBS's parameters that are not fields of a job.
_NOT_FIELDS: Final = {"job_id", "job_ids", "args", "actor", "park_behind_running"}
#: Fields of a job sent as they are, by INSERT_JOB's parameter names (args is sent as text).
_SINGLE_COLUMNS: Final = tuple(n for n in queries.INSERT_JOB.names if n not in _NOT_FIELDS)
#: Columns of INSERT_JOBS and JOBS_BY_IDEMPOTENCY (one array each).
_COLUMNS: Final = tuple(n for n in queries.INSERT_JOBS.names if n not in _NOT_FIELDS)


def _arrays(
    jobs: Sequence[NewJob], options: Mapping[str, JobOptions] | None = None
) -> dict[str, list[Any]]:
    """The jobs' fields as one list per column, by parameter name; options a job leaves out
    come from `options` of its task (the client's: its task definitions and settings), else
    the spec's defaults. InvalidJob for a job that ends up without a queue."""
    arrays = {name: [getattr(j, name) for j in jobs] for name in _COLUMNS}
    arrays["args"] = [j.args_json for j in jobs]
    if not any(arrays["delay_sec"]):  # a delay of 0 is none: now
        arrays["delay_sec"] = []
    gaps = [name for name in FILLED_OPTIONS if None in arrays[name]]
    if not gaps:
        return arrays
    of_task = options or {}
    per_job = [of_task.get(j.task, _SPEC_OPTIONS) for j in jobs]
    for name in gaps:  # each job's own value, else its task's option
        arrays[name] = [
            own if own is not None else getattr(o, name)
            for own, o in zip(arrays[name], per_job, strict=True)
        ]
    for job, queue in zip(jobs, arrays["queue"], strict=True):
        if queue is None:
            job.check_queue(_SPEC_OPTIONS)
    return arrays


#: The options of a job whose task the caller does not know: the spec's defaults.
_SPEC_OPTIONS: Final = JobOptions.of(None, JobDefaults())


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def job_state(row: Record) -> JobState:
    """A JobState from a row of JOB_STATUS or of `list_jobs`."""
    return JobState(
        job_id=row["job_id"],
        status=JobStatus(row["status"]),
        attempt=row["attempt"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        heartbeat_at=row["heartbeat_at"],
        error=row["error"],
        progress=_json(row["progress"]),
        queue=row["queue"],
        task=row["task"],
        max_attempts=row["max_attempts"],
        cancel_requested=row["cancel_requested"],
        created_at=row["created_at"],
        available_at=row["available_at"],
        lock_key=row["lock_key"],
        idempotency_key=row["idempotency_key"],
        priority=row["priority"],
        result=_json(row["result"]),
        duration_ms=row["duration_ms"],
        worker_id=row["worker_id"],
        checkpoint=_json(row["checkpoint"]),
        rerun_requested=row["rerun_requested"],
        attempted_at=row["attempted_at"],
    )


#: A cursor: the last job of a page, (created_at in microseconds since 1970, job_id), packed
#: and base64url-encoded: 32 characters of CURSOR_PATTERN, every one of which decodes.
_CURSOR: Final = struct.Struct(">q16s")
CURSOR_PATTERN: Final = r"^[A-Za-z0-9_-]{32}$"
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROS_RANGE: Final = (
    (datetime.min.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1) + 1,
    (datetime.max.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1) - 1,
)


def _cursor(job: JobState) -> str:
    micros = (job.created_at - _EPOCH) // timedelta(microseconds=1)
    return base64.urlsafe_b64encode(_CURSOR.pack(micros, job.job_id.bytes)).decode()


#: The statuses the index of tasks' failures holds (migration 0024).
ENDED_BADLY: Final = frozenset({JobStatus.FAILED, JobStatus.LOST, JobStatus.CANCELED})


def _decode_cursor(cursor: str | None) -> tuple[datetime | None, uuid.UUID | None]:
    """(created_at, job_id) of the last job of the previous page; ValueError for anything
    that is not 32 characters of CURSOR_PATTERN. Any such text is a position in the list (one
    made up just starts the page elsewhere), so the API's pattern is its whole check."""
    if cursor is None:
        return None, None
    if not isinstance(cursor, str) or not re.fullmatch(CURSOR_PATTERN, cursor):
        raise ValueError(f"not a cursor of this list: {cursor!r}"[:200])
    micros, job_id = _CURSOR.unpack(base64.urlsafe_b64decode(cursor))
    micros = min(max(micros, _MICROS_RANGE[0]), _MICROS_RANGE[1])
    return _EPOCH + timedelta(microseconds=micros), uuid.UUID(bytes=job_id)
