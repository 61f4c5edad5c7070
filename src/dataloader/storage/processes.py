"""Durable processes in PostgreSQL: the statements over `dl_processes` and `dl_process_events`
(migration 0020), and the reads and writes built on them.

A process's tasks are jobs (`storage/repositories.py` inserts them, the worker protocol claims
and ends them); what is here is the process itself: its row, taken when started, read before a
step with the last events of its history, changed by the step's save in the same transaction
as the task's end (`StepSave.apply_all`), listed and counted for readers. JSON travels as
text, as for jobs, whatever codecs a connection has.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, overload

from asyncpg import Record

from dataloader import metrics
from dataloader.core.models import NewJob
from dataloader.core.processes import (
    KEEP,
    Event,
    Process,
    ProcessFacts,
    ProcessStatus,
    Refusal,
    StepWrite,
    TaskKind,
    Timer,
    refused_error,
)
from dataloader.core.transitions import Transition, on_cancel
from dataloader.storage import queries, transitions
from dataloader.storage.db import AnyConnection
from dataloader.storage.repositories import enqueue_many
from dataloader.storage.statement import Statement
from dataloader.storage.transitions import Fence, Joined, release_keys, set_states

# --- statements ------------------------------------------------------------------------------

#: Take `process_id` in `namespace` for a new process (status `init`), unless a live process
#: holds it: then no row.
START_PROCESS: Final = Statement("""
INSERT INTO dl_processes (namespace, process_id, queue, init_args, metadata)
VALUES (:namespace, :process_id, :queue, :init_args::text::jsonb, :metadata::text::jsonb)
ON CONFLICT (namespace, process_id) WHERE removed_at IS NULL DO NOTHING
RETURNING process_ref
""")

#: What decisions need of a live process, by its id.
PROCESS_FACTS: Final = Statement("""
SELECT process_ref, queue, status, timer_task, init_args::text AS init_args
FROM dl_processes
WHERE namespace = :namespace AND process_id = :process_id AND removed_at IS NULL
""")

#: The facts of the newest removed incarnation of an id (ix_dl_processes_removed_id), for the
#: repeat of a keyed task that no live process holds.
REMOVED_FACTS: Final = Statement("""
SELECT process_ref, queue, status, timer_task, init_args::text AS init_args
FROM dl_processes
WHERE namespace = :namespace AND process_id = :process_id AND removed_at IS NOT NULL
ORDER BY process_ref DESC
LIMIT 1
""")

#: A live process as readers see it, by its id.
GET_PROCESS: Final = Statement("""
SELECT p.process_ref, p.namespace, p.process_id, p.queue, p.status, p.detail,
       p.aux_state::text AS aux_state,
       p.metadata::text AS metadata, p.corrupted_by, p.init_args::text AS init_args,
       p.last_event_id, p.timer_task, p.timer_kind, p.timer_at, p.created_at, p.updated_at
FROM dl_processes p
WHERE p.namespace = :namespace AND p.process_id = :process_id AND p.removed_at IS NULL
""")

#: A process (by incarnation) with the last `history` events of its history, oldest first,
#: as one JSON array (decoded only if the processor reads them: `LazyHistory`); and whether
#: another task of the process (another job of its lock_key than `task_id`) is still running,
#: in the same snapshot: two replicas' claims can each take a task of a process at once, and a
#: task that ends lets its advisory lock go before its save commits, so a task that found its
#: process busy must not run on the state it read. The events are read from the primary key's
#: range above `last_event_id - history`: a process of a million events costs what one of ten
#: does.
STEP_INPUT: Final = Statement("""
SELECT p.process_ref, p.namespace, p.process_id, p.queue, p.status, p.detail,
       p.aux_state::text AS aux_state,
       p.metadata::text AS metadata, p.corrupted_by, p.init_args::text AS init_args,
       p.last_event_id, p.timer_task, p.timer_kind, p.timer_at, p.created_at, p.updated_at,
       (SELECT json_agg(json_build_object('event_id', e.event_id, 'task_id', e.task_id,
                                          'ts', e.ts, 'payload', e.payload,
                                          'metadata', e.metadata)
                        ORDER BY e.event_id)::text
        FROM dl_process_events e
        WHERE e.process_ref = p.process_ref AND e.event_id > p.last_event_id - :history
       ) AS history,
       EXISTS (SELECT 1 FROM dl_jobs r
               WHERE (r.status = 'running') IS TRUE
                 AND hashtext(r.lock_key) = hashtext(:lock_key) AND r.lock_key = :lock_key
                 AND NOT r.lock_free AND r.job_id <> :task_id) AS busy
