"""The completer writes every outcome of a flush in one statement: one outcome the database
refuses must not take the others down with it, and two outcomes of one job (an earlier claim's
and the current one's) must not be confused."""

from __future__ import annotations

import logging
import uuid

import asyncpg

from dataloader.base import JobStatus
from dataloader.core.transitions import Ended, Outcome
from dataloader.logger.context_vars import current_context
from dataloader.workers.runtime import RunningJob

from .conftest import Service, StartService
from .helpers import event_kinds, event_payloads, lifecycle_kinds, wait_until

#: A queue no worker of the test's service serves: its jobs are claimed by hand.
MANUAL = "manual"

#: Any write ending a running job of task `t.poison` fails with an error of the statement (as
#: an operator's trigger or a constraint could), not of the connection.
REFUSE_POISON = """
CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'outcome refused for this test'; END $$;
CREATE TRIGGER refuse_poison BEFORE UPDATE ON dl_jobs
FOR EACH ROW WHEN (NEW.task = 't.poison' AND OLD.status = 'running' AND NEW.status <> 'running')
EXECUTE FUNCTION refuse_poison();
"""


def success(value: int) -> Outcome:
    return Outcome(Ended.SUCCEEDED, result=f'{{"value": {value}}}', duration_ms=1)


async def status_of(conn: asyncpg.Connection, job_id: uuid.UUID) -> str:
    status: str = await conn.fetchval("SELECT status::text FROM dl_jobs WHERE job_id = $1", job_id)
    return status


def running(service: Service, claimed: RunningJob) -> RunningJob:
    """Register a job claimed by hand as the service's own running job (its lease is then kept
    alive by the service's heartbeat, as for a job it runs)."""
    service.manager.runtime.running[claimed.job.job_id] = claimed
    return claimed


