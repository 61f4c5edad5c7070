"""The write path's seam: a caller sets the states of its jobs inside its own transaction
(`set_states`), adds its own statements for the jobs whose fence held, then wakes and hands off
the next jobs of the keys they free (`release_keys`), all committed together or not at all."""

from __future__ import annotations

import hashlib
import uuid

import asyncpg

from dataloader.core.models import NewJob
from dataloader.core.retry import Linear
from dataloader.core.transitions import Ended, Outcome, Transition, after_attempt
from dataloader.storage.protocol import ClaimedJob, WorkerProtocol
from dataloader.storage.repositories import enqueue
from dataloader.storage.transitions import Fence, release_keys, set_states

from .conftest import StartService

WORKER = "seam"
QUEUE = "seam"


def success(job: ClaimedJob) -> tuple[Fence, Transition]:
    facts = job.facts()
    return Fence(job.job_id, facts, job.claim_token), after_attempt(
        Outcome(Ended.SUCCEEDED), facts, Linear()
    )


async def test_a_callers_statements_commit_with_the_states_and_the_hand_off(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False)
    protocol = WorkerProtocol(service.context.pool)
    first, second = [
        (await service.dl.enqueue("demo.noop", queue=QUEUE, lock_key="chain")).job_id
        for _ in range(2)
    ]
    [claimed] = await protocol.claim(QUEUE, 1, WORKER)
    assert claimed.job_id == first
    stranger = uuid.uuid4()
    seed = uuid.uuid4()
    fence, transition = success(claimed)
    wrong = Fence(stranger, claimed.facts(), uuid.uuid4())
    async with protocol.db.transaction() as tx:
        states = await set_states(
            tx,
            [(fence, transition), (wrong, transition)],
            actor_role="worker",
            actor=WORKER,
        )
        assert states.written == [first]  # the stranger's fence does not hold
        timer = await enqueue(tx, NewJob(queue=QUEUE, task="demo.noop", lock_key="timer"))
        applied = await release_keys(
            tx, states, actor=WORKER, wakes_own_queue=True, hand_off=[first], claim_seed=seed
        )
    handed = protocol.handed_job(applied[first])
    assert handed is not None
    assert handed.job_id == second
    assert handed.claim_token == uuid.UUID(hashlib.md5(f"{seed}/{first}".encode()).hexdigest())
    rows = {
        r["job_id"]: r["status"]
        for r in await conn.fetch(
            "SELECT job_id, status::text FROM dl_jobs WHERE job_id = ANY($1::uuid[])",
            [first, second, timer.job_id],
        )
    }
    assert rows == {first: "succeeded", second: "running", timer.job_id: "queued"}
    kinds = [
        r["kind"]
        for r in await conn.fetch(
            "SELECT kind FROM dl_job_events WHERE job_id = $1 ORDER BY event_id", first
        )
    ]
    assert kinds[-1] == transition.journal


async def test_nothing_is_written_when_the_callers_transaction_rolls_back(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False)
    protocol = WorkerProtocol(service.context.pool)
    job_id = (await service.dl.enqueue("demo.noop", queue=QUEUE, lock_key="k")).job_id
    [claimed] = await protocol.claim(QUEUE, 1, WORKER)

    class Refused(Exception):
        pass

    try:
        async with protocol.db.transaction() as tx:
            states = await set_states(
                tx,
                [success(claimed)],
                actor_role="worker",
                actor=WORKER,
            )
            assert states.written == [job_id]
            raise Refused  # the caller's own statement failed
    except Refused:
        pass
    status = await conn.fetchval("SELECT status::text FROM dl_jobs WHERE job_id = $1", job_id)
    assert status == "running"
    # the fence still holds: the outcome can be written again
    written = await protocol.finish(
        [(claimed, claimed.facts(), success(claimed)[1])],
        WORKER,
    )
    assert written[job_id].state == "written"