FROM dl_processes p
WHERE p.process_ref = :process_ref AND p.removed_at IS NULL
""")

#: Change processes as their steps decided, one element of each `save_*` array per process
#: (each `set_*` says whether its column changes), and append their events numbered on from
#: each `last_event_id`: `event_refs`, `event_payloads`, `event_metadata` and `event_n` hold
#: every process's events (`event_n`: 1, 2, 3… within a process). The row's lock orders the
#: steps of a process, so event ids have no gap and no repeat; a batch names each process
#: once. `_SAVES` selects the saves (`saves`), `_SAVE` writes them (`saved`: each changed
#: process's new last_event_id; a process that is gone is not changed).
_SAVES = """
    SELECT * FROM unnest(:save_ref::bigint[], :save_task::uuid[], :save_status::text[],
                         :save_set_detail::boolean[], :save_detail::text[],
                         :save_set_aux_state::boolean[], :save_aux_state::text[],
                         :save_set_metadata::boolean[], :save_metadata::text[],
                         :save_set_corrupted_by::boolean[], :save_corrupted_by::uuid[],
                         :save_events::int[], :save_new_timer::uuid[], :save_timer_kind::text[],
                         :save_clear_timer::boolean[], :save_removed::boolean[])
        AS s(process_ref, task_id, status, set_detail, detail, set_aux_state, aux_state,
             set_metadata, metadata, set_corrupted_by, corrupted_by, events, new_timer,
             timer_kind, clear_timer, removed)"""

_SAVE = """
, saved AS (
    UPDATE dl_processes p SET
        status = COALESCE(s.status, p.status),
        detail = CASE WHEN s.set_detail THEN s.detail ELSE p.detail END,
        aux_state = CASE WHEN s.set_aux_state THEN s.aux_state::jsonb ELSE p.aux_state END,
        metadata = CASE WHEN s.set_metadata THEN s.metadata::jsonb ELSE p.metadata END,
        corrupted_by = CASE WHEN s.set_corrupted_by THEN s.corrupted_by ELSE p.corrupted_by END,
        last_event_id = p.last_event_id + s.events,
        timer_task = CASE WHEN s.new_timer IS NOT NULL THEN s.new_timer
                          WHEN s.clear_timer THEN NULL ELSE p.timer_task END,
        timer_kind = CASE WHEN s.new_timer IS NOT NULL THEN s.timer_kind
                          WHEN s.clear_timer THEN NULL ELSE p.timer_kind END,
        timer_at = CASE WHEN s.new_timer IS NOT NULL
                             THEN (SELECT available_at FROM dl_jobs WHERE job_id = s.new_timer)
                        WHEN s.clear_timer THEN NULL ELSE p.timer_at END,
        removed_at = CASE WHEN s.removed THEN now() END,
        updated_at = now()
    FROM saves s
    -- by the primary key, whatever the planner guesses of the arrays' length or of a table
    -- not analyzed yet: a generic plan of the join alone, or one that may use the partial
    -- indexes of live processes (hence `IS TRUE`), reads every live process
    WHERE p.process_ref = ANY(:save_ref::bigint[]) AND p.process_ref = s.process_ref
      AND (p.removed_at IS NULL) IS TRUE
    RETURNING p.process_ref, p.last_event_id, s.events, s.task_id
), saved_events AS (
    INSERT INTO dl_process_events (process_ref, event_id, task_id, payload, metadata)
    SELECT saved.process_ref, saved.last_event_id - saved.events + e.n, saved.task_id,
           e.payload::jsonb, e.metadata::jsonb
    FROM unnest(:event_refs::bigint[], :event_payloads::text[], :event_metadata::text[],
                :event_n::int[]) AS e(process_ref, payload, metadata, n)
    JOIN saved ON saved.process_ref = e.process_ref
)"""

#: The saves alone (inside the transaction that ends their tasks): see _SAVES. Returns each
#: changed process's new last_event_id.
SAVE_PROCESSES: Final = Statement(
    "".join(
        (
            """
