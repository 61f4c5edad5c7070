"""Durable processes in PostgreSQL: the statements over `dl_processes` and `dl_process_events`
(migration 0020), and the reads and writes built on them.

A process's tasks are jobs (`storage/repositories.py` inserts them, the worker protocol claims
and ends them); what is here is the process itself: its row, taken when started, read before a
step with the last events of its history, changed by the step's save in the same transaction
as the task's end (`save_step`), listed and counted for readers. JSON travels as text, as for
jobs, whatever codecs a connection has.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Final

from asyncpg import Record

from dataloader import metrics
from dataloader.core.models import NewJob
from dataloader.core.processes import (
    KEEP,
    Event,
    Process,
    ProcessFacts,
    ProcessStatus,
    StepWrite,
    TaskKind,
    Timer,
)
from dataloader.core.transitions import Transition, on_cancel
from dataloader.storage import transitions
from dataloader.storage.db import AnyConnection
from dataloader.storage.repositories import enqueue
from dataloader.storage.statement import Statement
from dataloader.storage.transitions import Fence, release_keys, set_states

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


#: A live process as readers see it, by its id.
GET_PROCESS: Final = Statement("""
SELECT p.process_ref, p.namespace, p.process_id, p.queue, p.status, p.detail,
       p.aux_state::text AS aux_state,
       p.metadata::text AS metadata, p.corrupted_by, p.init_args::text AS init_args,
       p.last_event_id, p.timer_task, p.timer_kind, p.timer_at, p.created_at, p.updated_at
FROM dl_processes p
WHERE p.namespace = :namespace AND p.process_id = :process_id AND p.removed_at IS NULL
""")

#: A process (by incarnation) and the last `history` events of its history, oldest first: one
#: row per event, or one row without an event; and whether another task of the process
#: (another job of its lock_key than `task_id`) is still running, in the same snapshot: two
#: replicas' claims can each take a task of a process at once, and a task that ends lets its
#: advisory lock go before its save commits, so a task that found its process busy must not
#: run on the state it read. The events are read from the primary key's
#: range above `last_event_id - history`: a process of a million events costs what one of ten
#: does.
STEP_INPUT: Final = Statement("""
SELECT p.process_ref, p.namespace, p.process_id, p.queue, p.status, p.detail,
       p.aux_state::text AS aux_state,
       p.metadata::text AS metadata, p.corrupted_by, p.init_args::text AS init_args,
       p.last_event_id, p.timer_task, p.timer_kind, p.timer_at, p.created_at, p.updated_at,
       e.event_id, e.task_id AS event_task, e.ts AS event_ts, e.payload::text AS payload,
       e.metadata::text AS event_metadata,
       EXISTS (SELECT 1 FROM dl_jobs r
               WHERE (r.status = 'running') IS TRUE
                 AND hashtext(r.lock_key) = hashtext(:lock_key) AND r.lock_key = :lock_key
                 AND r.job_id <> :task_id) AS busy
FROM dl_processes p
LEFT JOIN LATERAL (
    SELECT * FROM dl_process_events e
    WHERE e.process_ref = p.process_ref AND e.event_id > p.last_event_id - :history
    ORDER BY e.event_id
) e ON true
WHERE p.process_ref = :process_ref AND p.removed_at IS NULL
ORDER BY e.event_id
""")

#: Change a process as a step decided (each `set_*` says whether its column changes), append
#: its events numbered on from `last_event_id`, in one statement. The row's lock orders the
#: steps of a process, so event ids have no gap and no repeat. Returns the new last_event_id
#: (no row: the process is gone).
SAVE_PROCESS: Final = Statement("""
WITH upd AS (
    UPDATE dl_processes SET
        status = COALESCE(:status::text, status),
        detail = CASE WHEN :set_detail::boolean THEN :detail::text ELSE detail END,
        aux_state = CASE WHEN :set_aux_state::boolean THEN :aux_state::text::jsonb
                         ELSE aux_state END,
        metadata = CASE WHEN :set_metadata::boolean THEN :metadata::text::jsonb
                        ELSE metadata END,
        corrupted_by = CASE WHEN :set_corrupted_by::boolean THEN :corrupted_by::uuid
                            ELSE corrupted_by END,
        last_event_id = last_event_id + cardinality(:payloads::text[]),
        timer_task = CASE WHEN :new_timer::uuid IS NOT NULL THEN :new_timer::uuid
                          WHEN :clear_timer::boolean THEN NULL ELSE timer_task END,
        timer_kind = CASE WHEN :new_timer::uuid IS NOT NULL THEN :timer_kind::text
                          WHEN :clear_timer::boolean THEN NULL ELSE timer_kind END,
        timer_at = CASE WHEN :new_timer::uuid IS NOT NULL
                             THEN (SELECT available_at FROM dl_jobs WHERE job_id = :new_timer::uuid)
                        WHEN :clear_timer::boolean THEN NULL ELSE timer_at END,
        removed_at = CASE WHEN :removed::boolean THEN now() END,
        updated_at = now()
    WHERE process_ref = :process_ref::bigint AND removed_at IS NULL
    RETURNING last_event_id
), ev AS (
    INSERT INTO dl_process_events (process_ref, event_id, task_id, payload, metadata)
    SELECT :process_ref::bigint, upd.last_event_id - cardinality(:payloads::text[]) + e.n,
           :task_id::uuid, e.payload::jsonb, e.metadata::jsonb
    FROM upd, unnest(:payloads::text[], :event_metadata::text[]) WITH ORDINALITY
         AS e(payload, metadata, n)
)
SELECT last_event_id FROM upd
""")


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

#: The queued tasks of a process (jobs of its lock_key), to cancel.
QUEUED_TASKS: Final = Statement("""
SELECT job_id FROM dl_jobs
WHERE status = 'queued' AND hashtext(lock_key) = hashtext(:lock_key) AND lock_key = :lock_key
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

    async def apply(self, conn: AnyConnection) -> None:
        """Write it on `conn`, inside the transaction of the task's end (after the task's
        state, before the next job of its lock_key is woken or handed off)."""
        started = time.perf_counter()
        write = self.write
        doomed: list[uuid.UUID] = []
        if write.cancel_queued:
            doomed = [
                r["job_id"] for r in await conn.fetch(*QUEUED_TASKS.bind(lock_key=self.lock_key))
            ]
        elif write.cancel_timer is not None:
            doomed = [write.cancel_timer]
        doomed = [job_id for job_id in doomed if job_id != self.task_id]
        if doomed:
            await cancel_queued(conn, doomed)
        new_timer = None
        if self.timer_job is not None:
            new_timer = (await enqueue(conn, self.timer_job, actor=PROCESS_ACTOR)).job_id
        await save_process(conn, self.process_ref, self.task_id, self.write, new_timer)
        metrics.observe_process_stage(self.stage, self.namespace, time.perf_counter() - started)


