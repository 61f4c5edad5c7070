"""`Client.wait`, cancel and retry of jobs that workers run, and re-runs on update: the client
over each source of connections, against an in-process service whose workers run the jobs.

Waits are woken by LISTEN/NOTIFY: the tests stretch the client's re-check period to ten
minutes, so a wait that returns within seconds of the job's end was woken by the database.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest

import dataloader.client
from dataloader import (
    Client,
    IdempotencyConflict,
    JobContext,
    JobEvent,
    JobNotFound,
    JobStatus,
    NotRetryable,
)
from dataloader.core.transitions import Ended, Outcome
from dataloader.storage.db import create_pool
from dataloader.storage.protocol import WorkerProtocol
from dataloader.tasks import TaskRegistry

from .clients import FINISHED_LISTENERS, SOURCES, listen_tasks, open_client
from .conftest import StartService, wait_until
from .helpers import finish_claimed

#: A wait that returns later than this after its job ended was not woken by the notification.
WOKEN_WITHIN_SEC = 5.0
#: A queue no worker of these tests serves: its jobs stay queued.
UNSERVED = "unserved"
#: A task no process defines: its jobs on UNSERVED wait for ever (no definition names a queue).
IDLE = "t.idle"


@dataclass
class Runs:
    """What the test task did: each run's (job, args, attempt), and gates runs wait on."""

    runs: list[tuple[uuid.UUID, dict[str, Any], int]] = field(default_factory=list)
    gates: defaultdict[str, asyncio.Event] = field(
        default_factory=lambda: defaultdict(asyncio.Event)
    )
    #: When (monotonic) each gate was opened.
    opened: dict[str, float] = field(default_factory=dict)

    def open(self, gate: str) -> None:
        self.opened[gate] = time.monotonic()
        self.gates[gate].set()

    def args_of(self, job_id: uuid.UUID) -> list[dict[str, Any]]:
        return [args for job, args, _ in self.runs if job == job_id]


@pytest.fixture(autouse=True)
def long_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waits re-read their job only every ten minutes: only a notification wakes them sooner."""
    monkeypatch.setattr(dataloader.client, "WAIT_RECHECK_SEC", 600.0)


@pytest.fixture
def runs(registry: TaskRegistry) -> Runs:
    """Registers `t.work` (queue default): records its run, waits for the gate named in its
    args (if any), saves a checkpoint, fails when asked unless it resumed from a checkpoint,
    returns {"echo": args.value}; `t.anywhere`, on the queue each job names; and
    `t.cancellable`, which runs until asked to stop."""
    done = Runs()

    @registry.task("t.work", queue="default")
    async def work(ctx: JobContext[dict[str, Any]]) -> dict[str, Any]:
        done.runs.append((ctx.job_id, dict(ctx.args), ctx.attempt))
        resumed = ctx.resume_from
        await ctx.set_progress(stage="started")
        if "gate" in ctx.args:
            await done.gates[ctx.args["gate"]].wait()
        await ctx.checkpoint({"resume_from": resumed, "page": 2})
        if ctx.args.get("fail") and resumed is None:
            raise RuntimeError("failing on purpose")
        return {"echo": ctx.args.get("value")}

    @registry.task("t.anywhere")  # no queue of its own: each job names one
    async def anywhere(ctx: JobContext[dict[str, Any]]) -> None:
        done.runs.append((ctx.job_id, dict(ctx.args), ctx.attempt))

    @registry.task("t.cancellable", queue="default")
    async def cancellable(ctx: JobContext[dict[str, Any]]) -> None:
        done.runs.append((ctx.job_id, dict(ctx.args), ctx.attempt))

        async def asked() -> bool:
            return ctx.cancel_requested

        await wait_until(asked, what="the cancel request to reach the task")
        ctx.check_cancelled()

    return done


@pytest.fixture(params=SOURCES)
async def client(
    request: pytest.FixtureRequest,
    db_dsn: str,
    registry: TaskRegistry,
    runs: Runs,
    start_service: StartService,
) -> AsyncIterator[Client]:
    """A client on each source, beside a service whose workers serve queue `default`."""
    await start_service()
    async with open_client(request.param, db_dsn, registry=registry) as opened:
        yield opened


async def listeners(conn: asyncpg.Connection) -> list[int]:
    """Pids of the sessions LISTENing for ended jobs."""
    return [r["pid"] for r in await conn.fetch(FINISHED_LISTENERS)]


async def status_is(client: Client, job_id: uuid.UUID, status: JobStatus) -> bool:
    state = await client.get(job_id)
    return state is not None and state.status == status


async def until_status(client: Client, job_id: uuid.UUID, status: JobStatus) -> None:
    async def probe() -> bool:
        return await status_is(client, job_id, status)

    await wait_until(probe, what=f"job {job_id} to be {status}")


async def until_waiting(client: Client, conn: asyncpg.Connection, waits: int) -> int:
    """Once `waits` waits are registered and one connection LISTENs: its pid."""

    async def ready() -> list[int] | None:
        registered = sum(len(w) for w in client._finished._waiters.values())
        found = await listeners(conn)
        return found if registered == waits and found else None

    found = await wait_until(ready, what=f"{waits} waits on one listening connection")
    assert len(found) == 1, found
    return found[0]


def payload_of(events: list[JobEvent], kind: str) -> dict[str, Any]:
    """The payload of the journal's only entry of `kind`."""
    [payload] = [e.payload for e in events if e.kind == kind]
    assert payload is not None
    return payload


