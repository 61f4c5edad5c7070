"""Parked jobs (migration 0009): queued jobs that cannot run now (not due, or their lock_key's
job running) leave the claim's order, and come back when they can run. Claims are made by hand
on a service without workers, so that each step is seen as it happens."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import asyncpg
import pytest

from dataloader.base import JobStatus
from dataloader.core.due import PutBack
from dataloader.core.models import NewJob, new_job_id
from dataloader.core.retry import Linear
from dataloader.core.transitions import Ended, Outcome, after_attempt, on_cancel
from dataloader.storage import queries
from dataloader.storage.protocol import ClaimedJob, ClaimRound, WorkerProtocol
from dataloader.storage.transitions import (
    Fence,
    apply_transitions,
    facts_of,
    release_keys,
    set_states,
)
from dataloader.workers.reaper import Reaper

from .conftest import Service, StartService, wait_until
from .helpers import finish_claimed, parking_insert

WORKER = "hand"
#: A queue of its own for the tests' jobs.
QUEUE = "parking"


async def parked(conn: asyncpg.Connection, job_id: uuid.UUID) -> str | None:
    value: str | None = await conn.fetchval("SELECT parked FROM dl_jobs WHERE job_id = $1", job_id)
    return value


async def producer(start_service: StartService) -> tuple[Service, WorkerProtocol]:
    service = await start_service(run_workers=False)
    return service, WorkerProtocol(service.context.pool)


async def enqueue(service: Service, lock_key: str, **options: object) -> uuid.UUID:
    result = await service.dl.enqueue("demo.noop", queue=QUEUE, lock_key=lock_key, **options)
    return result.job_id


async def claim_one(protocol: WorkerProtocol) -> ClaimedJob:
    (claimed,) = await protocol.claim(QUEUE, 1, WORKER)
    return claimed


async def park_walked(protocol: WorkerProtocol) -> int:
    """Claim (nothing is claimable) and park what the claim walked past: how many."""
    round_ = await protocol.claim_round(QUEUE, 10, WORKER, walk=10)
    assert round_.jobs == []
    return await protocol.park(round_.blocked)


async def test_a_delayed_job_is_parked_until_due_then_put_back_and_claimed(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service, protocol = await producer(start_service)
    job = await enqueue(service, "k", available_at=timedelta(hours=1))
    assert await parked(conn, job) == "delayed"
    assert await protocol.put_back_due(QUEUE, 10) == PutBack(0, pytest.approx(3600, abs=60))
    # the claim walks nothing, and tells when the parked job is due
    assert await protocol.claim_round(QUEUE, 10, WORKER, walk=10) == ClaimRound(
        [], [], exhausted=True, next_due_in=pytest.approx(3600, abs=60)
    )

    await conn.execute(
        "UPDATE dl_jobs SET available_at = now() - interval '1 second' WHERE job_id = $1", job
    )
    # due now, and not put back yet: the claim says so (at most 0 seconds), for the claim loop
    due = (await protocol.claim_round(QUEUE, 10, WORKER, walk=10)).next_due_in
    assert due is not None
    assert -60 < due <= 0
    assert await protocol.put_back_due(QUEUE, 10) == PutBack(1, None)
    assert await parked(conn, job) is None
    assert (await claim_one(protocol)).job_id == job


async def test_a_put_back_says_whether_it_left_due_jobs_parked(
    start_service: StartService, conn: asyncpg.Connection, db_dsn: str
) -> None:
    """A due delayed job another session holds is left parked, and the put back says so (the
    claim loop then tries again a second later rather than at once); one put back is not
    counted as left, nor is one not due yet."""
    service, protocol = await producer(start_service)
    held, taken = [await enqueue(service, "k", available_at=timedelta(hours=1)) for _ in "ab"]
    await enqueue(service, "k", available_at=timedelta(hours=2))
    await conn.execute(
        "UPDATE dl_jobs SET available_at = now() - interval '1 second'"
        " WHERE job_id = ANY($1::uuid[])",
        [held, taken],
    )
    holder = await asyncpg.connect(db_dsn)
    try:
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM dl_jobs WHERE job_id = $1 FOR UPDATE", held)
            left = await protocol.put_back_due(QUEUE, 10)
    finally:
        await holder.close()
    assert left == PutBack(1, pytest.approx(7200, abs=60), held=True)
    assert await protocol.put_back_due(QUEUE, 10) == PutBack(1, pytest.approx(7200, abs=60))
    assert await protocol.put_back_due(QUEUE, 1) == PutBack(0, pytest.approx(7200, abs=60))


async def test_jobs_of_a_running_lock_key_are_parked_and_put_back_one_by_one(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service, protocol = await producer(start_service)
    first, second, third = [await enqueue(service, "k") for _ in range(3)]
    other = await enqueue(service, "other")
    running = await claim_one(protocol)
    assert running.job_id == first

    round_ = await protocol.claim_round(QUEUE, 10, WORKER, walk=10)
    assert [j.job_id for j in round_.jobs] == [other]
    assert sorted(round_.blocked) == sorted([second, third])
    assert await protocol.park(round_.blocked) == 2
    assert [await parked(conn, j) for j in (second, third)] == ["lock_key", "lock_key"]
    # parked jobs are not walked again
    assert await protocol.claim_round(QUEUE, 10, WORKER, walk=10) == ClaimRound([], [])

    await finish_claimed(protocol, running, Outcome(Ended.SUCCEEDED), WORKER)
    assert [await parked(conn, j) for j in (second, third)] == [None, "lock_key"]
    running = await claim_one(protocol)
    assert running.job_id == second
    await finish_claimed(protocol, running, Outcome(Ended.SUCCEEDED), WORKER)
    assert await parked(conn, third) is None
    assert (await claim_one(protocol)).job_id == third


async def test_a_queued_job_that_ends_puts_back_the_next_of_its_key(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service, protocol = await producer(start_service)
    first, second, third = [await enqueue(service, "k") for _ in range(3)]
    running = await claim_one(protocol)
    assert running.job_id == first
    assert await park_walked(protocol) == 2
    await finish_claimed(protocol, running, Outcome(Ended.SUCCEEDED), WORKER)
    assert await parked(conn, second) is None

    await service.dl.cancel(second)  # the job the others waited behind ends while queued
    assert await parked(conn, third) is None
    assert (await claim_one(protocol)).job_id == third


async def test_a_job_retried_after_a_delay_is_parked_until_due(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service, protocol = await producer(start_service)
    job = await enqueue(service, "k")
    claimed = await claim_one(protocol)
    await finish_claimed(protocol, claimed, Outcome(Ended.FAILED, "boom"), WORKER, Linear(30))
    row = await conn.fetchrow(
        "SELECT status::text, parked, available_at > now() AS later FROM dl_jobs WHERE job_id = $1",
        job,
    )
    assert tuple(row) == ("queued", "delayed", True)


async def test_jobs_of_a_key_whose_running_job_is_being_written_are_not_parked(
    start_service: StartService, conn: asyncpg.Connection, db_dsn: str
) -> None:
    """The running job's row is held by a write that may end it (and look for the next job
    of its key before the claim's parking is visible): its key's jobs are left unparked."""
    service, protocol = await producer(start_service)
    first, second = [await enqueue(service, "k") for _ in range(2)]
    await claim_one(protocol)
    writer = await asyncpg.connect(db_dsn)
    try:
        async with writer.transaction():
            await writer.execute("SELECT 1 FROM dl_jobs WHERE job_id = $1 FOR UPDATE", first)
            assert await park_walked(protocol) == 0
        assert await parked(conn, second) is None
    finally:
        await writer.close()
    assert await park_walked(protocol) == 1
    assert await parked(conn, second) == "lock_key"


async def test_the_reaper_puts_back_jobs_parked_behind_a_key_nobody_holds(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service, protocol = await producer(start_service)
    held = [await enqueue(service, "held") for _ in range(2)]
    stranded = [await enqueue(service, "stranded") for _ in range(2)]
    await claim_one(protocol)  # held[0] runs
    await conn.execute(
        "UPDATE dl_jobs SET parked = 'lock_key' WHERE job_id = ANY($1::uuid[])",
        [held[1], *stranded],
    )
    reaper = Reaper(protocol, "test-reaper")

    assert await reaper.put_back_stranded() == 1
    assert [await parked(conn, j) for j in stranded] == [None, "lock_key"]  # the first only
    assert await parked(conn, held[1]) == "lock_key"  # its key's job runs
    assert await reaper.put_back_stranded() == 0  # stranded[0] is ready: the rest wait for it


async def test_jobs_written_in_sql_are_parked_by_the_claims_that_meet_them(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """Rows dataloader did not write (parked NULL) ahead in claim order: the claims walk
    further each time they park some, and the ready job behind them runs."""
    await conn.execute(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, priority, available_at)"
        " SELECT gen_random_uuid(), 'default', 'demo.noop', 'later-' || i, 0,"
        " now() + interval '1 day' FROM generate_series(1, 500) AS i"
    )
    service = await start_service()
    ready = await service.dl.enqueue("demo.noop", queue="default", lock_key="ready")
    state = await service.dl.wait(ready.job_id, timeout=60)
    assert state.status.value == "succeeded"

    async def all_parked() -> bool:
        left = await conn.fetchval(
            "SELECT count(*) FROM dl_jobs WHERE lock_key LIKE 'later-%' AND parked IS NULL"
        )
        return bool(left == 0)

    await wait_until(all_parked, what="the delayed rows to be parked")


async def test_a_delayed_job_runs_once_due_without_waiting_for_the_poll(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """The tests' poll interval is five minutes: only the claim loop's timer for the earliest
    delayed job, and putting it back when due, can start it within the wait's timeout."""
    service = await start_service()
    job = await service.dl.enqueue(
        "demo.noop", queue="default", lock_key="d", available_at=timedelta(seconds=0.5)
    )
    state = await service.dl.wait(job.job_id, timeout=30)
    assert state.status.value == "succeeded"
    started_after_due = await conn.fetchval(
        "SELECT started_at >= available_at FROM dl_jobs WHERE job_id = $1", job.job_id
    )
    assert started_after_due