async def cancel_queued(conn: AnyConnection, job_ids: list[uuid.UUID]) -> None:
    """End canceled those of `job_ids` that are still queued, in the caller's transaction
    (their rows locked first, so the fence holds): a journal entry each, and whoever waits
    for them woken, as a client's cancel does."""
    rows = await conn.fetch(*QUEUED_FACTS.bind(job_ids=job_ids))
    items = []
    for row in rows:
        fence = Fence(row["job_id"], transitions.facts_of(row))
        decided = on_cancel(fence.facts)
        if isinstance(decided, Transition):
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


def process_of(row: Record, history: tuple[Event, ...] = ()) -> Process:
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


async def get_process(conn: AnyConnection, namespace: str, process_id: str) -> Process | None:
    row = await conn.fetchrow(*GET_PROCESS.bind(namespace=namespace, process_id=process_id))
    return None if row is None else process_of(row)


async def step_input(
    conn: AnyConnection, process_ref: int, history: int, task_id: uuid.UUID, lock_key: str
) -> StepInput | None:
    """The live incarnation `process_ref` with its last `history` events, as the task
    `task_id` (of `lock_key`) finds it (None: gone)."""
    rows = await conn.fetch(
        *STEP_INPUT.bind(
            process_ref=process_ref, history=history, task_id=task_id, lock_key=lock_key
        )
    )
    if not rows:
        return None
    events = tuple(event_of(r) for r in rows if r["event_id"] is not None)
    return StepInput(
        process_ref, facts_of(rows[0]), process_of(rows[0], events), busy=rows[0]["busy"]
    )


async def save_process(
    conn: AnyConnection,
    process_ref: int,
    task_id: uuid.UUID,
    write: StepWrite,
    new_timer: uuid.UUID | None = None,
) -> int | None:
    """Apply `write` to the process (inside the transaction that ends the task): its columns,
    its events, its timer (`new_timer`: the timer task just inserted). The new last_event_id;
    None if the process is gone."""
    payloads = [payload for payload, _ in write.events]
    metadata = [meta for _, meta in write.events]
    value: int | None = await conn.fetchval(
        *SAVE_PROCESS.bind(
            process_ref=process_ref,
            task_id=task_id,
            status=None if write.status is None else write.status.value,
            set_detail=write.detail is not KEEP,
            detail=None if write.detail is KEEP else write.detail,
            set_aux_state=write.aux_state_json is not KEEP,
            aux_state=None if write.aux_state_json is KEEP else write.aux_state_json,
            set_metadata=write.metadata_json is not KEEP,
            metadata=None if write.metadata_json is KEEP else write.metadata_json,
            set_corrupted_by=write.corrupted_by is not KEEP,
            corrupted_by=None if write.corrupted_by is KEEP else write.corrupted_by,
            payloads=payloads,
            event_metadata=metadata,
            new_timer=new_timer,
            timer_kind=None if write.new_timer is None else write.new_timer.kind.value,
            clear_timer=write.clear_timer,
            removed=write.removed,
        )
    )
    return value


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
