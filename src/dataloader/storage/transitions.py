"""Writing decided transitions (`dataloader.core.transitions`), fenced.

Workers (outcomes), the reaper (expired leases) and clients (cancel, retry, re-run) decide a
job's next state on a snapshot of its row, then write it here, only if the row still matches
that snapshot (`Fence`). A row that changed comes back with its facts now, to decide again.

`settle` is that loop, once for every writer: read facts (the caller's), decide with a pure
rule, write fenced, decide again the rows the write found changed, for a bounded number of
rounds. Each caller brings its rule and its write (`writer` for the plain statement, or its
own around it) and gets back what was written.

A write has three parts, each a statement of its own (`queries`):

1. `set_states` (SET_JOB_STATES): the new state of each job whose fence holds, with its
   journal row; it says which jobs were written, and which of them free a lock_key that a
   due job waits for;
2. `release_keys`: the next job of each such key is woken, or put back into the claim's order
   (WAKE_LOCK_WAITERS), then, for a worker keeping a slot for it, claimed for that worker
   (HAND_OFF_NEXT); each runs only when it has work.

The seam: whatever must be written with a job's new state, and only if its fence holds, goes
between the two, on the same connection, in the same transaction:

    async with pool.transaction() as conn:
        states = await set_states(conn, items, actor_role="worker", actor=worker_id)
        for job_id in states.written:  # the jobs whose fence held
            ...  # the caller's own statements (a process row, its events, its timer jobs)
        applied = await release_keys(conn, states, actor=worker_id, hand_off=…, claim_seed=…)

A caller's statement that fails rolls the whole write back: the jobs are still the caller's,
to write again. A job handed off is claimed by `release_keys`: a caller whose answer may be
lost derives `claim_seed` as `protocol.ClaimTokens` does (the worker's `finish` with stages
is such a caller). `apply_transitions` is both parts in one statement, one round trip
(FINISH_JOBS), for a write with nothing of its own between them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Generic, Literal, TypeVar

from asyncpg import Record

from dataloader.base import JobStatus
from dataloader.core.transitions import KEEP, JobFacts, Transition
from dataloader.storage import queries
from dataloader.storage.db import AnyConnection, storable_text
from dataloader.storage.statement import Statement

#: A pool's or a connection's `fetch`.
Fetch = Callable[..., Awaitable[list[Record]]]

#: The claim seed of a statement that hands nothing off (any value would do).
NO_SEED: Final = uuid.UUID(int=0)


@dataclass(frozen=True, slots=True)
class Fence:
    """What the row must still be for a transition to be written: the facts it was decided
    on, the claim that decided it (None: a job nobody runs), and, for the reaper, a lease
    still expired or an owner still gone (its presence lapsed: `queries.EXPIRED_JOBS`)."""

    job_id: uuid.UUID
    facts: JobFacts
    claim_token: uuid.UUID | None = None
    expired: bool = False


@dataclass(frozen=True, slots=True)
class Applied:
    """What became of one transition."""

    #: written; changed (the row's attempt or flags differ: decide again on `facts`); busy
    #: (someone else holds the row: try again later).
    state: Literal["written", "changed", "busy"]
    #: written: whether the job woken next had waited because of a lock_key collision.
    collision: bool = False
    #: changed: the row's facts now.
    facts: JobFacts | None = None
    #: written: the next job of the freed lock_key, claimed for the caller (`hand_off`), as
    #: the database wrote it (see `WorkerProtocol.finish`).
    handed: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Freed:
    """A job SET_JOB_STATES wrote that frees a lock_key a due job waits for."""

    job_id: uuid.UUID
    lock_key: str
    queue: str
    #: Whether it left `running` (else it was queued, and ended): its waiter is woken.
    left_running: bool
    #: Whether it is in `running` no more (its next job may be handed off).
    stopped: bool


@dataclass(frozen=True, slots=True)
class StatesSet:
    """What `set_states` did: each job's `Applied`, and the keys it freed that jobs wait for."""

    applied: dict[uuid.UUID, Applied]
    freed: list[Freed]

    @property
    def written(self) -> list[uuid.UUID]:
        """The jobs whose fence held: written, in the caller's transaction."""
        return [job_id for job_id, a in self.applied.items() if a.state == "written"]