async def test_a_claim_says_whether_it_walked_every_job_that_is_not_parked(
    start_service: StartService,
) -> None:
    """A claim that stopped at its walk leaves jobs behind (the claim loop claims again at
    once); one that walked fewer than its walk saw every job there is to claim."""
    service, protocol = await producer(start_service)
    for i in range(3):
        await enqueue(service, f"k{i}")
    first = await protocol.claim_round(QUEUE, 2, WORKER, walk=2)
    assert (len(first.jobs), first.exhausted) == (2, False)
    second = await protocol.claim_round(QUEUE, 2, WORKER, walk=2)
    assert (len(second.jobs), second.exhausted) == (1, True)


async def test_a_claim_tells_when_a_delayed_job_it_walked_past_is_due(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """A job delayed in SQL after it was written (not parked) that a claim walks past: the
    claim's `next_due_in` counts it, so that the claim loop's timer wakes for it."""
    _, protocol = await producer(start_service)
    job = await conn.fetchval(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key)"
        " VALUES (gen_random_uuid(), $1, 't', 'k') RETURNING job_id",
        QUEUE,
    )
    await conn.execute(
        "UPDATE dl_jobs SET available_at = now() + interval '90 seconds' WHERE job_id = $1", job
    )
    round_ = await protocol.claim_round(QUEUE, 10, WORKER, walk=10)
    assert (round_.jobs, len(round_.blocked)) == ([], 1)
    assert round_.next_due_in == pytest.approx(90, abs=30)