def kinds(events: list[JobEvent]) -> list[str]:
    """The journal's kinds, without the heartbeats a worker journals now and then."""
    return [e.kind for e in events if e.kind != "heartbeat"]


# --- wait ---------------------------------------------------------------------------------


async def test_wait_returns_the_final_state_when_a_worker_finishes_the_job(
    client: Client, conn: asyncpg.Connection, runs: Runs
) -> None:
    job = await client.enqueue("t.work", {"gate": "g", "value": [1, "x"]}, lock_key="k")
    waiting = asyncio.create_task(client.wait(job.job_id, timeout=60))
    await until_status(client, job.job_id, JobStatus.RUNNING)
    await until_waiting(client, conn, 1)
    runs.open("g")
    state = await waiting
    assert time.monotonic() - runs.opened["g"] < WOKEN_WITHIN_SEC
    assert state.status == JobStatus.SUCCEEDED
    assert state.result == {"echo": [1, "x"]}
    assert isinstance(state.duration_ms, int)
    assert state.duration_ms >= 0
    assert isinstance(state.worker_id, str)
    assert state.worker_id
    assert state.checkpoint == {"resume_from": None, "page": 2}
    assert state.progress == {"stage": "started"}
    assert state == await client.get(job.job_id)
    # a job that has ended is returned at once, without listening
    assert await client.wait(job.job_id, timeout=5) == state


async def test_concurrent_waits_share_one_listening_connection_and_give_it_back(
    client: Client, conn: asyncpg.Connection, runs: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dataloader.client, "LISTEN_LINGER_SEC", 0.2)
    jobs = await client.enqueue_many(
        [client.job("t.work", {"gate": "all", "value": i}, lock_key=f"k{i}") for i in range(20)]
    )
    waits = [asyncio.create_task(client.wait(j.job_id, timeout=60)) for j in jobs]
    pid = await until_waiting(client, conn, 20)
    runs.open("all")
    states = await asyncio.gather(*waits)
    assert time.monotonic() - runs.opened["all"] < 20  # four slots run twenty jobs
    assert [s.result for s in states] == [{"echo": i} for i in range(20)]

    async def nobody_listens() -> bool:
        return not await listeners(conn) and not listen_tasks()

    await wait_until(nobody_listens, what="the listening connection to be given back")
    # given back, not cut off: its session lives on in the pool
    alive = await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)
    assert alive == 1