async def test_an_outcome_the_database_refuses_does_not_take_the_flush_down(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service()
    runtime, completer = service.manager.runtime, service.manager.completer
    await conn.execute(REFUSE_POISON)
    poison = await service.dl.enqueue("t.poison", lock_key="p", queue=MANUAL)
    good = [await service.dl.enqueue("t.good", lock_key=f"g{i}", queue=MANUAL) for i in range(3)]
    claims = await runtime.protocol.claim(MANUAL, 4, runtime.worker_id)
    assert len(claims) == 4
    jobs = {c.job_id: running(service, RunningJob(c)) for c in claims}
    for i, claim in enumerate(claims):  # one tick: the writer starts after the last one
        await completer.finish(jobs[claim.job_id], success(i))
    await completer.wait_flushed()

    for job in good:
        assert await status_of(conn, job.job_id) == "succeeded"
        assert await lifecycle_kinds(conn, str(job.job_id)) == ["queued", "picked", "done"]
        assert job.job_id not in runtime.running
    # the refused one alone was given up to the reaper: its lease is no longer extended
    assert await status_of(conn, poison.job_id) == "running"
    assert jobs[poison.job_id].gone
    assert poison.job_id not in runtime.running


async def test_two_outcomes_of_one_job_in_a_flush_are_each_fenced_on_their_claim(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """The first claim's outcome was still being retried when the reaper sent the job back and
    this process claimed it again (with the same attempt number, after a re-run); both
    outcomes reach one flush. Only the current claim's may be written."""
    service = await start_service()
    runtime, completer = service.manager.runtime, service.manager.completer
    job = await service.dl.enqueue(
        "t.twice", {"v": 1}, lock_key="k", queue=MANUAL, idempotency_key="twice"
    )
    (first,) = await runtime.protocol.claim(MANUAL, 1, runtime.worker_id)
    rerun = await service.dl.enqueue(
        "t.twice", {"v": 2}, lock_key="k", queue=MANUAL, idempotency_key="twice", rerun=True
    )
    assert rerun.rerun
    await conn.execute(
        "UPDATE dl_jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = $1",
        job.job_id,
    )

    async def requeued_by_the_reaper() -> bool:
        return await status_of(conn, job.job_id) == "queued"

    await wait_until(requeued_by_the_reaper, what="the service's reaper to send the job back")
    (second,) = await runtime.protocol.claim(MANUAL, 1, runtime.worker_id)
    assert (second.attempt, second.claim_token != first.claim_token) == (first.attempt, True)

    stale = RunningJob(first)  # its slot in the running set went to the new claim
    current = running(service, RunningJob(second))
    await completer.finish(stale, Outcome(Ended.FAILED, "the stale claim's failure"))
    await completer.finish(current, success(2))
    await completer.wait_flushed()

    state = await service.dl.get(job.job_id)
    assert state is not None
    assert (state.status, state.result, state.error) == (JobStatus.SUCCEEDED, {"value": 2}, None)
    kinds = await lifecycle_kinds(conn, str(job.job_id))
    assert kinds[-2:] == ["picked", "done"]  # nothing of the stale claim's


async def test_an_outcome_decided_before_a_cancel_request_is_decided_again(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """The attempt failed before its worker heard of the cancel request: decided on the
    claim's facts, the failure would be retried; the write finds the row changed and decides
    again on its facts now, and the job ends canceled."""
    service = await start_service()
    runtime, completer = service.manager.runtime, service.manager.completer
    job = await service.dl.enqueue("t.cancelled", lock_key="k", queue=MANUAL)
    (claim,) = await runtime.protocol.claim(MANUAL, 1, runtime.worker_id)
    asked = await service.dl.cancel(job.job_id)
    assert (asked.status, asked.cancel_requested) == (JobStatus.RUNNING, True)
    unaware = RunningJob(claim)  # the claim's facts: no cancel requested
    await completer.finish(unaware, Outcome(Ended.FAILED, "Boom: flaky"))
    await completer.wait_flushed()
    state = await service.dl.get(job.job_id)
    assert state is not None
    assert (state.status, state.attempt) == (JobStatus.CANCELED, 1)
    kinds = await event_kinds(conn, str(job.job_id))
    assert kinds == ["queued", "picked", "cancel_requested", "canceled"]


async def test_a_success_while_a_rerun_was_requested_runs_the_newest_version(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service()
    runtime, completer = service.manager.runtime, service.manager.completer
    job = await service.dl.enqueue(
        "t.versions", {"v": 1}, lock_key="k", queue=MANUAL, idempotency_key="versions"
    )
    (claim,) = await runtime.protocol.claim(MANUAL, 1, runtime.worker_id)
    await service.dl.enqueue(
        "t.versions", {"v": 2}, lock_key="k", queue=MANUAL, idempotency_key="versions", rerun=True
    )
    await completer.finish(RunningJob(claim), success(1))
    await completer.wait_flushed()
    state = await service.dl.get(job.job_id)
    assert state is not None
    assert (state.status, state.attempt, state.rerun_requested) == (JobStatus.QUEUED, 0, False)
    (args,) = await conn.fetch("SELECT args::text FROM dl_jobs WHERE job_id = $1", job.job_id)
    assert args["args"] == '{"v": 2}'
    (rerun,) = [e.payload for e in await service.dl.events(job.job_id) if e.kind == "rerun"]
    assert rerun is not None
    assert rerun["ended"] == "done"


async def test_a_rerun_asked_for_while_the_job_backed_off_runs_it_once(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """Claimed, then handed back because its lock_key was busy: it never ran, so a re-run
    asked for meanwhile is its next run (of the newest version), not one more after it."""
    service = await start_service()
    runtime, completer = service.manager.runtime, service.manager.completer
    job = await service.dl.enqueue(
        "t.versions", {"v": 1}, lock_key="k", queue=MANUAL, idempotency_key="versions"
    )
    (claim,) = await runtime.protocol.claim(MANUAL, 1, runtime.worker_id)
    await service.dl.enqueue(
        "t.versions", {"v": 2}, lock_key="k", queue=MANUAL, idempotency_key="versions", rerun=True
    )
    await completer.finish(RunningJob(claim), Outcome(Ended.BACKED_OFF, holder="running job"))
    await completer.wait_flushed()
    state = await service.dl.get(job.job_id)
    assert state is not None
    assert (state.status, state.rerun_requested) == (JobStatus.QUEUED, False)
    (again,) = await runtime.protocol.claim(MANUAL, 1, runtime.worker_id)
    assert again.args == {"v": 2}
    await completer.finish(RunningJob(again), success(2))
    await completer.wait_flushed()
    state = await service.dl.get(job.job_id)
    assert state is not None
    assert (state.status, state.result) == (JobStatus.SUCCEEDED, {"value": 2})


async def test_outcomes_of_every_kind_in_one_flush_are_each_written_as_decided(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """One statement writes a flush: jobs sharing the shape of their transition (two
    successes) and jobs of shapes of their own each get their own values."""
    service = await start_service()
    runtime, completer = service.manager.runtime, service.manager.completer
    outcomes = {
        "ok-1": success(1),
        "ok-2": success(2),
        "retried": Outcome(Ended.FAILED, "try again", duration_ms=3),
        "failed": Outcome(Ended.FAILED, "hopeless", retryable=False, duration_ms=4),
        "handed-back": Outcome(Ended.HANDED_BACK, "stopping", refund=True, duration_ms=5),
    }
    for key in outcomes:
        await service.dl.enqueue("t.mixed", lock_key=key, queue=MANUAL, max_attempts=3)
    claimed = await runtime.protocol.claim(MANUAL, len(outcomes), runtime.worker_id)
    assert len(claimed) == len(outcomes)
    for job in claimed:
        await completer.finish(running(service, RunningJob(job)), outcomes[job.lock_key])
    await completer.wait_flushed()

    rows = await conn.fetch(
        "SELECT lock_key, status::text, attempt, error, result::text, duration_ms "
        "FROM dl_jobs WHERE queue = $1",
        MANUAL,
    )
    assert {r["lock_key"]: tuple(r)[1:] for r in rows} == {
        "ok-1": ("succeeded", 1, None, '{"value": 1}', 1),
        "ok-2": ("succeeded", 1, None, '{"value": 2}', 1),
        "retried": ("queued", 1, "try again", None, 3),
        "failed": ("failed", 1, "hopeless", None, 4),
        "handed-back": ("queued", 0, None, None, None),  # not a failure: nothing recorded
    }
    handed_back = next(job.job_id for job in claimed if job.lock_key == "handed-back")
    (requeue,) = await event_payloads(conn, str(handed_back), "requeue")
    assert (requeue["reason"], requeue["refunded"]) == ("stopping", True)


class ContextRecorder(logging.Handler):
    """Records each line's level, message and the log context it was written in."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[int, str, dict[str, str]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage(), current_context()))


async def test_each_written_outcome_is_logged_in_its_jobs_context_and_counted(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service()
    runtime, completer = service.manager.runtime, service.manager.completer
    good = await service.dl.enqueue("t.good", lock_key="g", queue=MANUAL)
    bad = await service.dl.enqueue("t.bad", lock_key="b", queue=MANUAL)
    claims = await runtime.protocol.claim(MANUAL, 2, runtime.worker_id)
    outcomes = {
        good.job_id: success(1),
        bad.job_id: Outcome(Ended.FAILED, "boom", retryable=False, duration_ms=1),
    }
    recorder = ContextRecorder()
    logger = logging.getLogger("dataloader.workers.completer")
    level = logger.level
    logger.addHandler(recorder)
    logger.setLevel(logging.DEBUG)
    try:
        for claim in claims:
            await completer.finish(running(service, RunningJob(claim)), outcomes[claim.job_id])
        await completer.wait_flushed()
    finally:
        logger.removeHandler(recorder)
        logger.setLevel(level)
    summary, summary_logger = ContextRecorder(), logging.getLogger("dataloader.workers")
    summary_level = summary_logger.level
    summary_logger.addHandler(summary)
    summary_logger.setLevel(logging.INFO)
    try:
        runtime.summary.flush()
    finally:
        summary_logger.removeHandler(summary)
        summary_logger.setLevel(summary_level)

    def context(job_id: uuid.UUID, task: str) -> dict[str, str]:
        return {"job_id": str(job_id), "queue": MANUAL, "task": task}

    # a success is a DEBUG line (a periodic summary counts it at INFO), a failure a WARNING
    assert sorted(recorder.lines) == [
        (logging.DEBUG, "job succeeded", context(good.job_id, "t.good")),
        (logging.WARNING, "job attempt failed (failed): boom", context(bad.job_id, "t.bad")),
    ]
    ((level, message, _),) = summary.lines
    assert level == logging.INFO
    assert message.startswith(f"queue {MANUAL}: 1 done, 1 failed in the last ")