WITH saves AS (""",
            _SAVES,
            """
    ORDER BY s.process_ref
)""",
            _SAVE,
            """
SELECT process_ref, last_event_id FROM saved
""",
        )
    )
)

#: FINISH_JOBS (`queries`) and the saves of the tasks it writes, in one statement: a save
#: whose task's end is not written (its fence no longer holds) is not made. For saves that
#: need no statement before them (no timer to enqueue, no task to cancel): one round trip
#: ends a batch of tasks and saves their processes.
FINISH_TASKS: Final = Statement(
    "".join(
        (
            queries.FINISH_JOBS_CTES,
            """
, saves AS (""",
            _SAVES,
            """
    WHERE s.task_id IN (SELECT job_id FROM upd)
    ORDER BY s.process_ref
)""",
            _SAVE,
            queries.FINISH_JOBS_ANSWER,
        )
    )
)


#: Live processes in keyset pages (by `process_ref`, newest first): one statement per filter
#: given, so that each is planned for its index (ix_dl_processes_list, ix_dl_processes_status).
LIST_PROCESSES: Final = {
    (False, False): Statement("""
SELECT p.process_ref, p.namespace, p.process_id, p.queue, p.status, p.detail,
       p.aux_state::text AS aux_state,
       p.metadata::text AS metadata, p.corrupted_by, p.init_args::text AS init_args,
       p.last_event_id, p.timer_task, p.timer_kind, p.timer_at, p.created_at, p.updated_at
FROM dl_processes p
WHERE p.removed_at IS NULL AND p.process_ref < :before
ORDER BY p.process_ref DESC LIMIT :limit
"""),
    (True, False): Statement("""
SELECT p.process_ref, p.namespace, p.process_id, p.queue, p.status, p.detail,
       p.aux_state::text AS aux_state,
       p.metadata::text AS metadata, p.corrupted_by, p.init_args::text AS init_args,
       p.last_event_id, p.timer_task, p.timer_kind, p.timer_at, p.created_at, p.updated_at
FROM dl_processes p
WHERE p.removed_at IS NULL AND p.namespace = :namespace AND p.process_ref < :before
ORDER BY p.namespace, p.process_ref DESC LIMIT :limit
"""),
    (False, True): Statement("""
SELECT p.process_ref, p.namespace, p.process_id, p.queue, p.status, p.detail,
       p.aux_state::text AS aux_state,
       p.metadata::text AS metadata, p.corrupted_by, p.init_args::text AS init_args,
       p.last_event_id, p.timer_task, p.timer_kind, p.timer_at, p.created_at, p.updated_at
FROM dl_processes p
WHERE p.removed_at IS NULL AND p.status = :status AND p.process_ref < :before
ORDER BY p.status, p.process_ref DESC LIMIT :limit
"""),
    (True, True): Statement("""
SELECT p.process_ref, p.namespace, p.process_id, p.queue, p.status, p.detail,
       p.aux_state::text AS aux_state,
       p.metadata::text AS metadata, p.corrupted_by, p.init_args::text AS init_args,
       p.last_event_id, p.timer_task, p.timer_kind, p.timer_at, p.created_at, p.updated_at
FROM dl_processes p
WHERE p.removed_at IS NULL AND p.namespace = :namespace AND p.status = :status
  AND p.process_ref < :before
ORDER BY p.namespace, p.status, p.process_ref DESC LIMIT :limit
"""),
}

#: A page of a live process's history, oldest first, after event `after`.
PROCESS_EVENTS: Final = Statement("""
SELECT e.event_id, e.task_id AS event_task, e.ts AS event_ts, e.payload::text AS payload,
       e.metadata::text AS event_metadata
FROM dl_processes p
JOIN dl_process_events e ON e.process_ref = p.process_ref
WHERE p.namespace = :namespace AND p.process_id = :process_id AND p.removed_at IS NULL
  AND e.event_id > :after
ORDER BY e.event_id
LIMIT :limit
""")

#: The queued tasks of processes (jobs of their lock_keys), to cancel.
QUEUED_TASKS: Final = Statement("""
SELECT job_id, lock_key FROM dl_jobs
WHERE status = 'queued'
  AND hashtext(lock_key) = ANY(ARRAY(SELECT hashtext(k) FROM unnest(:lock_keys::text[]) k))
  AND lock_key = ANY(:lock_keys::text[]) AND NOT lock_free