async def set_states(
    conn: AnyConnection,
    items: Sequence[tuple[Fence, Transition]],
    *,
    actor_role: str,
    actor: str,
) -> StatesSet:
    """Set the state of each job whose fence holds, with its journal row (SET_JOB_STATES), on
    `conn`, inside its transaction: the caller's statements that must go with the new states
    follow on the same connection, then `release_keys`. A job missing from the answer no
    longer matches its fence (it is not the caller's any more)."""
    if not items:
        return StatesSet({}, [])
    rows = await conn.fetch(
        *queries.SET_JOB_STATES.bind(**parameters_of(items), actor_role=actor_role, actor=actor)
    )
    return StatesSet(
        {row["job_id"]: _applied(row) for row in rows},
        [
            Freed(
                row["job_id"],
                row["lock_key"],
                row["queue"],
                left_running=row["left_status"] == "running",
                stopped=row["left_status"] == "running" and row["took_status"] != "running",
            )
            for row in rows
            if row["waiter"]
        ],
    )


async def release_keys(
    conn: AnyConnection,
    states: StatesSet,
    *,
    actor: str,
    wakes_own_queue: bool = False,
    hand_off: Sequence[uuid.UUID] = (),
    claim_seed: uuid.UUID = NO_SEED,
) -> dict[uuid.UUID, Applied]:
    """After `set_states`, in the same transaction: wake the next job of each lock_key freed
    (WAKE_LOCK_WAITERS), then claim for `actor` the next job of each key freed by a job named
    in `hand_off`, when it is of the same queue (HAND_OFF_NEXT), its token derived from
    `claim_seed` (see `protocol.ClaimTokens`). A statement only runs when it has work: a key
    nobody waits for costs no round trip. Returns `states.applied`, the written jobs with
    whether their next job collided and the job handed to the caller."""
    applied = states.applied
    if not states.freed:
        return applied
    written = states.written
    asked = set(hand_off)
    handing = [f for f in states.freed if f.stopped and f.job_id in asked]
    rows = await conn.fetch(
        *queries.WAKE_LOCK_WAITERS.bind(
            job_ids=[f.job_id for f in states.freed],
            lock_keys=[f.lock_key for f in states.freed],
            queues=[f.queue for f in states.freed],
            left_running=[f.left_running for f in states.freed],
            handing=[f in handing for f in states.freed],
            written_ids=written,
            wakes_own_queue=wakes_own_queue,
        )
    )
    for row in rows:
        if row["collision"]:
            applied[row["job_id"]] = replace(applied[row["job_id"]], collision=True)
    if not handing:
        return applied
    rows = await conn.fetch(
        *queries.HAND_OFF_NEXT.bind(
            job_ids=[f.job_id for f in handing],
            lock_keys=[f.lock_key for f in handing],
            queues=[f.queue for f in handing],
            written_ids=written,
            claim_seed=claim_seed,
            actor=actor,
        )
    )
    for row in rows:
        applied[row["after"]] = replace(applied[row["after"]], handed=json.loads(row["handed"]))
    return applied


@dataclass(frozen=True, slots=True)
class Joined:
    """A statement that is FINISH_JOBS and more (it writes other rows with the jobs' states,
    reading `upd`, and answers as FINISH_JOBS does), and the values of its further
    parameters."""

    statement: Statement
    values: Mapping[str, Any]