async def test_a_delayed_job_inserted_in_sql_is_written_parked(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """Migration 0010: an insert by other means than the client parks a job that is not due
    (no claim has to walk past it first); a due one, or one parked already, stays as written."""
    await start_service()
    insert = (
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, available_at, parked)"
        " VALUES (gen_random_uuid(), $1, 't', $2, now() + $3, $4) RETURNING parked"
    )
    hour, due = timedelta(hours=1), timedelta(0)
    assert await conn.fetchval(insert, QUEUE, "later", hour, None) == "delayed"
    assert await conn.fetchval(insert, QUEUE, "due", due, None) is None
    assert await conn.fetchval(insert, QUEUE, "waits", hour, "lock_key") == "lock_key"


async def test_the_other_jobs_of_a_running_key_are_parked_with_those_a_claim_walked_past(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """A claim walks two jobs of a running key; the park takes the rest of that key's due
    jobs with them (no claim has to walk each one first), but not a job of another key, nor a
    job of the key that is not due (parked `delayed` when a claim meets it)."""
    service, protocol = await producer(start_service)
    running = await enqueue(service, "hot")
    waiting = [await enqueue(service, "hot") for _ in range(5)]
    later = await enqueue(service, "hot", available_at=timedelta(hours=1))
    other = await enqueue(service, "cold")
    assert (await claim_one(protocol)).job_id == running

    round_ = await protocol.claim_round(QUEUE, 1, WORKER, walk=2)
    assert sorted(round_.blocked) == sorted(waiting[:2])
    assert await protocol.park(round_.blocked) == 5
    assert [await parked(conn, j) for j in waiting] == ["lock_key"] * 5
    assert (await parked(conn, later), await parked(conn, other)) == ("delayed", None)


async def hand_off(protocol: WorkerProtocol, claimed: ClaimedJob) -> ClaimedJob | None:
    """Write the success of `claimed`, asking for the next job of its key (a kept slot)."""
    facts = claimed.facts()
    transition = after_attempt(Outcome(Ended.SUCCEEDED), facts, Linear())
    applied = await protocol.finish(
        [(claimed, facts, transition)], WORKER, hand_off=[claimed.job_id]
    )
    assert applied[claimed.job_id].state == "written"
    return protocol.handed_job(applied[claimed.job_id])


async def test_a_worker_keeping_a_slot_is_handed_the_next_job_of_the_key_it_frees(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """The end of a job claims the next job of its key for the same worker, as a claim would:
    running, a new claim token, its attempt counted and journalled `picked`; no claim runs
    between the jobs of a serial chain. The job after it stays where it was."""
    service, protocol = await producer(start_service)
    first, second, third = [await enqueue(service, "chain") for _ in range(3)]
    running = await claim_one(protocol)
    round_ = await protocol.claim_round(QUEUE, 10, WORKER, walk=10)
    assert await protocol.park(round_.blocked) == 2

    handed = await hand_off(protocol, running)
    assert handed is not None
    assert (handed.job_id, handed.attempt, handed.lock_key) == (second, 1, "chain")
    assert handed.claim_token not in (None, running.claim_token)
    row = await conn.fetchrow(
        "SELECT status::text, parked, worker_id, claim_token, attempt FROM dl_jobs"
        " WHERE job_id = $1",
        second,
    )
    assert tuple(row) == ("running", None, WORKER, handed.claim_token, 1)
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM dl_job_events WHERE job_id = $1 AND kind = 'picked'", second
        )
        == 1
    )
    assert await parked(conn, third) == "lock_key"
    # the handed job is a claim like any other: its outcome is fenced on its token
    assert await finish_claimed(protocol, handed, Outcome(Ended.SUCCEEDED), WORKER) is not None
    assert await parked(conn, third) is None
    assert first == running.job_id