""")

#: Delete up to `limit` events of processes removed over `after_sec` ago, the longest removed
#: first. Returns how many were deleted.
PRUNE_REMOVED_EVENTS: Final = Statement("""
WITH gone AS (
    DELETE FROM dl_process_events WHERE (process_ref, event_id) IN (
        SELECT e.process_ref, e.event_id
        FROM dl_processes p JOIN dl_process_events e ON e.process_ref = p.process_ref
        WHERE p.removed_at < now() - make_interval(secs => :after_sec::float8)
        ORDER BY p.removed_at
        LIMIT :limit)
    RETURNING 1
)
SELECT count(*) FROM gone
""")

#: Delete up to `limit` processes removed over `after_sec` ago whose events are gone (see
#: PRUNE_REMOVED_EVENTS). Returns how many were deleted.
PRUNE_REMOVED_PROCESSES: Final = Statement("""
WITH gone AS (
    DELETE FROM dl_processes WHERE process_ref IN (
        SELECT p.process_ref FROM dl_processes p
        WHERE p.removed_at < now() - make_interval(secs => :after_sec::float8)
          AND NOT EXISTS (SELECT 1 FROM dl_process_events e WHERE e.process_ref = p.process_ref)
        ORDER BY p.removed_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) FROM gone
""")

#: How many removed processes PRUNE_REMOVED_PROCESSES would delete now, events first.
COUNT_PRUNABLE_PROCESSES: Final = Statement("""
SELECT count(*) FROM dl_processes
WHERE removed_at < now() - make_interval(secs => :after_sec::float8)
""")

#: Live processes in error, per namespace (`limit` looked at: /status says "at least").
PROCESSES_IN_ERROR: Final = Statement("""
SELECT namespace, count(*) AS n
FROM (SELECT namespace FROM dl_processes
      WHERE status = 'error' AND removed_at IS NULL LIMIT :limit) AS broken
GROUP BY namespace ORDER BY namespace
""")

#: The facts of those of `job_ids` still queued, their rows locked (see `cancel_queued`).
QUEUED_FACTS: Final = Statement("""
SELECT job_id, status::text AS status, attempt, max_attempts, handbacks, cancel_requested,
       rerun_requested
FROM dl_jobs WHERE job_id = ANY(:job_ids::uuid[]) AND status = 'queued'
ORDER BY job_id
FOR UPDATE
""")

#: Live processes per namespace and status (an index-only scan of ix_dl_processes_list).
COUNT_PROCESSES: Final = Statement("""
SELECT namespace, status, count(*) AS n
FROM dl_processes WHERE removed_at IS NULL
GROUP BY namespace, status
""")


#: A cursor above every process_ref (the first page).
_NEWEST: Final = 2**63 - 1


# --- values ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepInput:
    """What a step of a process is given: the process with its last events."""

    process_ref: int
    facts: ProcessFacts
    process: Process
    #: Another task of the process still runs (its save is not committed): this one waits.
    busy: bool = False


@dataclass(frozen=True, slots=True)
class StepSave:
    """What the end of a process's task writes to its process, in the transaction of the
    task's end, once that write has passed the task's fence (`Outcome.effects`): the queued
    tasks and timer it cancels, the new timer's job, the process row and its new events."""

    namespace: str
    process_ref: int
    #: The lock_key the process's tasks share.
    lock_key: str
    task_id: uuid.UUID
    write: StepWrite
    timer_job: NewJob | None = None
    #: Which progressor stage its write is timed as (`metrics.PROCESS_STAGES`).
    stage: str = "task_completion"

    @property
    def needs_statements(self) -> bool:
        """Whether its write needs statements before the process's own: a timer's job to
        enqueue, tasks or a timer to cancel."""
        write = self.write
        return (
            self.timer_job is not None
            or write.cancel_queued
            or write.cancel_timer not in (None, self.task_id)
        )

    @classmethod
    def joined(cls, saves: Sequence[StepSave]) -> Joined | None:
        """FINISH_TASKS with `saves`, when none needs statements of its own (the common
        step: events, state, an unset timer) and each is of another process."""
        if any(s.needs_statements for s in saves) or _once_each(saves)[1]:
            return None
        return Joined(
            FINISH_TASKS,
            save_values([(s.process_ref, s.task_id, s.write, None) for s in saves]),
        )

    @classmethod
    async def apply_all(cls, conn: AnyConnection, saves: Sequence[StepSave]) -> None:
        """Write `saves` on `conn`, inside the transaction of their tasks' end (after the
        tasks' states, before the next jobs of their lock_keys are woken or handed off), in
        a few statements whatever their number: the tasks and timers they cancel, the new
        timers' jobs, the processes and their events."""
        saves, later = _once_each(saves)
        # why the queued tasks of a process that is removed, or goes to `error`, never run:
        # what their callers get (`core.processes.refusal_of`)
        why = {s.lock_key: _why_canceled(s.write) for s in saves if s.write.cancel_queued}
        doomed: dict[uuid.UUID, str | None] = {}
        if why:
            rows = await conn.fetch(*QUEUED_TASKS.bind(lock_keys=list(why)))
            doomed = {r["job_id"]: why[r["lock_key"]] for r in rows}
        for s in saves:
            if not s.write.cancel_queued and s.write.cancel_timer is not None:
                doomed[s.write.cancel_timer] = None  # a timer: nobody waits for it
        for s in saves:
            doomed.pop(s.task_id, None)
        if doomed:
            await cancel_queued(conn, doomed)
        with_timer = [s for s in saves if s.timer_job is not None]
        timers = await enqueue_many(
            conn,
            [s.timer_job for s in with_timer],  # type: ignore[misc]  # filtered just above
            actor=PROCESS_ACTOR,
        )
        new_timers = {s.task_id: t.job_id for s, t in zip(with_timer, timers, strict=True)}
        await save_processes(
            conn, [(s.process_ref, s.task_id, s.write, new_timers.get(s.task_id)) for s in saves]
        )
        if later:  # not expected (one task of a process at a time), but then in order
            await cls.apply_all(conn, later)

    @classmethod
    def written(cls, saves: Sequence[StepSave], seconds: float) -> None:
        """Time each save as the progressor stage it is (`seconds`: the write of them all)."""
        for s in saves:
            metrics.observe_process_stage(s.stage, s.namespace, seconds)


def _once_each(saves: Sequence[StepSave]) -> tuple[list[StepSave], list[StepSave]]:
    """`saves` split into the first save of each process and the rest."""
    first: list[StepSave] = []
    rest: list[StepSave] = []
    seen: set[int] = set()
    for save in saves:
        (rest if save.process_ref in seen else first).append(save)
        seen.add(save.process_ref)
    return first, rest


def _why_canceled(write: StepWrite) -> str:
    """The `error` of the queued tasks that the save of `write` cancels."""
    if write.removed:
        return refused_error(Refusal.NOT_FOUND, "the process was removed before the task ran")
    return refused_error(Refusal.IN_ERROR, "the process went in error before the task ran")


async def cancel_queued(conn: AnyConnection, job_errors: Mapping[uuid.UUID, str | None]) -> None:
    """End canceled those jobs of `job_errors` that are still queued, each with its error
    (None: none), in the caller's transaction (their rows locked first, so the fence holds):
    a journal entry each, and whoever waits for them woken, as a client's cancel does."""
    rows = await conn.fetch(*QUEUED_FACTS.bind(job_ids=list(job_errors)))
    items = []
    for row in rows:
        fence = Fence(row["job_id"], transitions.facts_of(row))
        decided = on_cancel(fence.facts)
        if isinstance(decided, Transition):
            if (error := job_errors[fence.job_id]) is not None:
                decided.error = error
            items.append((fence, decided))
    if items:
        states = await set_states(conn, items, actor_role="by", actor=PROCESS_ACTOR)
        await release_keys(conn, states, actor=PROCESS_ACTOR)


#: Who the journal says enqueued a timer, or canceled a process's tasks (`by`).
PROCESS_ACTOR: Final = "process"


@dataclass(frozen=True, slots=True)
class ProcessPage:
    """One page of processes, newest first, and the cursor of the next (None: last)."""

    processes: list[Process]
    next_cursor: int | None


def facts_of(row: Record) -> ProcessFacts:
    return ProcessFacts(
        row["process_ref"],
        ProcessStatus(row["status"]),
        queue=row["queue"],
        timer_task=row["timer_task"],
        init_args_json=row["init_args"],
    )


def process_of(row: Record, history: Sequence[Event] = ()) -> Process:
    timer = None
    if row["timer_task"] is not None:
        timer = Timer(TaskKind(row["timer_kind"]), row["timer_at"], row["timer_task"])
    return Process(
        namespace=row["namespace"],
        process_id=row["process_id"],
        queue=row["queue"],
        status=ProcessStatus(row["status"]),
        detail=row["detail"],
        aux_state=_loads(row["aux_state"]),
        metadata=_loads(row["metadata"]) or {},
        last_event_id=row["last_event_id"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        timer=timer,
        corrupted_by=row["corrupted_by"],
        history=history,
    )


def event_of(row: Record) -> Event:
    return Event(
        event_id=row["event_id"],
        payload=_loads(row["payload"]),
        metadata=_loads(row["event_metadata"]),
        task_id=row["event_task"],
        ts=row["event_ts"],
    )


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# --- operations ------------------------------------------------------------------------------


async def start_process(
    conn: AnyConnection,
    namespace: str,
    process_id: str,
    queue: str,
    init_args_json: str,
    metadata_json: str,
) -> tuple[ProcessFacts, bool]:
    """The process `process_id` of `namespace`: taken now for a new one (True), or the live
    process that holds the id (False: the caller compares its init args)."""
    while True:
        ref = await conn.fetchval(
            *START_PROCESS.bind(
                namespace=namespace,
                process_id=process_id,
                queue=queue,
                init_args=init_args_json,
                metadata=metadata_json,
            )
        )
        if ref is not None:
            return ProcessFacts(
                ref, ProcessStatus.INIT, queue=queue, init_args_json=init_args_json
            ), True
        existing = await process_facts(conn, namespace, process_id)
        if existing is not None:  # else removed meanwhile: the id is free again
            return existing, False


async def process_facts(
    conn: AnyConnection, namespace: str, process_id: str
) -> ProcessFacts | None:
    row = await conn.fetchrow(*PROCESS_FACTS.bind(namespace=namespace, process_id=process_id))
    return None if row is None else facts_of(row)


async def removed_facts(
    conn: AnyConnection, namespace: str, process_id: str
) -> ProcessFacts | None:
    """The newest removed incarnation of the id, if retention has not pruned it."""
    row = await conn.fetchrow(*REMOVED_FACTS.bind(namespace=namespace, process_id=process_id))
    return None if row is None else facts_of(row)


async def key_holder(conn: AnyConnection, idempotency_key: str) -> uuid.UUID | None:
    """The task (job) that holds `idempotency_key`, if any."""
    holder: uuid.UUID | None = await conn.fetchval(
        *queries.JOB_BY_IDEMPOTENCY_KEY.bind(idempotency_key=idempotency_key)
    )
    return holder


async def get_process(conn: AnyConnection, namespace: str, process_id: str) -> Process | None:
    row = await conn.fetchrow(*GET_PROCESS.bind(namespace=namespace, process_id=process_id))
    return None if row is None else process_of(row)


async def step_input(
    conn: AnyConnection, process_ref: int, history: int, task_id: uuid.UUID, lock_key: str
) -> StepInput | None:
    """The live incarnation `process_ref` with its last `history` events, as the task
    `task_id` (of `lock_key`) finds it (None: gone)."""
    row = await conn.fetchrow(
        *STEP_INPUT.bind(
            process_ref=process_ref, history=history, task_id=task_id, lock_key=lock_key
        )
    )
    if row is None:
        return None
    events = LazyHistory(row["history"] or "[]")
    return StepInput(process_ref, facts_of(row), process_of(row, events), busy=row["busy"])


class LazyHistory(Sequence[Event]):
    """The events of a step's input, decoded from their JSON array on first use: most steps
    read few of them, or none, and a hundred events cost more to decode than the rest of a
    step."""

    __slots__ = ("_decoded", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._decoded: tuple[Event, ...] | None = None

    def _events(self) -> tuple[Event, ...]:
        if self._decoded is None:
            self._decoded = tuple(
                Event(
                    event_id=e["event_id"],
                    payload=e["payload"],
                    metadata=e["metadata"],
                    task_id=uuid.UUID(e["task_id"]),
                    ts=datetime.fromisoformat(e["ts"]),
                )
                for e in json.loads(self._text)
            )
        return self._decoded

    @overload
    def __getitem__(self, index: int) -> Event: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Event, ...]: ...
    def __getitem__(self, index: int | slice) -> Event | tuple[Event, ...]:
        return self._events()[index]

    def __len__(self) -> int:
        return len(self._events())

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) else other)

    def __hash__(self) -> int:
        return hash(self._events())

    def __repr__(self) -> str:
        return repr(self._events())