async def apply_transitions(
    fetch: Fetch,
    items: Sequence[tuple[Fence, Transition]],
    *,
    actor_role: str,
    actor: str,
    wakes_own_queue: bool = False,
    hand_off: Sequence[uuid.UUID] = (),
    claim_seed: uuid.UUID = NO_SEED,
    joined: Joined | None = None,
) -> dict[uuid.UUID, Applied]:
    """`set_states` then `release_keys` in one statement, one round trip (FINISH_JOBS, or
    `joined`'s statement, which writes more with them), on `fetch` (a pool's, or a
    connection's): for a write that adds no statement of its own between them. A job missing
    from the answer no longer matches its fence (it is not the caller's any more)."""
    if not items:
        return {}
    statement = queries.FINISH_JOBS if joined is None else joined.statement
    rows = await fetch(
        *statement.bind(
            **(joined.values if joined is not None else {}),
            **parameters_of(items),
            actor_role=actor_role,
            actor=actor,
            wakes_own_queue=wakes_own_queue,
            hand_off=list(hand_off),
            claim_seed=claim_seed,
        )
    )
    return {row["job_id"]: _finished(row) for row in rows}


D = TypeVar("D")

#: A pure decision on a fenced row's facts (`core.transitions`): what to write, or None.
Rule = Callable[[Fence], D | None]
#: Writes decided items fenced: what became of each (a job missing: its fence no longer holds).
Write = Callable[[list[tuple[Fence, D]]], Awaitable[Mapping[uuid.UUID, Applied]]]
#: Reads the facts of jobs again (a job missing: there is no such job any more).
Reread = Callable[[list[uuid.UUID]], Awaitable[Mapping[uuid.UUID, JobFacts]]]


@dataclass(frozen=True, slots=True)
class WrittenDecision(Generic[D]):
    """One decision `settle` wrote: the fence it was decided on, and what the write said."""

    fence: Fence
    decision: D
    applied: Applied


@dataclass(slots=True)
class Settled(Generic[D]):
    """What `settle` did with each fence, by job id."""

    written: dict[uuid.UUID, WrittenDecision[D]] = field(default_factory=dict)
    #: The fence no longer holds (not the caller's any more), or, with a reread, no such job.
    gone: list[uuid.UUID] = field(default_factory=list)
    #: Someone else held the row: try again later (the fence as last decided on).
    busy: dict[uuid.UUID, Fence] = field(default_factory=dict)
    #: Still changing after the last round (the fence with the row's facts as last known).
    changing: dict[uuid.UUID, Fence] = field(default_factory=dict)
    #: The rule decided nothing (on the facts of this fence).
    undecided: dict[uuid.UUID, Fence] = field(default_factory=dict)


async def settle(
    fences: Sequence[Fence],
    rule: Rule[D],
    write: Write[D],
    *,
    rounds: int,
    reread: Reread | None = None,
) -> Settled[D]:
    """Decide each fenced row with `rule` and `write` the decisions; a row the write found
    changed is decided again on its facts now, up to `rounds` decisions in all. With `reread`
    (a client, which owns no job), every row not written (changed, held elsewhere, or no longer
    matching its fence) is read again before it is decided again; without it, a row held
    elsewhere comes back `busy` and one no longer matching its fence `gone`."""
    settled: Settled[D] = Settled()
    pending = list(fences)
    for n in range(rounds):
        if n and reread is not None:
            now = await reread([f.job_id for f in pending])
            settled.gone += [f.job_id for f in pending if f.job_id not in now]
            pending = [replace(f, facts=now[f.job_id]) for f in pending if f.job_id in now]
        decided: list[tuple[Fence, D]] = []
        for fence in pending:
            decision = rule(fence)
            if decision is None:
                settled.undecided[fence.job_id] = fence
            else:
                decided.append((fence, decision))
        applied = await write(decided) if decided else {}
        pending = []
        for fence, decision in decided:
            found = applied.get(fence.job_id)
            if found is not None and found.state == "written":
                settled.written[fence.job_id] = WrittenDecision(fence, decision, found)
            elif reread is not None:
                pending.append(fence)
            elif found is None:
                settled.gone.append(fence.job_id)
            elif found.state == "changed" and found.facts is not None:
                pending.append(replace(fence, facts=found.facts))
            else:
                settled.busy[fence.job_id] = fence
        if not pending:
            return settled
    settled.changing.update((f.job_id, f) for f in pending)
    return settled


