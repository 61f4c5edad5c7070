"""The job state machine, driven by hypothesis against the real database.

Random sequences of everything that can happen to jobs — triggers, claims, completions,
failures, cancels, releases, backoffs, heartbeats, progress, leases expiring and being reaped —
including writes by *stale* claims (a claim that has since been reaped, failed, released,
backed off or finished, as a zombie worker would send; a claim handed back with its attempt
refunded leaves the next claim the same attempt number, but never the same `claim_token`;
refunds stop after a bounded number of hand-backs).
After every step the whole queue is read back and compared with the step before:

* every status change is a legal transition of the protocol (docs/protocol.md, States);
* a job in a final state never changes again, in any column;
* a write fenced on a stale claim changes nothing;
* rows are consistent: a running job has a lease, a queued or final one has none, a final one
  has `finished_at`, attempts stay within 0..max_attempts, at most one job per lock_key runs;
* each operation on the live claim has the outcome the protocol promises.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dataloader.core.models import NewJob
from dataloader.core.transitions import MAX_REFUNDED_HANDBACKS, Ended, Outcome
from dataloader.storage.connections import GuardedPool
from dataloader.storage.db import create_pool
from dataloader.storage.protocol import ClaimedJob, WorkerProtocol
from dataloader.storage.repositories import JobRepository
from dataloader.workers.reaper import Reaper

from .helpers import finish_claimed

T = TypeVar("T")
WORKER = "state-machine-worker"
#: Refunded hand-backs per job.
MAX_REFUNDS = MAX_REFUNDED_HANDBACKS
FINAL = frozenset({"succeeded", "failed", "canceled", "lost"})
LEGAL = frozenset(
    {
        ("queued", "running"),
        ("queued", "canceled"),
        ("running", "queued"),
        ("running", "succeeded"),
        ("running", "failed"),
        ("running", "canceled"),
        ("running", "lost"),
    }
)
SNAPSHOT = """
SELECT job_id, status::text AS status, attempt, claim_seq, claim_token, handbacks,
       max_attempts, cancel_requested,
       lock_key, lease_expires_at, finished_at, error, progress::text AS progress