async def test_a_next_job_of_another_queue_is_put_back_not_handed(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """The worker serves the finished job's queue, not necessarily the next job's: that one is
    put back (and its queue woken), as without a kept slot."""
    service, protocol = await producer(start_service)
    await enqueue(service, "shared")
    elsewhere = await service.dl.enqueue("demo.noop", queue="other", lock_key="shared")
    await conn.execute("UPDATE dl_jobs SET parked = 'lock_key' WHERE job_id = $1", elsewhere.job_id)
    running = await claim_one(protocol)
    assert await hand_off(protocol, running) is None
    assert await parked(conn, elsewhere.job_id) is None
    assert (
        await conn.fetchval("SELECT status::text FROM dl_jobs WHERE job_id = $1", elsewhere.job_id)
        == "queued"
    )


#: A queue whose claims take nothing: paused, full (its limit of running jobs reached), or
#: served by no process (no claim of it is ever made here).
HELD = "parking-held"


async def hold_queue(service: Service, protocol: WorkerProtocol, how: str) -> None:
    """Keep HELD's jobs from being claimed, as `how` says."""
    if how == "paused":
        await service.dl.pause(HELD)
    elif how == "full":
        await service.dl.enqueue("demo.noop", queue=HELD, lock_key="filling")
        (filling,) = await protocol.claim(HELD, 1, WORKER)
        assert filling.lock_key == "filling"
        await service.dl.set_limits(HELD, max_running=1)


@pytest.mark.parametrize("how", ["paused", "full", "unserved"])
@pytest.mark.parametrize("end", ["one_statement", "with_stages", "handing_off"])
async def test_a_job_no_claim_takes_holds_back_no_parked_job_of_its_key_elsewhere(
    start_service: StartService, conn: asyncpg.Connection, how: str, end: str
) -> None:
    """The key's next job in claim order waits in a queue whose claims take nothing (paused,
    full, or served by nobody); a job of the key parked behind the running job in another
    queue must run once that job ends, not wait for the first: the end puts back the first
    job parked behind the key in each queue. Alike for the end written in one statement, with
    stages, and asking for the next job of its key (not of its queue: nothing is handed)."""
    service, protocol = await producer(start_service)
    await hold_queue(service, protocol, how)
    ahead = await service.dl.enqueue("demo.noop", queue=HELD, lock_key="k")
    await enqueue(service, "k")
    running = await claim_one(protocol)
    behind = await enqueue(service, "k")  # parked at insert behind the running job
    assert await parked(conn, behind) == "lock_key"

    facts = running.facts()
    ended = after_attempt(Outcome(Ended.SUCCEEDED), facts, Linear())
    stages = {running.job_id: [NewJob(queue=QUEUE, task="demo.noop")]}
    applied = await protocol.finish(
        [(running, facts, ended)],
        WORKER,
        hand_off=[running.job_id] if end == "handing_off" else (),
        stages=stages if end == "with_stages" else None,
    )
    assert applied[running.job_id].state == "written"
    assert protocol.handed_job(applied[running.job_id]) is None

    assert await parked(conn, behind) is None
    assert await parked(conn, ahead.job_id) is None  # still first in its own queue
    claimed = await protocol.claim(QUEUE, 10, WORKER)
    assert behind in [job.job_id for job in claimed]


async def test_the_look_again_puts_back_each_queues_first_parked_job(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """The look-again of an end under the key's parking lock (its snapshot held no next job,
    or another session held it): with no job of the key running, the first job parked behind
    the key in each queue goes back, though a job of the key is ready in another queue (one
    no claim may take), and the queue excepted keeps its own."""
    service, _ = await producer(start_service)
    await service.dl.pause(HELD)
    await service.dl.enqueue("demo.noop", queue=HELD, lock_key="k")
    first, second = [await enqueue(service, "k") for _ in range(2)]
    third = await service.dl.enqueue("demo.noop", queue="parking-3", lock_key="k")
    await conn.execute(
        "UPDATE dl_jobs SET parked = 'lock_key' WHERE job_id = ANY($1::uuid[])",
        [first, second, third.job_id],
    )
    async with conn.transaction():
        assert await conn.fetchval("SELECT dl_put_back_parked('k', 'parking-3')") == QUEUE
    assert [await parked(conn, j) for j in (first, second, third.job_id)] == [
        None,
        "lock_key",
        "lock_key",
    ]
    async with conn.transaction():  # as processes of the version before call it
        assert await conn.fetchval("SELECT dl_parked_unseen('k')") == "parking-3"
    assert await parked(conn, third.job_id) is None
    assert await parked(conn, second) == "lock_key"  # behind `first`, ready in its queue


async def test_the_reaper_puts_back_a_parked_job_though_its_key_is_ready_elsewhere(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """The sweep of stranded jobs looks at each queue of a key apart: a job of the key ready
    in a paused queue holds back none parked in another, with nothing of the key running."""
    service, protocol = await producer(start_service)
    await service.dl.pause(HELD)
    await service.dl.enqueue("demo.noop", queue=HELD, lock_key="k")
    stranded = [await enqueue(service, "k") for _ in range(2)]
    await conn.execute(
        "UPDATE dl_jobs SET parked = 'lock_key' WHERE job_id = ANY($1::uuid[])", stranded
    )
    reaper = Reaper(protocol, "test-reaper")
    assert await reaper.put_back_stranded() == 1
    assert [await parked(conn, j) for j in stranded] == [None, "lock_key"]
    assert await reaper.put_back_stranded() == 0  # stranded[0] is ready: the rest wait for it
    assert (await claim_one(protocol)).job_id == stranded[0]


async def test_a_job_parked_while_its_keys_end_is_written_is_put_back(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """A claim parks a job behind its key's running job at the moment that job's end is
    written, again and again: whichever commits first, the job is never left parked behind a
    key that nobody holds (the end, if it read the database before the parking committed,
    still finds the job parked when it puts it back). A race: without the end's lock of the
    next job, most of these tries leave it parked; with it, none may."""
    service, protocol = await producer(start_service)
    stranded = []
    for i in range(300):
        queue = key = f"race-{i}"
        first = await service.dl.enqueue("demo.noop", queue=queue, lock_key=key)
        waiting = await service.dl.enqueue("demo.noop", queue=queue, lock_key=key)
        (running,) = await protocol.claim(queue, 1, WORKER)
        assert running.job_id == first.job_id
        facts = running.facts()
        ended = after_attempt(Outcome(Ended.SUCCEEDED), facts, Linear())
        _, applied = await asyncio.gather(
            protocol.park([waiting.job_id]),
            protocol.finish([(running, facts, ended)], WORKER),
        )
        if applied[running.job_id].state == "busy":  # the parking held the row: again
            await finish_claimed(protocol, running, Outcome(Ended.SUCCEEDED), WORKER)
        if await parked(conn, waiting.job_id) is not None:
            stranded.append(i)
    assert stranded == []


@pytest.mark.parametrize("case", ["ready", "parked", "colliding key", "other queue"])
async def test_an_end_does_not_wait_for_a_next_job_someone_else_holds(
    start_service: StartService, conn: asyncpg.Connection, db_dsn: str, case: str
) -> None:
    """The end of a running job neither waits for, writes nor journals its key's next job
    while another session holds it (a user's transaction, here): it is written at once, not
    when that transaction ends (a wait there, with the ended jobs held, could deadlock with
    another end's search). A job left parked so, with nothing running, is put back by the
    reaper's sweep of stranded keys. `colliding key`: the next job's key differs but shares
    the hash, whose wait would be journalled. `other queue`: the next job's queue is still
    woken (its workers may not be this one's)."""
    service, protocol = await producer(start_service)
    keys = ["k", "k"]
    if case == "colliding key":
        keys = await conn.fetchval(
            "SELECT array_agg(k ORDER BY k) FROM (SELECT 'c-' || i AS k"
            " FROM generate_series(1, 300000) i) t GROUP BY hashtext(k) HAVING count(*) > 1"
            " LIMIT 1"
        )
    await enqueue(service, keys[0])
    if case == "other queue":
        elsewhere = await service.dl.enqueue("demo.noop", queue="parking-2", lock_key=keys[1])
        waiting = elsewhere.job_id
    else:
        waiting = await enqueue(service, keys[1])
    running = await claim_one(protocol)
    woken: list[str] = []
    await conn.add_listener("dl_jobs", lambda *args: woken.append(args[3]))
    parked_before = case == "parked"
    if parked_before:
        assert await park_walked(protocol) == 1
    holder = await asyncpg.connect(db_dsn)
    try:
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM dl_jobs WHERE job_id = $1 FOR UPDATE", waiting)
            facts = running.facts()
            ended = after_attempt(Outcome(Ended.SUCCEEDED), facts, Linear())
            finishing = asyncio.ensure_future(protocol.finish([(running, facts, ended)], WORKER))
            done, _ = await asyncio.wait([finishing], timeout=10)
            assert done, "the end waited for the holder of the next job"
            assert finishing.result()[running.job_id].state == "written"
    finally:
        await holder.close()
    if parked_before:
        assert await parked(conn, waiting) == "lock_key"
        assert await Reaper(protocol, "test-reaper").put_back_stranded() == 1
    assert await parked(conn, waiting) is None
    if case == "other queue":

        async def queue_woken() -> bool:
            return "parking-2" in woken

        await wait_until(queue_woken, what="a wake-up of the next job's queue")
        (claimed,) = await protocol.claim("parking-2", 1, WORKER)
        assert claimed.job_id == waiting
    else:
        assert (await claim_one(protocol)).job_id == waiting


#: The class of the two-key advisory lock on which inserts that park and ends meet
#: (migration 0029).
PARKING_LOCK = 1684828013


def insert_job(job_id: uuid.UUID, lock_key: str) -> tuple[object, ...]:
    """INSERT_JOB of a no-op job of `lock_key` in the tests' queue, parked if that key runs."""
    return parking_insert(job_id, QUEUE, "demo.noop", lock_key)


async def test_jobs_enqueued_behind_a_running_key_go_in_parked(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """A job whose lock_key's job runs is written parked: no claim walks it, and the running
    job's end puts it back as it puts back a job a claim parked."""
    service, protocol = await producer(start_service)
    first = await enqueue(service, "k")
    running = await claim_one(protocol)
    second = await enqueue(service, "k")
    batch = await service.dl.enqueue_many(
        [
            service.dl.job("demo.noop", queue=QUEUE, lock_key="k"),
            service.dl.job("demo.noop", queue=QUEUE, lock_key="other"),
            service.dl.job("demo.noop", queue=QUEUE),  # no lock_key: nothing to wait for
            service.dl.job("demo.noop", queue=QUEUE, lock_key="k", available_at=timedelta(hours=1)),
        ]
    )
    third, other, free, later = (r.job_id for r in batch)
    # an insert of an idempotency key may wait for another transaction's: it parks nothing
    # (it would hold up the running job's end meanwhile), and leaves the job to the claims
    (once, keyed_batch) = [
        await service.dl.enqueue("demo.noop", queue=QUEUE, lock_key="k", idempotency_key="once"),
        *await service.dl.enqueue_many(
            [service.dl.job("demo.noop", queue=QUEUE, lock_key="k", idempotency_key="many")]
        ),
    ]
    assert [await parked(conn, j) for j in (second, third, other, free, later)] == [
        "lock_key",
        "lock_key",
        None,
        None,
        "delayed",
    ]
    assert [await parked(conn, r.job_id) for r in (once, keyed_batch)] == [None, None]
    # the claim meets only the jobs that can run, and those the insert left unparked
    round_ = await protocol.claim_round(QUEUE, 10, WORKER, walk=10)
    assert sorted(j.job_id for j in round_.jobs) == sorted([other, free])
    assert sorted(round_.blocked) == sorted([once.job_id, keyed_batch.job_id])
    assert await protocol.park(round_.blocked) == 2

    await finish_claimed(protocol, running, Outcome(Ended.SUCCEEDED), WORKER)
    assert [await parked(conn, j) for j in (second, third)] == [None, "lock_key"]
    assert (await claim_one(protocol)).job_id == second
    assert first == running.job_id


async def test_an_insert_parks_nothing_while_an_end_of_its_key_holds_the_parking_lock(
    start_service: StartService, conn: asyncpg.Connection, db_dsn: str
) -> None:
    """An end under way holds the key's parking lock: it may have looked for the next job of
    its key before the insert is visible, so the new job goes in unparked, for a claim to
    judge."""
    service, protocol = await producer(start_service)
    await enqueue(service, "k")
    await claim_one(protocol)
    ending = await asyncpg.connect(db_dsn)
    try:
        async with ending.transaction():
            await ending.execute("SELECT pg_advisory_xact_lock($1, hashtext('k'))", PARKING_LOCK)
            second = await enqueue(service, "k")
    finally:
        await ending.close()
    assert await parked(conn, second) is None
    assert await park_walked(protocol) == 1  # the claim parks it, as it would any row
    assert await parked(conn, second) == "lock_key"


async def test_an_enqueue_in_the_callers_transaction_parks_nothing(
    start_service: StartService, conn: asyncpg.Connection, db_dsn: str
) -> None:
    """Parking at insert holds the key's parking lock until the insert commits, and the
    running job's end would wait for it: inside a caller's transaction, which may last, a job
    goes in unparked, and the key's lock stays free."""
    service, protocol = await producer(start_service)
    await enqueue(service, "k")
    await claim_one(protocol)
    caller = await asyncpg.connect(db_dsn)
    try:
        async with caller.transaction():
            result = await service.dl.enqueue(
                "demo.noop", queue=QUEUE, lock_key="k", connection=caller
            )
            (many,) = await service.dl.enqueue_many(
                [service.dl.job("demo.noop", queue=QUEUE, lock_key="k")], connection=caller
            )
            free = await conn.fetchval(
                "SELECT pg_try_advisory_lock($1, hashtext('k'))", PARKING_LOCK
            )
            assert free
            await conn.execute("SELECT pg_advisory_unlock($1, hashtext('k'))", PARKING_LOCK)
    finally:
        await caller.close()
    assert [await parked(conn, j) for j in (result.job_id, many.job_id)] == [None, None]


@pytest.mark.parametrize("staged", [False, True], ids=["one_statement", "with_stages"])
async def test_an_end_whose_snapshot_missed_a_job_parked_at_insert_puts_it_back(
    start_service: StartService, conn: asyncpg.Connection, db_dsn: str, staged: bool
) -> None:
    """The race: an insert parks a job behind the running job and commits after the end's
    statement began, so the end's snapshot holds no next job of the key. The end waits for the
    insert on the key's parking lock, looks again, and puts the job back; without that, it
    would stay parked behind a key nobody holds until the reaper's sweep. Alike for the end
    written in one statement (FINISH_JOBS) and for one that enqueues stages with it
    (SET_JOB_STATES, the stages, then WAKE_LOCK_WAITERS)."""
    service, protocol = await producer(start_service)
    await enqueue(service, "k")
    running = await claim_one(protocol)
    facts = running.facts()
    transition = after_attempt(Outcome(Ended.SUCCEEDED), facts, Linear())
    stages = {running.job_id: [NewJob(queue=QUEUE, task="demo.noop")]} if staged else None
    inserter = await asyncpg.connect(db_dsn)
    try:
        transaction = inserter.transaction()
        await transaction.start()  # the statement of an enqueue that commits at once, held open
        second = new_job_id()
        await inserter.execute(*insert_job(second, "k"))
        end = asyncio.create_task(
            protocol.finish([(running, facts, transition)], WORKER, stages=stages)
        )

        await wait_until(lambda: _at_least(conn, 1), what="the end to wait for the insert")
        assert not end.done()
        await transaction.commit()
        applied = await asyncio.wait_for(end, timeout=20)
        assert applied[running.job_id].state == "written"
    finally:
        await inserter.close()
    assert await parked(conn, second) is None
    claimed = await protocol.claim(QUEUE, 10, WORKER)
    assert second in [job.job_id for job in claimed]


async def test_heartbeats_and_ends_never_wait_for_an_insert_parking_behind_their_job(
    start_service: StartService, conn: asyncpg.Connection, db_dsn: str
) -> None:
    """An insert that parks locks no row: while it is open, the running job's heartbeat
    extends its lease."""
    service, protocol = await producer(start_service)
    await enqueue(service, "k")
    running = await claim_one(protocol)
    inserter = await asyncpg.connect(db_dsn)
    try:
        async with inserter.transaction():
            second = new_job_id()
            await inserter.execute(*insert_job(second, "k"))
            beats = await asyncio.wait_for(
                protocol.heartbeat([(running.job_id, running.claim_token, False)], WORKER),
                timeout=20,
            )
            assert beats[running.job_id].extended
    finally:
        await inserter.close()
    assert await parked(conn, second) == "lock_key"


async def test_no_job_parked_at_insert_is_left_behind_a_key_nobody_holds(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """Inserts racing the end of their key's running job, many times over: whichever commits
    first, no job is left parked once the end is written."""
    service, protocol = await producer(start_service)
    for round_ in range(100):
        key = f"race-{round_}"
        await enqueue(service, key)
        running = await claim_one(protocol)
        inserted, _ = await asyncio.gather(
            enqueue(service, key),
            finish_claimed(protocol, running, Outcome(Ended.SUCCEEDED), WORKER),
        )
        assert await parked(conn, inserted) is None, f"round {round_}"
        following = await claim_one(protocol)
        assert following.job_id == inserted
        await finish_claimed(protocol, following, Outcome(Ended.SUCCEEDED), WORKER)


async def parking_waiters(conn: asyncpg.Connection) -> int:
    """How many sessions wait for a key's parking lock."""
    waiting: int = await conn.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1"
        " AND NOT granted",
        PARKING_LOCK,
    )
    return waiting


async def test_a_job_parked_at_insert_is_put_back_when_the_next_job_it_waited_for_is_canceled(
    start_service: StartService, conn: asyncpg.Connection, db_dsn: str
) -> None:
    """Three at once: an insert parks a job behind the running job; the queued job that is next
    in the key's order is canceled; the running job ends. Neither end's snapshot holds the job
    parked at insert, and the running job's end sees the next job held by the cancel: each end
    looks again under the key's parking lock, and whichever looks last puts the job back."""
    service, protocol = await producer(start_service)
    await enqueue(service, "k")
    following = await enqueue(service, "k")  # next in the key's order, unparked
    running = await claim_one(protocol)
    facts = running.facts()
    ended = after_attempt(Outcome(Ended.SUCCEEDED), facts, Linear())
    inserter = await asyncpg.connect(db_dsn)
    canceller = await asyncpg.connect(db_dsn)
    try:
        inserting = inserter.transaction()
        await inserting.start()
        late = new_job_id()
        await inserter.execute(*insert_job(late, "k"))  # parked behind the running job
        canceling = canceller.transaction()
        await canceling.start()
        row = await canceller.fetchrow(*queries.JOB_FACTS.bind(job_id=following))
        following_facts = facts_of(row)
        cancel = asyncio.create_task(
            apply_transitions(
                canceller.fetch,
                [(Fence(following, following_facts), on_cancel(following_facts))],
                actor_role="by",
                actor="client",
            )
        )
        await wait_until(
            lambda: _at_least(conn, 1), what="the cancel to wait for the insert's parking lock"
        )
        end = asyncio.create_task(protocol.finish([(running, facts, ended)], WORKER))
        await wait_until(lambda: _at_least(conn, 2), what="the end to wait for it too")
        await inserting.commit()
        assert (await asyncio.wait_for(cancel, timeout=20))[following].state == "written"
        await canceling.commit()
        assert (await asyncio.wait_for(end, timeout=20))[running.job_id].state == "written"
    finally:
        await inserter.close()
        await canceller.close()
    assert await parked(conn, late) is None
    assert (await claim_one(protocol)).job_id == late


async def _at_least(conn: asyncpg.Connection, waiters: int) -> bool:
    return await parking_waiters(conn) >= waiters


async def test_a_cancel_of_the_next_job_waits_for_a_staged_end_that_found_it(
    start_service: StartService, conn: asyncpg.Connection, db_dsn: str
) -> None:
    """An end in several statements (with stages) has written its job's outcome and not
    committed; a job is parked at insert behind that job, which still runs to everyone else;
    the end finds the next job of its key (not the one parked at insert, which its snapshot
    may miss); a client cancels the next job. The end holds that job until it commits, so
    the cancel is written after, and then finds the job parked at insert and puts it back.
    Once the end has looked, it holds the key's parking lock: an insert then parks nothing."""
    service, protocol = await producer(start_service)
    await enqueue(service, "k")
    following = await enqueue(service, "k")
    running = await claim_one(protocol)
    facts = running.facts()
    fence = Fence(running.job_id, facts, running.claim_token)
    ending = await asyncpg.connect(db_dsn)
    try:
        async with ending.transaction():
            written = await set_states(
                ending,
                [(fence, after_attempt(Outcome(Ended.SUCCEEDED), facts, Linear()))],
                actor_role="worker",
                actor=WORKER,
            )
            late = await enqueue(service, "k")  # committed at once, parked behind the job
            assert await parked(conn, late) == "lock_key"
            await release_keys(ending, written, actor=WORKER)
            assert await parked(conn, late) == "lock_key"  # behind the next job, in its queue
            later = await enqueue(service, "k")
            assert await parked(conn, later) is None
            row = await conn.fetchrow(*queries.JOB_FACTS.bind(job_id=following))
            following_facts = facts_of(row)
            cancel = [(Fence(following, following_facts), on_cancel(following_facts))]
            applied = await apply_transitions(conn.fetch, cancel, actor_role="by", actor="test")
            assert applied[following].state == "busy"  # held by the end: not written yet
    finally:
        await ending.close()
    assert (await service.dl.cancel(following)).status is JobStatus.CANCELED
    assert await parked(conn, late) is None
    assert (await claim_one(protocol)).job_id == late