def writer(fetch: Fetch, *, actor_role: str, actor: str) -> Write[Transition]:
    """The plain write of `settle`: `apply_transitions` on `fetch`, as `actor`."""

    async def write(items: list[tuple[Fence, Transition]]) -> Mapping[uuid.UUID, Applied]:
        return await apply_transitions(fetch, items, actor_role=actor_role, actor=actor)

    return write


#: SET_JOB_STATES's arrays of shapes (what jobs of one batch mostly share), in order.
SHAPE_COLUMNS: Final = (
    "expect_status",
    "expect_attempt",
    "expect_cancel",
    "expect_rerun",
    "expect_expired",
    "status",
    "attempt",
    "handbacks",
    "retry_in",
    "error",
    "args",
    "journal",
    "detail",
    "finished",
    "set_error",
    "set_result",
    "set_duration",
    "clear_start",
    "clear_checkpoint",
    "set_cancel",
    "set_rerun",
)


def parameters_of(items: Sequence[tuple[Fence, Transition]]) -> dict[str, list[Any]]:
    """SET_JOB_STATES's parameters. What varies from job to job (its id, claim token,
    result and duration) is sent per job; the rest of a fence and its transition (statuses,
    counters, error, journal entry, yes/no columns) is sent once per distinct shape, which each job
    names by its position: the outcomes of a flush mostly share one shape, and every element
    of an array costs its encoding."""
    shapes: dict[tuple[Any, ...], int] = {}
    job_ids: list[uuid.UUID] = []
    tokens: list[uuid.UUID | None] = []
    kinds: list[int] = []
    results: list[str | None] = []
    durations: list[int | None] = []
    for fence, t in items:
        facts = fence.facts
        shape = (
            facts.status.value,
            facts.attempt,
            facts.cancel_requested,
            facts.rerun_requested,
            fence.expired,
            t.status.value,
            t.attempt,
            t.handbacks,
            t.retry_in_sec if t.status is JobStatus.QUEUED else None,
            None if t.error is KEEP or t.error is None else storable_text(t.error),
            t.args_json,
            t.journal,
            json.dumps(_storable(t.detail)) if t.detail else None,
            t.finished,
            t.error is not KEEP,
            t.result is not KEEP,
            t.duration_ms is not KEEP,
            t.clear_start,
            t.clear_checkpoint,
            None if t.cancel_requested is KEEP else bool(t.cancel_requested),
            None if t.rerun_requested is KEEP else bool(t.rerun_requested),
        )
        kinds.append(shapes.setdefault(shape, len(shapes) + 1))
        job_ids.append(fence.job_id)
        tokens.append(fence.claim_token)
        results.append(None if t.result is KEEP else t.result)
        durations.append(None if t.duration_ms is KEEP else t.duration_ms)
    columns = dict(zip(SHAPE_COLUMNS, map(list, zip(*shapes, strict=True)), strict=True))
    return {
        "job_ids": job_ids,
        "expect_tokens": tokens,
        "kinds": kinds,
        "results": results,
        "durations": durations,
        **columns,
    }


def _storable(value: Any) -> Any:
    """`value` (a journal entry's detail) with every string storable in jsonb: an error text
    or a retry policy's complaint may quote a task's own message, NUL and lone surrogates
    included, which jsonb refuses (and with them the statement writing every outcome of a
    flush)."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, Mapping):
        return {storable_text(str(k)): _storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(v) for v in value]
    return value


def _finished(row: Record) -> Applied:
    """What FINISH_JOBS did with one job."""
    if row["state"] != "changed":
        handed = None if row["handed"] is None else json.loads(row["handed"])
        return Applied(row["state"], row["collision"], handed=handed)
    return Applied("changed", facts=facts_of(row))


def _applied(row: Record) -> Applied:
    if row["state"] != "changed":
        return Applied(row["state"])
    return Applied("changed", facts=facts_of(row))


def facts_of(row: Record) -> JobFacts:
    """A job's facts from a row with its status, attempt, max_attempts, handbacks and flags."""
    return JobFacts(
        status=JobStatus(row["status"]),
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        handbacks=row["handbacks"],
        cancel_requested=row["cancel_requested"],
        rerun_requested=row["rerun_requested"],
    )