FROM dl_jobs WHERE queue = $1
"""


@dataclass(frozen=True)
class Row:
    status: str
    attempt: int
    claim_seq: int
    claim_token: uuid.UUID | None
    handbacks: int
    max_attempts: int
    cancel_requested: bool
    lock_key: str
    lease_expires_at: Any
    finished_at: Any
    error: str | None
    progress: str


def ended(row: Row, requeued: bool, otherwise: str) -> str:
    """Where a running job goes when its claim ends without success: `canceled` if a cancel
    was requested, else back to `queued` if `requeued`, else `otherwise`."""
    if row.cancel_requested:
        return "canceled"
    return "queued" if requeued else otherwise


class JobStateMachine(RuleBasedStateMachine):
    """One example: a fresh queue in the test's database, a pool, and every claim ever made."""

    dsn = ""  # set by the test

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.queue = f"sm-{uuid.uuid4().hex[:12]}"
        self.pool = self.run(create_pool(self.dsn, 2, "state-machine"))
        self.repo = JobRepository(GuardedPool(self.pool))
        self.protocol = WorkerProtocol(self.pool)
        self.claims: list[ClaimedJob] = []
        self.jobs: list[uuid.UUID] = []
        self.rows: dict[uuid.UUID, Row] = {}
        #: The job a step meant to change, and the status(es) the protocol promises for it.
        self.expect: tuple[uuid.UUID, frozenset[str]] | None = None

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def teardown(self) -> None:
        self.run(self.pool.close())
        self.loop.close()

    # --- the model's view of a claim ---------------------------------------------------------

    def current(self, claim: ClaimedJob) -> bool:
        """Whether `claim` is the job's live claim (so its fenced writes apply)."""
        row = self.rows[claim.job_id]
        return row.status == "running" and row.claim_token == claim.claim_token

    def pick_claim(self, index: int) -> ClaimedJob:
        return self.claims[index % len(self.claims)]

    def expect_outcome(self, claim: ClaimedJob, if_current: set[str]) -> None:
        """A fenced write: the promised statuses when live, no change at all when stale."""
        row = self.rows[claim.job_id]
        self.expect = (claim.job_id, frozenset(if_current if self.current(claim) else {row.status}))

    # --- rules -----------------------------------------------------------------------------

    @rule(max_attempts=st.integers(1, 3), key=st.sampled_from("abc"))
    def trigger(self, max_attempts: int, key: str) -> None:
        job = NewJob(
            queue=self.queue,
            task="t",
            lock_key=f"{self.queue}-{key}",  # keys of earlier examples' jobs stay apart
            args={},
            max_attempts=max_attempts,
            lease_ttl_sec=3600,
        )
        result = self.run(self.repo.enqueue(job))
        self.jobs.append(result.job_id)
        self.expect = (result.job_id, frozenset({"queued"}))

    @rule(limit=st.integers(1, 3))
    def claim(self, limit: int) -> None:
        claimed = self.run(self.protocol.claim(self.queue, limit, WORKER))
        for job in claimed:
            before = self.rows[job.job_id]
            assert before.status == "queued", f"claimed a {before.status} job"
            assert job.attempt == before.attempt + 1
            assert job.claim_seq == before.claim_seq + 1
            assert job.claim_token != before.claim_token
        assert len({job.lock_key for job in claimed}) == len(claimed)
        self.claims.extend(claimed)

    @precondition(lambda self: self.claims)
    @rule(index=st.integers(0, 10_000))
    def complete(self, index: int) -> None:
        claim = self.pick_claim(index)
        self.expect_outcome(claim, {"succeeded"})
        done = self.run(finish_claimed(self.protocol, claim, Outcome(Ended.SUCCEEDED), WORKER))
        assert (done is not None) == self.current(claim)

    @precondition(lambda self: self.claims)
    @rule(index=st.integers(0, 10_000), retryable=st.booleans())
    def fail(self, index: int, retryable: bool) -> None:
        claim = self.pick_claim(index)
        row = self.rows[claim.job_id]
        outcome = ended(row, retryable and row.attempt < row.max_attempts, otherwise="failed")
        self.expect_outcome(claim, {outcome})
        failure = Outcome(Ended.FAILED, "boom", retryable=retryable)
        done = self.run(finish_claimed(self.protocol, claim, failure, WORKER))
        assert (done is not None) == self.current(claim)

    @precondition(lambda self: self.claims)
    @rule(index=st.integers(0, 10_000), refund=st.booleans())
    def release(self, index: int, refund: bool) -> None:
        claim = self.pick_claim(index)
        row = self.rows[claim.job_id]
        refunded = refund and row.handbacks < MAX_REFUNDS
        outcome = ended(row, refunded or row.attempt < row.max_attempts, otherwise="lost")
        self.expect_outcome(claim, {outcome})
        handback = Outcome(Ended.HANDED_BACK, "test", refund=refund)
        done = self.run(finish_claimed(self.protocol, claim, handback, WORKER))
        assert (done is not None) == self.current(claim)

    @precondition(lambda self: self.claims)
    @rule(index=st.integers(0, 10_000))
    def backoff(self, index: int) -> None:
        claim = self.pick_claim(index)
        outcome = "canceled" if self.rows[claim.job_id].cancel_requested else "queued"
        self.expect_outcome(claim, {outcome})
        holder = self.run(self.protocol.lock_key_holder(claim))
        assert (holder is not None) == self.current(claim)
        busy = Outcome(Ended.BACKED_OFF, holder=holder or "none")
        done = self.run(finish_claimed(self.protocol, claim, busy, WORKER))
        assert (done is not None) == self.current(claim)

    @precondition(lambda self: self.claims)
    @rule(index=st.integers(0, 10_000))
    def stop_on_cancel(self, index: int) -> None:
        claim = self.pick_claim(index)
        self.expect_outcome(claim, {"canceled"})
        done = self.run(finish_claimed(self.protocol, claim, Outcome(Ended.CANCELED), WORKER))
        assert (done is not None) == self.current(claim)

    @precondition(lambda self: self.claims)
    @rule(index=st.integers(0, 10_000), journal=st.booleans())
    def heartbeat(self, index: int, journal: bool) -> None:
        claim = self.pick_claim(index)
        self.expect_outcome(claim, {"running"})
        beat = [(claim.job_id, claim.claim_token, journal)]
        ours = self.run(self.protocol.heartbeat(beat, WORKER))
        assert (claim.job_id in ours) == self.current(claim)

    @precondition(lambda self: self.claims)
    @rule(index=st.integers(0, 10_000), step=st.integers(0, 100))
    def progress(self, index: int, step: int) -> None:
        claim = self.pick_claim(index)
        self.expect_outcome(claim, {"running"})
        progress = f'{{"step": {step}}}'
        answer = self.run(self.protocol.set_progress(claim.job_id, claim.claim_token, progress))
        assert (answer is not None) == self.current(claim)

    @precondition(lambda self: self.jobs)
    @rule(index=st.integers(0, 10_000))
    def cancel(self, index: int) -> None:
        job_id = self.jobs[index % len(self.jobs)]
        before = self.rows[job_id].status
        self.expect = (job_id, frozenset({"canceled" if before == "queued" else before}))
        state = self.run(self.repo.cancel(job_id))
        assert state is not None
        if before == "running":
            assert state.cancel_requested

    @precondition(lambda self: self.claims)
    @rule(index=st.integers(0, 10_000))
    def lease_expires_and_is_reaped(self, index: int) -> None:
        claim = self.pick_claim(index)
        row = self.rows[claim.job_id]
        self.run(
            self.pool.execute(
                "UPDATE dl_jobs SET lease_expires_at = now() - interval '1 second'"
                " WHERE job_id = $1 AND status = 'running'",
                claim.job_id,
            )
        )
        reaped = self.run(Reaper(self.protocol, "state-machine-reaper").run_once())
        if row.status == "running":
            outcome = ended(row, row.attempt < row.max_attempts, otherwise="lost")
            assert reaped == {outcome: 1}
            self.expect = (claim.job_id, frozenset({outcome}))
        else:
            assert reaped == {}

    # --- the check after every step ----------------------------------------------------------

    @invariant()
    def only_legal_changes(self) -> None:
        rows = {
            r["job_id"]: Row(**{k: v for k, v in r.items() if k != "job_id"})
            for r in self.run(self.pool.fetch(SNAPSHOT, self.queue))
        }
        for job_id, now in rows.items():
            self.consistent(job_id, now)
            before = self.rows.get(job_id)
            if before is None:
                continue
            if before.status in FINAL:
                assert now == before, f"final job {job_id} changed: {before} -> {now}"
            elif before.status != now.status:
                assert (before.status, now.status) in LEGAL, (before.status, now.status)
        if self.expect is not None:
            job_id, allowed = self.expect
            assert rows[job_id].status in allowed, (rows[job_id].status, allowed)
        assert set(self.rows) <= set(rows)
        self.rows = rows
        self.expect = None
        running_keys = [r.lock_key for r in rows.values() if r.status == "running"]
        assert len(running_keys) == len(set(running_keys)), "two jobs of one lock_key running"

    @staticmethod
    def consistent(job_id: uuid.UUID, row: Row) -> None:
        assert 0 <= row.attempt <= row.max_attempts, (job_id, row)
        assert (row.lease_expires_at is not None) == (row.status == "running"), (job_id, row)
        assert (row.finished_at is not None) == (row.status in FINAL), (job_id, row)
        if row.status == "running":
            assert row.attempt >= 1, (job_id, row)