async def save_processes(
    conn: AnyConnection,
    saves: Sequence[tuple[int, uuid.UUID, StepWrite, uuid.UUID | None]],
) -> dict[int, int]:
    """Apply each `(process_ref, task_id, write, new_timer)` of `saves` (distinct processes)
    to its process, inside the transaction that ends the task: its columns, its events, its
    timer (`new_timer`: the timer task just inserted). {process_ref: new last_event_id} of
    those changed (a process that is gone is not)."""
    rows = await conn.fetch(*SAVE_PROCESSES.bind(**save_values(saves)))
    return {r["process_ref"]: r["last_event_id"] for r in rows}


def save_values(
    saves: Sequence[tuple[int, uuid.UUID, StepWrite, uuid.UUID | None]],
) -> dict[str, list[Any]]:
    """The values of `_SAVES` and `_SAVE` for `saves` (see `save_processes`)."""
    values: dict[str, list[Any]] = {name: [] for name in _SAVE_PARAMETERS}
    for process_ref, task_id, write, new_timer in saves:
        for name, value in (
            ("save_ref", process_ref),
            ("save_task", task_id),
            ("save_status", None if write.status is None else write.status.value),
            ("save_set_detail", write.detail is not KEEP),
            ("save_detail", None if write.detail is KEEP else write.detail),
            ("save_set_aux_state", write.aux_state_json is not KEEP),
            ("save_aux_state", None if write.aux_state_json is KEEP else write.aux_state_json),
            ("save_set_metadata", write.metadata_json is not KEEP),
            ("save_metadata", None if write.metadata_json is KEEP else write.metadata_json),
            ("save_set_corrupted_by", write.corrupted_by is not KEEP),
            ("save_corrupted_by", None if write.corrupted_by is KEEP else write.corrupted_by),
            ("save_events", len(write.events)),
            ("save_new_timer", new_timer),
            ("save_timer_kind", None if write.new_timer is None else write.new_timer.kind.value),
            ("save_clear_timer", write.clear_timer),
            ("save_removed", write.removed),
        ):
            values[name].append(value)
        for n, (payload, metadata) in enumerate(write.events, start=1):
            values["event_refs"].append(process_ref)
            values["event_payloads"].append(payload)
            values["event_metadata"].append(metadata)
            values["event_n"].append(n)
    return values


