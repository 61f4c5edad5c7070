"""The worker protocol: claim, lock, keep the lease, record progress and checkpoints, finish,
reap. Only dataloader's own workers use it; the public API is the client
(`storage/repositories.py`, `dataloader.Client`).

Every write after a claim is fenced on the claim's token (see `queries`); outcomes are
decided in `dataloader.core.transitions` and written by `storage.transitions`.

A write that claims jobs (a claim, or an outcome's write handing off the next job of a
lock_key) may commit and still lose its answer (the connection cut after COMMIT): its jobs would
run under this worker with tokens it never learnt, nobody running them until their lease ran
out, and then at the cost of an attempt. The worker draws each such write's seed, so it knows
every token the write could have given (`ClaimTokens`); when the answer is lost, it looks those
jobs up once the database answers again (`ClaimAnswerLost` carries them), to run them or hand
them back.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self, TypeVar

from asyncpg import Record

from dataloader.base import JobStatus
from dataloader.core.due import PutBack
from dataloader.core.models import NewJob
from dataloader.core.transitions import JobFacts, Transition
from dataloader.storage import queries
from dataloader.storage.connections import GuardedPool
from dataloader.storage.db import (
    CONNECTION_ERRORS,
    DEFAULT_TIMEOUT_SEC,
    AnyConnection,
    Connection,
    Pool,
)
from dataloader.storage.repositories import enqueue_many
from dataloader.storage.transitions import (
    Applied,
    Fence,
    Joined,
    Write,
    apply_transitions,
    facts_of,
    release_keys,
    set_states,
    writer,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The most jobs of one running lock_key parked with those a claim walked past, per statement
#: (a few hundred milliseconds of row updates at most; a longer run takes a few statements).
PARK_SIBLINGS = 10_000
#: First and longest pause between look-ups of the jobs of a write whose answer was lost.
RECOVER_FIRST_SEC = 0.05
RECOVER_MAX_SEC = 2.0


@dataclass(slots=True)
class ClaimedJob:
    """A job this worker now runs; `claim_token` fences every later write (unlike `attempt`,
    it is never given to another claim, even when this one is handed back with a refund, nor
    after a failover that lost the last claims; `claim_seq` counts the job's claims). A value,
    as the core's facts are (not frozen for the same reason: one is built per job)."""

    job_id: uuid.UUID
    queue: str
    task: str
    args: dict[str, Any]
    #: Its lock_key and the hash its advisory lock is taken on; both None for a job that runs
    #: without mutual exclusion (enqueued without a lock_key, `lock_free`: it takes no lock).
    lock_key: str | None
    lock_hash: int | None
    partition_key: str
    priority: int
    attempt: int
    max_attempts: int
    lease_ttl_sec: int
    cancel_requested: bool
    claim_seq: int
    claim_token: uuid.UUID
    handbacks: int = 0
    rerun_requested: bool = False
    #: The checkpoint an earlier attempt saved (None: start from the beginning).
    checkpoint: Any = None
    #: Seconds from the moment it was due to its claim (None: not measured, a hand-off).
    waited_sec: float | None = None

    def facts(self, cancel_requested: bool | None = None) -> JobFacts:
        """The job as claimed, for deciding its outcome (with a cancel request learnt since,
        when given)."""
        return JobFacts(
            status=JobStatus.RUNNING,
            attempt=self.attempt,
            max_attempts=self.max_attempts,
            handbacks=self.handbacks,
            cancel_requested=self.cancel_requested
            if cancel_requested is None
            else cancel_requested,
            rerun_requested=self.rerun_requested,
        )


@dataclass(frozen=True, slots=True)
class ClaimTokens:
    """Every token a claiming write may give its jobs: the md5 of its `seed` and each of
    `suffixes` (a claim's row numbers, a hand-off's finished job ids; see
    `queries.RECOVER_CLAIMS`)."""

    worker_id: str
    seed: uuid.UUID
    suffixes: list[str]

    @classmethod
    def of_claim(cls, worker_id: str, limit: int) -> ClaimTokens:
        """The tokens of a claim of up to `limit` jobs, under a new seed."""
        return cls(worker_id, uuid.uuid4(), [str(n) for n in range(1, limit + 1)])

    @classmethod
    def of_hand_off(cls, worker_id: str, finished: Sequence[uuid.UUID]) -> ClaimTokens:
        """The tokens of the jobs handed off by the ends of `finished`, under a new seed."""
        return cls(worker_id, uuid.uuid4(), [str(job_id) for job_id in finished])


class ClaimAnswerLost(ConnectionError):
    """A write that claims jobs lost its answer (it may have committed): `jobs` are those it
    did claim, looked up since, now this worker's to run or hand back (their attempt already
    counted: running them costs nothing more). A lost connection, as callers see it."""

    def __init__(self, cause: BaseException, jobs: list[ClaimedJob]) -> None:
        super().__init__(f"the answer was lost ({cause!r}); {len(jobs)} job(s) it claimed found")
        self.jobs = jobs


@dataclass(frozen=True, slots=True)
class ClaimRound:
    """What one claim did: the jobs it claimed, and those it walked past because they cannot
    run now (not due, or their lock_key busy), to be parked (`WorkerProtocol.park`)."""

    jobs: list[ClaimedJob]
    blocked: list[uuid.UUID]
    #: Whether the claim walked every job of the queue that is not parked (fewer than its
    #: walk): another claim now would find nothing more.
    exhausted: bool = True
    #: Seconds until the queue's earliest delayed job is due (≤ 0: one is due now), or None.
    next_due_in: float | None = None
    #: Jobs that could run but the queue's limits held back: the queue is not empty, and a
    #: job leaving `running` (a notification) or the rate's next token says when to look again.
    held: int = 0


@dataclass(frozen=True, slots=True)
class Beat:
    """What a heartbeat learnt of one job that is still ours."""

    cancel_requested: bool
    #: False when the row was locked by someone else: the lease was not extended this time.
    extended: bool


@dataclass(frozen=True, slots=True)
class ExpiredJob:
    """A running job whose lease expired, as the reaper read it."""

    job_id: uuid.UUID
    queue: str
    task: str
    claim_token: uuid.UUID | None
    facts: JobFacts

    @property
    def fence(self) -> Fence:
        """What the row must still be for the reaper's transition to be written."""
        return Fence(self.job_id, self.facts, self.claim_token, expired=True)


class Effect(Protocol):
    """What an outcome writes besides its job, in the transaction of its write, only if that
    write passes the job's fence (`Outcome.effects`). The effects of one kind that one write
    carries are written together, in a few statements whatever their number: joined to the
    statement that writes the jobs' states when they can be, else after it."""

    @classmethod
    def joined(cls, effects: Sequence[Self]) -> Joined | None:
        """The statement that writes `effects` with their jobs' states (FINISH_JOBS and
        more), or None if they need statements of their own (`apply_all`)."""

    @classmethod
    async def apply_all(cls, conn: AnyConnection, effects: Sequence[Self]) -> None:
        """Write `effects` on `conn`, in the transaction that wrote their jobs' states."""

    @classmethod
    def written(cls, effects: Sequence[Self], seconds: float) -> None:
        """`effects` were written, in `seconds` (for metrics)."""


def _effects_written(
    by_kind: Mapping[type[Effect], Sequence[tuple[uuid.UUID, Effect]]],
    applied: Mapping[uuid.UUID, Applied],
    seconds: float,
) -> None:
    """Tell each kind of effect which of its effects were written with their jobs."""
    for kind, pairs in by_kind.items():
        written = [
            effect
            for job_id, effect in pairs
            if job_id in applied and applied[job_id].state == "written"
        ]
        if written:
            kind.written(written, seconds)


class WorkerProtocol:
    """The worker's statements over a pool (with `GuardedPool`'s connection hygiene)."""

    def __init__(self, pool: Pool, timeout: float = DEFAULT_TIMEOUT_SEC) -> None:
        #: The pool with its connection hygiene (for other stores on the same pool).
        self.db = GuardedPool(pool, timeout)
        #: Queues whose last claim said they have limits: claimed by CLAIM_LIMITED.
        self._limited: set[str] = set()
        #: Whether a look-up of the jobs of a lost answer is made until the database answers
        #: (until the process stops: see `stop_recovering`).
        self._recovering = True

    def limited(self, queue: str) -> bool:
        """Whether the last claim of `queue` found it has limits (`dl_queues`)."""
        return queue in self._limited

    async def claim(self, queue: str, limit: int, worker_id: str) -> list[ClaimedJob]:
        """Claim up to `limit` ready jobs of `queue`, at most one per lock_key."""
        return (await self.claim_round(queue, limit, worker_id, walk=limit)).jobs

    async def claim_round(
        self,
        queue: str,
        limit: int,
        worker_id: str,
        walk: int,
        *,
        slots: int | None = None,
        batch_sizes: Mapping[str, int] | None = None,
    ) -> ClaimRound:
        """Claim up to `limit` ready jobs of `queue`, at most one per lock_key, out of the first
        `walk` (≥ `limit`) jobs of its claim order that are not parked; those walked that
        cannot run now come back as `blocked` (see `queries.CLAIM_JOBS`). The jobs claimed
        fill at most `slots` slots (None: as many as jobs), a job each, or up to its task's
        size together for the tasks of `batch_sizes` (a batched task's name: its batch_size)."""
        walk = max(walk, limit)
        tokens = ClaimTokens.of_claim(worker_id, limit)
        batched = dict(batch_sizes or {})
        claim = functools.partial(
            queries.CLAIM_JOBS.bind,
            queue=queue,
            limit=limit,
            walk=walk,
            slots=limit if slots is None else slots,
            batched_tasks=list(batched),
            batch_sizes=list(batched.values()),
            worker_id=worker_id,
            claim_seed=tokens.seed,
        )

        async def write() -> list[Record]:
            limited = queue in self._limited
            if not limited:
                rows = await self.db.fetch(*claim())
                limited = rows[-1]["limited"]  # a queue with limits is not claimed this way
            if limited:
                rows = await self._claim_limited(queue, claim.keywords)
            return rows

        try:
            rows = await self._claiming(tokens, write)
        except ClaimAnswerLost as lost:  # what it walked past is not known: look again soon
            return ClaimRound(lost.jobs, [], exhausted=False, next_due_in=0.0)
        tail = rows.pop()
        return ClaimRound(
            self._claimed(rows),
            tail["blocked"] or [],
            exhausted=tail["walked"] < walk,
            next_due_in=tail["next_due_in"],
            held=tail["held"],
        )

    async def _claim_limited(self, queue: str, parameters: dict[str, Any]) -> list[Record]:
        """Claim from a queue with limits, its claims serialised across replicas; remembers
        whether it still has limits."""
        async with self.db.connection() as conn, conn.transaction():
            await conn.execute(*queries.LOCK_QUEUE_CLAIMS.bind(queue=queue))
            rows = await conn.fetch(*queries.CLAIM_LIMITED.bind(**parameters))
        if rows[-1]["limited"]:
            self._limited.add(queue)
        else:
            self._limited.discard(queue)
        return rows

    async def _claiming(self, tokens: ClaimTokens, write: Callable[[], Awaitable[T]]) -> T:
        """Run `write`, which claims jobs with `tokens`. When its answer is lost, the jobs it
        claimed are looked up, until the database answers, and raised in ClaimAnswerLost."""
        try:
            return await write()
        except CONNECTION_ERRORS as exc:
            if not tokens.suffixes:
                raise
            raise ClaimAnswerLost(exc, await self._recover(tokens, exc)) from exc

    def stop_recovering(self) -> None:
        """The process stops: a look-up of the jobs of a lost answer that fails is not made
        again (the stop must not wait for the database; those jobs wait for their lease)."""
        self._recovering = False

    async def _recover(self, tokens: ClaimTokens, cause: BaseException) -> list[ClaimedJob]:
        """The jobs a write with `tokens` claimed (see `queries.RECOVER_CLAIMS`), looked up
        again and again until the database answers: until then nobody else knows them."""
        log.warning(
            "a claiming write failed (%r), it may have committed: looking up its jobs", cause
        )
        lookup = queries.RECOVER_CLAIMS.bind(
            worker_id=tokens.worker_id, claim_seed=tokens.seed, suffixes=tokens.suffixes
        )
        delay = RECOVER_FIRST_SEC
        while True:
            try:
                rows = await self.db.fetch(*lookup)
                break
            except CONNECTION_ERRORS as exc:
                if not self._recovering:
                    log.error("the process stops: the jobs of a lost answer are left to the reaper")
                    return []
                log.warning("looking up the jobs of a lost answer failed, retrying: %r", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECOVER_MAX_SEC)
        jobs = self._claimed(rows)
        for job in jobs:
            log.warning(
                "job %s (queue %s, task %s, attempt %d) was claimed by a write whose answer was"
                " lost: recovered",
                job.job_id,
                job.queue,
                job.task,
                job.attempt,
            )
        return jobs

    async def park(self, job_ids: Sequence[uuid.UUID]) -> int:
        """Park those of `job_ids` (walked past by a claim) that still cannot run now; how
        many (see `queries.PARK_JOBS`)."""
        parked: int = await self.db.fetchval(
            *queries.PARK_JOBS.bind(job_ids=list(job_ids), siblings=PARK_SIBLINGS)
        )
        return parked

    async def put_back_due(self, queue: str, limit: int) -> PutBack:
        """Put back up to `limit` delayed jobs of `queue` that have come due: how many, in how
        many seconds the next parked one comes due, and whether due ones were left parked."""
        row = await self.db.fetchrow(*queries.PUT_BACK_DUE.bind(queue=queue, limit=limit))
        assert row is not None
        count = row["put_back"]
        return PutBack(count, row["next_due_in"], held=row["held"], full=count >= limit)

    @staticmethod
    def _claimed(rows: list[Record]) -> list[ClaimedJob]:
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
                handbacks=r["handbacks"],
                rerun_requested=r["rerun_requested"],
                checkpoint=None if r["checkpoint"] is None else json.loads(r["checkpoint"]),
                waited_sec=r["waited_sec"],
            )
            for r in rows
        ]

    async def put_back_stranded(self, limit: int) -> list[uuid.UUID]:
        """Put back jobs parked behind a lock_key that no job holds any more (see
        `queries.PUT_BACK_STRANDED`); the jobs put back."""
        rows = await self.db.fetch(*queries.PUT_BACK_STRANDED.bind(limit=limit))
        return [r["job_id"] for r in rows]

    async def lock_key_holder(self, job: ClaimedJob) -> str | None:
        """Who holds the lock_key `job` could not take (see `queries.LOCK_KEY_HOLDER`), or
        None when the job is no longer ours."""
        holder: str | None = await self.db.fetchval(
            *queries.LOCK_KEY_HOLDER.bind(job_id=job.job_id, claim_token=job.claim_token)
        )
        return holder

    async def heartbeat(
        self, beats: Sequence[tuple[uuid.UUID, uuid.UUID, bool]], worker_id: str
    ) -> dict[uuid.UUID, Beat]:
        """Extend leases of (job_id, claim_token, journal?) triples; the jobs still ours."""
        if not beats:
            return {}
        ids, tokens, journal = zip(*beats, strict=True)
        rows = await self.db.fetch(
            *queries.HEARTBEAT_JOBS.bind(
                job_ids=list(ids),
                claim_tokens=list(tokens),
                journal=list(journal),
                worker_id=worker_id,
            )
        )
        return {r["job_id"]: Beat(r["cancel_requested"], r["extended"]) for r in rows}

    async def set_progress(
        self, job_id: uuid.UUID, claim_token: uuid.UUID, progress_json: str
    ) -> bool | None:
        """Store progress (JSON text); returns cancel_requested, or None when the job is not
        ours."""
        value: bool | None = await self.db.fetchval(
            *queries.SET_PROGRESS.bind(
                job_id=job_id, claim_token=claim_token, progress=progress_json
            )
        )
        return value

    async def set_checkpoint(
        self, job_id: uuid.UUID, claim_token: uuid.UUID, checkpoint_json: str
    ) -> bool | None:
        """Store the checkpoint (JSON text); returns cancel_requested, or None when the job is
        not ours."""
        value: bool | None = await self.db.fetchval(
            *queries.SET_CHECKPOINT.bind(
                job_id=job_id, claim_token=claim_token, checkpoint=checkpoint_json
            )
        )
        return value

    async def finish(
        self,
        outcomes: Sequence[tuple[ClaimedJob, JobFacts, Transition]],
        worker_id: str,
        hand_off: Sequence[uuid.UUID] = (),
        stages: Mapping[uuid.UUID, Sequence[NewJob]] | None = None,
        effects: Mapping[uuid.UUID, Effect] | None = None,
    ) -> dict[uuid.UUID, Applied]:
        """Write the decided outcomes of claimed jobs (facts: what each was decided on). The
        next job of a lock_key freed by a job named in `hand_off` is claimed for `worker_id`
        when it is of the same queue: `handed_job` reads it from the finished job's answer.
        `stages`: the jobs to enqueue with the success of each job named; `effects`: what
        else the outcome of each job named writes (`Outcome.effects`: a durable process's
        save); both in the same transaction, if that job's outcome is written. When the
        answer is lost, raises ClaimAnswerLost with the jobs it handed off (the outcomes are to
        be written again: those written find their job no longer the caller's)."""
        items = [(Fence(job.job_id, facts, job.claim_token), t) for job, facts, t in outcomes]
        tokens = ClaimTokens.of_hand_off(worker_id, hand_off)

        by_kind: dict[type[Effect], list[tuple[uuid.UUID, Effect]]] = {}
        for job_id, effect in (effects or {}).items():
            by_kind.setdefault(type(effect), []).append((job_id, effect))
        joined = None
        if not stages and len(by_kind) == 1:
            [(kind, pairs)] = by_kind.items()
            joined = kind.joined([effect for _, effect in pairs])

        async def write() -> dict[uuid.UUID, Applied]:
            started = time.perf_counter()
            if not stages and (not effects or joined is not None):  # one round trip
                applied = await apply_transitions(
                    self.db.fetch,
                    items,
                    actor_role="worker",
                    actor=worker_id,
                    wakes_own_queue=True,
                    hand_off=hand_off,
                    claim_seed=tokens.seed,
                    joined=joined,
                )
                _effects_written(by_kind, applied, time.perf_counter() - started)
                return applied
            async with self.db.transaction() as conn:
                states = await set_states(conn, items, actor_role="worker", actor=worker_id)
                written = set(states.written)
                enqueued = [
                    job
                    for job_id, jobs in (stages or {}).items()
                    if job_id in written
                    for job in jobs
                ]
                if enqueued:
                    await enqueue_many(conn, enqueued, actor=worker_id)
                for kind, pairs in by_kind.items():
                    together = [effect for job_id, effect in pairs if job_id in written]
                    if together:
                        await kind.apply_all(conn, together)
                applied = await release_keys(
                    conn,
                    states,
                    actor=worker_id,
                    wakes_own_queue=True,
                    hand_off=hand_off,
                    claim_seed=tokens.seed,
                )
            _effects_written(by_kind, applied, time.perf_counter() - started)
            return applied

        return await self._claiming(tokens, write)

    @staticmethod
    def handed_job(applied: Applied) -> ClaimedJob | None:
        """The job claimed for the worker by the write of `applied` (see `finish`), if any."""
        h = applied.handed
        if h is None:
            return None
        return ClaimedJob(
            job_id=uuid.UUID(h["job_id"]),
            queue=h["queue"],
            task=h["task"],
            args=h["args"],
            lock_key=h["lock_key"],
            lock_hash=h["lock_hash"],
            partition_key=h["partition_key"],
            priority=h["priority"],
            attempt=h["attempt"],
            max_attempts=h["max_attempts"],
            lease_ttl_sec=h["lease_ttl_sec"],
            cancel_requested=h["cancel_requested"],
            claim_seq=h["claim_seq"],
            claim_token=uuid.UUID(h["claim_token"]),
            handbacks=h["handbacks"],
            rerun_requested=h["rerun_requested"],
            checkpoint=h["checkpoint"],
        )

    async def expired(self, limit: int) -> list[ExpiredJob]:
        """Running jobs whose lease expired or whose owner is gone, oldest lease first."""
        rows = await self.db.fetch(*queries.EXPIRED_JOBS.bind(limit=limit))
        return [
            ExpiredJob(r["job_id"], r["queue"], r["task"], r["claim_token"], facts_of(r))
            for r in rows
        ]

    async def next_reapable_in(self) -> float | None:
        """Seconds until a running job next becomes the reaper's (None: none will)."""
        due_in: float | None = await self.db.fetchval(queries.NEXT_REAPABLE_IN)
        return due_in

    async def reap(
        self, decided: Sequence[tuple[ExpiredJob, Transition]], reaper_id: str
    ) -> dict[uuid.UUID, Applied]:
        """Write the reaper's transitions, each only if its lease is still expired or its
        owner still gone."""
        return dict(await self.reaper_writer(reaper_id)([(e.fence, t) for e, t in decided]))

    def reaper_writer(self, reaper_id: str) -> Write[Transition]:
        """The reaper's write of `transitions.settle`: fenced on a lease still expired or an
        owner still gone (`ExpiredJob.fence`)."""
        return writer(self.db.fetch, actor_role="reaper", actor=reaper_id)


async def try_advisory_locks(conn: Connection, lock_hashes: Sequence[int]) -> dict[int, bool]:
    """Session-level `pg_try_advisory_lock` of each hash on the lock-holding connection."""
    rows = await conn.fetch(*queries.TRY_ADVISORY_LOCKS.bind(lock_hashes=list(lock_hashes)))
    return {r["lock_hash"]: r["locked"] for r in rows}


async def advisory_unlock(conn: Connection, lock_hashes: Sequence[int]) -> int:
    """Release session-level advisory locks; returns how many this session held."""
    released: int = await conn.fetchval(
        *queries.ADVISORY_UNLOCK.bind(lock_hashes=list(lock_hashes))
    )
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
        released = await conn.fetch(*queries.ADVISORY_UNLOCK_HELD.bind(lock_hashes=pending))
        pending = [r["lock_hash"] for r in released]