async def test_waits_one_after_another_keep_one_listening_session_until_a_quiet_spell(
    client: Client, conn: asyncpg.Connection, runs: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that waits again soon after a wait (a caller of processes, say) does not
    LISTEN anew for each wait; after LISTEN_LINGER_SEC without one, it gives the session back."""
    monkeypatch.setattr(dataloader.client, "LISTEN_LINGER_SEC", 3600.0)
    runs.open("go")
    pids = set()
    for i in range(3):
        job = await client.enqueue("t.work", {"gate": "go", "value": i}, lock_key=f"k{i}")
        assert (await client.wait(job.job_id, timeout=60)).result == {"echo": i}
        assert client._finished.listening
        pids.update(await listeners(conn))
    assert len(pids) == 1  # the same session all along

    monkeypatch.setattr(dataloader.client, "LISTEN_LINGER_SEC", 0.2)
    job = await client.enqueue("t.work", {"gate": "go", "value": 3}, lock_key="k3")
    await client.wait(job.job_id, timeout=60)  # its lingering is the short one

    async def nobody_listens() -> bool:
        return not await listeners(conn) and not listen_tasks()

    await wait_until(nobody_listens, what="the listening connection to be given back")
    assert not client._finished.listening


async def test_wait_times_out_with_a_clear_message(client: Client) -> None:
    job = await client.enqueue(IDLE, {}, queue=UNSERVED, lock_key="k")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"^job {job.job_id} has not ended within 0.5 s$"):
        await client.wait(job.job_id, timeout=0.5)
    assert 0.5 <= time.monotonic() - started < WOKEN_WITHIN_SEC
    assert await status_is(client, job.job_id, JobStatus.QUEUED)


async def test_wait_for_an_unknown_job_raises_job_not_found(
    client: Client, conn: asyncpg.Connection
) -> None:
    unknown = uuid.uuid4()
    with pytest.raises(JobNotFound, match=str(unknown)):
        await client.wait(unknown, timeout=5)
    with pytest.raises(JobNotFound, match="not a job id"):
        await client.wait("nope", timeout=5)
    assert await listeners(conn) == []  # nothing to listen for


async def test_a_job_canceled_while_queued_wakes_its_waiter(
    client: Client, conn: asyncpg.Connection
) -> None:
    job = await client.enqueue(IDLE, {}, queue=UNSERVED, lock_key="k")
    waiting = asyncio.create_task(client.wait(job.job_id, timeout=60))
    await until_waiting(client, conn, 1)
    canceled_at = time.monotonic()
    await client.cancel(job.job_id)
    state = await waiting
    assert time.monotonic() - canceled_at < WOKEN_WITHIN_SEC
    assert state.status == JobStatus.CANCELED


async def test_a_terminated_listening_connection_loses_no_waiter(
    client: Client, conn: asyncpg.Connection, runs: Runs
) -> None:
    job = await client.enqueue("t.work", {"gate": "g", "value": 1}, lock_key="k")
    waiting = asyncio.create_task(client.wait(job.job_id, timeout=60))
    first = await until_waiting(client, conn, 1)
    assert await conn.fetchval("SELECT pg_terminate_backend($1)", first)

    async def listening_again() -> list[int]:
        return [pid for pid in await listeners(conn) if pid != first]

    await wait_until(listening_again, what="a new listening connection")
    runs.open("g")
    state = await waiting
    assert time.monotonic() - runs.opened["g"] < WOKEN_WITHIN_SEC
    assert state.status == JobStatus.SUCCEEDED


async def test_a_lost_listening_connection_is_replaced_at_once_and_quietly(
    client: Client, conn: asyncpg.Connection, runs: Runs, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that goes away under the LISTEN (a failover, a restart) is an event the
    listener expects: it listens again on a new connection at once, with no warning (the
    pool has already taken the lost connection back, and there is nothing left to undo)."""
    job = await client.enqueue("t.work", {"gate": "g", "value": 1}, lock_key="k")
    waiting = asyncio.create_task(client.wait(job.job_id, timeout=60))
    first = await until_waiting(client, conn, 1)
    with caplog.at_level(logging.WARNING, logger="dataloader.client"):
        assert await conn.fetchval("SELECT pg_terminate_backend($1)", first)

        async def listening_again() -> list[int]:
            return [pid for pid in await listeners(conn) if pid != first]

        await wait_until(listening_again, what="a new listening connection")
    assert [r.getMessage() for r in caplog.records if r.name == "dataloader.client"] == []
    runs.open("g")
    assert (await waiting).status == JobStatus.SUCCEEDED


async def test_a_job_ending_while_nobody_listens_is_not_missed(
    client: Client, conn: asyncpg.Connection, runs: Runs
) -> None:
    """The listening connection is cut and the job ends before a new one listens: the new
    listener has every waiter read its job again."""
    job = await client.enqueue("t.work", {"gate": "g", "value": 1}, lock_key="k")
    waiting = asyncio.create_task(client.wait(job.job_id, timeout=60))
    first = await until_waiting(client, conn, 1)
    await until_status(client, job.job_id, JobStatus.RUNNING)
    runs.open("g")
    assert await conn.fetchval("SELECT pg_terminate_backend($1)", first)
    state = await waiting
    assert time.monotonic() - runs.opened["g"] < WOKEN_WITHIN_SEC
    assert state.status == JobStatus.SUCCEEDED


async def test_ends_are_announced_only_while_a_client_listens(
    client: Client, conn: asyncpg.Connection, db_dsn: str
) -> None:
    """Each notification wakes every listening session of the database, workers' included:
    nothing is announced while no client waits. Notifications arrive in commit order, so an
    announcement of the first end would arrive before that of the second."""
    heard: list[str] = []
    eavesdropper = await asyncpg.connect(db_dsn)  # listens, but is not a client
    try:
        await eavesdropper.add_listener(
            "dl_job_finished", lambda _c, _p, _ch, payload: heard.append(payload)
        )
        await eavesdropper.execute("SELECT 1")  # not counted among listeners (`listeners`)
        unheard = await client.enqueue(IDLE, {}, queue=UNSERVED, lock_key="a")
        await client.cancel(unheard.job_id)
        awaited = await client.enqueue(IDLE, {}, queue=UNSERVED, lock_key="b")
        waiting = asyncio.create_task(client.wait(awaited.job_id, timeout=60))
        await until_waiting(client, conn, 1)
        await client.cancel(awaited.job_id)
        assert (await waiting).status == JobStatus.CANCELED

        async def announced() -> bool:
            await eavesdropper.execute("SELECT 1")  # notifications come before its answer
            return bool(heard)

        await wait_until(announced, what="the awaited end to be announced")
        assert heard == [str(awaited.job_id)]
    finally:
        await eavesdropper.close()


async def test_close_ends_pending_waits_and_leaves_no_task_nor_listener(
    client: Client, conn: asyncpg.Connection
) -> None:
    job = await client.enqueue(IDLE, {}, queue=UNSERVED, lock_key="k")
    waiting = asyncio.create_task(client.wait(job.job_id))
    pid = await until_waiting(client, conn, 1)
    await client.close()
    with pytest.raises(RuntimeError, match="the client is closed"):
        await waiting
    assert listen_tasks() == []
    with pytest.raises(RuntimeError, match="the client is closed"):
        await client.wait(job.job_id)

    async def unlistened() -> bool:  # UNLISTENed (or its session ended with its pool)
        return pid not in await listeners(conn)

    await wait_until(unlistened, what="the listening connection to be given back")


# --- cancel and retry of jobs workers run ------------------------------------------------------


async def test_cancel_of_a_running_job_reaches_its_task(client: Client, runs: Runs) -> None:
    job = await client.enqueue("t.cancellable", {}, lock_key="k")
    await until_status(client, job.job_id, JobStatus.RUNNING)
    asked = await client.cancel(job.job_id)
    assert (asked.status, asked.cancel_requested) == (JobStatus.RUNNING, True)
    state = await client.wait(job.job_id, timeout=30)
    assert state.status == JobStatus.CANCELED
    assert kinds(await client.events(job.job_id)) == [
        "queued",
        "picked",
        "cancel_requested",
        "canceled",
    ]
    assert len(runs.runs) == 1
    # a finished job is left alone
    assert (await client.cancel(job.job_id)).status == JobStatus.CANCELED
    assert kinds(await client.events(job.job_id))[-1] == "canceled"


async def test_retry_runs_a_failed_job_again_from_its_checkpoint(
    client: Client, runs: Runs
) -> None:
    job = await client.enqueue("t.work", {"fail": True, "value": 5}, lock_key="k", max_attempts=1)
    failed = await client.wait(job.job_id, timeout=30)
    assert (failed.status, failed.attempt) == (JobStatus.FAILED, 1)
    assert failed.checkpoint == {"resume_from": None, "page": 2}
    assert failed.error is not None
    assert "failing on purpose" in failed.error

    retried = await client.retry(job.job_id)
    assert retried.status in {JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SUCCEEDED}
    state = await client.wait(job.job_id, timeout=30)
    assert state.status == JobStatus.SUCCEEDED
    assert state.attempt == 1  # a fresh budget: the first attempt again
    assert state.result == {"echo": 5}
    # the checkpoint stayed: the second run resumed from it
    assert state.checkpoint == {"resume_from": {"resume_from": None, "page": 2}, "page": 2}
    events = await client.events(job.job_id)
    assert kinds(events) == ["queued", "picked", "failed", "retried", "picked", "done"]
    assert payload_of(events, "retried")["was"] == "failed"
    assert len(runs.runs) == 2
    with pytest.raises(NotRetryable, match="it succeeded"):
        await client.retry(job.job_id)


async def test_retry_refuses_a_running_job(client: Client, runs: Runs) -> None:
    job = await client.enqueue("t.work", {"gate": "g"}, lock_key="k")
    await until_status(client, job.job_id, JobStatus.RUNNING)
    with pytest.raises(NotRetryable, match="it is running"):
        await client.retry(job.job_id)
    runs.open("g")
    assert (await client.wait(job.job_id, timeout=30)).status == JobStatus.SUCCEEDED


async def test_retry_of_a_lost_job_queues_it_again(client: Client, db_dsn: str) -> None:
    job = await client.enqueue(IDLE, {}, queue=UNSERVED, lock_key="k", max_attempts=1)
    pool = await create_pool(db_dsn, 2, "test")
    try:
        protocol = WorkerProtocol(pool)
        (claim,) = await protocol.claim(UNSERVED, 1, "w-1")
        written = await finish_claimed(
            protocol, claim, Outcome(Ended.HANDED_BACK, "worker gone"), "w-1"
        )
    finally:
        await pool.close()
    assert written is not None
    assert written.status == JobStatus.LOST
    state = await client.retry(job.job_id)
    assert (state.status, state.attempt) == (JobStatus.QUEUED, 0)
    assert kinds(await client.events(job.job_id))[-2:] == ["lost", "retried"]


# --- re-run on update --------------------------------------------------------------------------


async def test_rerun_queues_a_succeeded_job_again_with_the_new_args(
    client: Client, runs: Runs
) -> None:
    first = await client.enqueue("t.work", {"value": 1}, lock_key="k", idempotency_key="day")
    assert (await client.wait(first.job_id, timeout=30)).result == {"echo": 1}
    again = await client.enqueue(
        "t.work", {"value": 2}, lock_key="k", idempotency_key="day", rerun=True
    )
    assert (again.job_id, again.created, again.rerun) == (first.job_id, False, True)
    assert again.status == JobStatus.QUEUED
    state = await client.wait(first.job_id, timeout=30)
    assert (state.status, state.attempt, state.result) == (JobStatus.SUCCEEDED, 1, {"echo": 2})
    # a fresh start: the re-run did not resume from the first run's checkpoint
    assert state.checkpoint == {"resume_from": None, "page": 2}
    assert runs.args_of(first.job_id) == [{"value": 1}, {"value": 2}]
    events = await client.events(first.job_id)
    assert kinds(events) == ["queued", "picked", "done", "rerun", "picked", "done"]
    assert payload_of(events, "rerun")["was"] == "succeeded"


async def test_rerun_queues_a_failed_job_again_with_a_fresh_budget(
    client: Client, runs: Runs
) -> None:
    first = await client.enqueue(
        "t.work", {"fail": True}, lock_key="k", idempotency_key="day", max_attempts=1
    )
    assert (await client.wait(first.job_id, timeout=30)).status == JobStatus.FAILED
    await client.enqueue(
        "t.work", {"value": 2}, lock_key="k", idempotency_key="day", max_attempts=1, rerun=True
    )
    state = await client.wait(first.job_id, timeout=30)
    assert (state.status, state.attempt, state.result) == (JobStatus.SUCCEEDED, 1, {"echo": 2})
    assert runs.args_of(first.job_id) == [{"fail": True}, {"value": 2}]
    assert kinds(await client.events(first.job_id)) == [
        "queued",
        "picked",
        "failed",
        "rerun",
        "picked",
        "done",
    ]


@pytest.mark.parametrize("first_run", ["succeeds", "fails", "fails with attempts left"])
async def test_rerun_of_a_running_job_runs_it_exactly_once_more_after_it_ends(
    client: Client, runs: Runs, first_run: str
) -> None:
    args: dict[str, Any] = {"gate": "g", "value": 1, "fail": first_run != "succeeds"}
    attempts = 3 if first_run == "fails with attempts left" else 1
    first = await client.enqueue(
        "t.work", args, lock_key="k", idempotency_key="day", max_attempts=attempts
    )
    await until_status(client, first.job_id, JobStatus.RUNNING)
    asked = await client.enqueue(
        "t.work",
        {"value": 2},
        lock_key="k",
        idempotency_key="day",
        max_attempts=attempts,
        rerun=True,
    )
    assert (asked.job_id, asked.status, asked.rerun) == (first.job_id, JobStatus.RUNNING, True)
    running = await client.get(first.job_id)
    assert running is not None
    assert running.rerun_requested
    runs.open("g")
    state = await client.wait(first.job_id, timeout=30)
    assert (state.status, state.result, state.rerun_requested) == (
        JobStatus.SUCCEEDED,
        {"echo": 2},
        False,
    )
    assert state.attempt == 1
    assert runs.args_of(first.job_id) == [args, {"value": 2}]
    ended = "done" if first_run == "succeeds" else "failed" if attempts == 1 else "requeue"
    events = await client.events(first.job_id)
    assert kinds(events) == ["queued", "picked", "rerun_requested", "rerun", "picked", "done"]
    assert payload_of(events, "rerun")["ended"] == ended


async def test_rerun_of_a_queued_job_gives_it_the_new_args(
    client: Client, conn: asyncpg.Connection
) -> None:
    first = await client.enqueue(
        IDLE, {"value": 1}, queue=UNSERVED, lock_key="k", idempotency_key="day"
    )
    again = await client.enqueue(
        IDLE, {"value": 2}, queue=UNSERVED, lock_key="k", idempotency_key="day", rerun=True
    )
    assert (again.job_id, again.status, again.created) == (first.job_id, JobStatus.QUEUED, False)
    args = await conn.fetchval("SELECT args::text FROM dl_jobs WHERE job_id = $1", first.job_id)
    assert args == '{"value": 2}'
    state = await client.get(first.job_id)
    assert state is not None
    assert (state.status, state.attempt, state.rerun_requested) == (JobStatus.QUEUED, 0, False)
    assert kinds(await client.events(first.job_id)) == ["queued", "updated"]


@pytest.mark.parametrize(
    ("task", "change", "fields"),
    [
        ("t.anywhere", {"queue": UNSERVED}, ("queue",)),
        ("t.work", {"task": "t.cancellable"}, ("task",)),
        ("t.work", {"lock_key": "other"}, ("lock_key",)),
    ],
)
async def test_rerun_still_refuses_a_job_of_other_fields(
    client: Client, task: str, change: dict[str, Any], fields: tuple[str, ...]
) -> None:
    first = await client.enqueue(
        task, {"value": 1}, queue="default", lock_key="k", idempotency_key="day"
    )
    done = await client.wait(first.job_id, timeout=30)
    call: dict[str, Any] = {"task": task, "queue": "default", "lock_key": "k"} | change
    with pytest.raises(IdempotencyConflict) as info:
        await client.enqueue(
            call.pop("task"), {"value": 2}, idempotency_key="day", rerun=True, **call
        )
    assert info.value.fields == fields
    assert await client.get(first.job_id) == done
    assert kinds(await client.events(first.job_id)) == ["queued", "picked", "done"]


async def test_without_rerun_a_finished_job_is_returned_as_it_is(
    client: Client, runs: Runs
) -> None:
    first = await client.enqueue("t.work", {"value": 1}, lock_key="k", idempotency_key="day")
    done = await client.wait(first.job_id, timeout=30)
    again = await client.enqueue("t.work", {"value": 1}, lock_key="k", idempotency_key="day")
    assert (again.job_id, again.status, again.created, again.rerun) == (
        first.job_id,
        JobStatus.SUCCEEDED,
        False,
        False,
    )
    with pytest.raises(IdempotencyConflict) as info:
        await client.enqueue("t.work", {"value": 2}, lock_key="k", idempotency_key="day")
    assert info.value.fields == ("args",)
    assert await client.get(first.job_id) == done
    assert len(runs.runs) == 1