#: The parameters `save_values` gives.
_SAVE_PARAMETERS: Final = tuple(SAVE_PROCESSES.names)


async def list_processes(
    conn: AnyConnection,
    *,
    namespace: str | None,
    status: ProcessStatus | None,
    limit: int,
    before: int | None = None,
) -> ProcessPage:
    """Live processes newest first; `before` is the `next_cursor` of the previous page."""
    values: dict[str, Any] = {"before": before or _NEWEST, "limit": limit + 1}
    if namespace is not None:
        values["namespace"] = namespace
    if status is not None:
        values["status"] = status.value
    statement = LIST_PROCESSES[namespace is not None, status is not None]
    rows = await conn.fetch(*statement.bind(**values))
    page = rows[:limit]
    cursor = page[-1]["process_ref"] if len(rows) > limit else None
    return ProcessPage([process_of(r) for r in page], cursor)


async def process_events(
    conn: AnyConnection, namespace: str, process_id: str, after: int, limit: int
) -> list[Event]:
    rows = await conn.fetch(
        *PROCESS_EVENTS.bind(namespace=namespace, process_id=process_id, after=after, limit=limit)
    )
    return [event_of(r) for r in rows]


async def count_processes(conn: AnyConnection) -> dict[tuple[str, str], int]:
    """Live processes by (namespace, status)."""
    return {(r["namespace"], r["status"]): r["n"] for r in await conn.fetch(COUNT_PROCESSES.sql)}