@pytest.fixture
def state_machine(db_dsn: str) -> type[JobStateMachine]:
    JobStateMachine.dsn = db_dsn
    return JobStateMachine


def test_the_job_state_machine_only_makes_legal_transitions(
    state_machine: type[JobStateMachine],
) -> None:
    run = state_machine.TestCase
    run.settings = settings(
        max_examples=100,
        stateful_step_count=40,
        deadline=None,
        database=None,  # no example database in the working tree
        suppress_health_check=[HealthCheck.too_slow],
    )
    run().runTest()


async def test_a_stale_claim_cannot_touch_the_attempt_that_replaced_it(
    conn: asyncpg.Connection, db_dsn: str
) -> None:
    """The one sequence the machine above must keep finding: the reaper requeues a lease, a new
    attempt claims the job, and the old attempt's completion arrives late."""
    pool = await create_pool(db_dsn, 2, "state-machine")
    try:
        repo, protocol = JobRepository(GuardedPool(pool)), WorkerProtocol(pool)
        job = await repo.enqueue(NewJob(queue="q", task="t", lock_key="k", args={}))
        (first,) = await protocol.claim("q", 1, WORKER)
        await conn.execute("UPDATE dl_jobs SET lease_expires_at = now() - interval '1 second'")
        assert await Reaper(protocol, "reaper").run_once() == {"queued": 1}
        (second,) = await protocol.claim("q", 1, WORKER)
        assert await finish_claimed(protocol, first, Outcome(Ended.SUCCEEDED), WORKER) is None
        state = await repo.get(job.job_id)
        assert state is not None
        assert (state.status, state.attempt) == ("running", second.attempt)
    finally:
        await pool.close()


async def test_a_claim_handed_back_with_a_refund_cannot_touch_the_next_claim(
    conn: asyncpg.Connection, db_dsn: str
) -> None:
    """A refund gives the next claim the same attempt number; the claim token still tells
    them apart, so the first claim's late writes change nothing."""
    pool = await create_pool(db_dsn, 2, "state-machine")
    try:
        repo, protocol = JobRepository(GuardedPool(pool)), WorkerProtocol(pool)
        job = await repo.enqueue(NewJob(queue="q", task="t", lock_key="k", args={}))
        (first,) = await protocol.claim("q", 1, WORKER)
        busy = Outcome(Ended.BACKED_OFF, holder="none")
        assert await finish_claimed(protocol, first, busy, WORKER)  # attempt refunded
        (second,) = await protocol.claim("q", 1, WORKER)
        assert second.attempt == first.attempt  # the same attempt number...
        assert second.claim_token != first.claim_token  # ...but not the same claim
        late = first.claim_token
        assert await protocol.set_progress(job.job_id, late, '{"late": true}') is None
        assert await protocol.set_checkpoint(job.job_id, late, '{"late": true}') is None
        assert await protocol.heartbeat([(job.job_id, late, False)], WORKER) == {}
        for outcome in (
            Outcome(Ended.SUCCEEDED),
            Outcome(Ended.CANCELED),
            Outcome(Ended.FAILED, "late"),
            Outcome(Ended.HANDED_BACK, "late", refund=True),
        ):
            assert await finish_claimed(protocol, first, outcome, WORKER) is None
        state = await repo.get(job.job_id)
        assert state is not None
        assert (state.status, state.attempt, state.progress) == ("running", 1, {})
        assert state.checkpoint is None
    finally:
        await pool.close()
