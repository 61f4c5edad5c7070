"""Durable processes against real PostgreSQL, run by a service's workers: each guarantee of
docs/processes.md, seen from the client and from the tables."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from typing import Any

import asyncpg
import pytest

from dataloader import (
    Client,
    InvalidJob,
    JobStatus,
    Process,
    ProcessConflict,
    ProcessNotFound,
    ProcessResult,
    ProcessStatus,
    ProcessTask,
    ProcessTaskFailed,
    ProcessTimeout,
    SetTimer,
    TaskKind,
    TaskRegistry,
    UnsetTimer,
)
from dataloader.core.processes import (
    NAMESPACE_MAX_CHARS,
    PROCESS_ID_MAX_CHARS,
    ZOMBIE_DETAIL,
    ProcessFacts,
    TaskArgs,
    after_step,
)
from dataloader.core.retry import Linear
from dataloader.core.transitions import Ended, Outcome, after_attempt
from dataloader.maintenance.pruner import Pruner, Retention
from dataloader.storage.connections import GuardedPool
from dataloader.storage.db import create_pool
from dataloader.storage.maintenance import MaintenanceStore
from dataloader.storage.processes import StepSave
from dataloader.storage.protocol import WorkerProtocol
from dataloader.workers import processes as worker_processes
from tests.orders import registry as orders_registry

from .conftest import Service, StartService, wait_until

#: Long enough for a loaded machine, short enough for a test: a timer "in a while".
SOON = 0.3
#: A timer that must never fire within a test.
LATER = 3600.0


def processes() -> TaskRegistry:
    """The orders, and a namespace whose processor the tests steer by the call's args."""
    local = orders_registry.copy()

    @local.process("steered", queue="steered", step_timeout=1, attempts=2, retry=0)
    async def steered(task: ProcessTask, process: Process) -> ProcessResult:
        args: dict[str, Any] = task.args if isinstance(task.args, dict) else {}
        if "sleep" in args:
            await asyncio.sleep(args["sleep"])
        if args.get("fail_until_attempt", 0) > task.attempt:
            raise RuntimeError(f"attempt {task.attempt} fails")
        action: Any = None
        if "timer" in args:
            action = SetTimer(in_sec=args["timer"])
        elif args.get("unset"):
            action = UnsetTimer()
        return ProcessResult(
            events=[{"kind": task.kind.value, "args": task.args}],
            aux_state={"calls": (process.aux_state or {}).get("calls", 0) + 1},
            response={"kind": task.kind.value, "seen": process.last_event_id},
            action=action,
        )

    return local


@pytest.fixture
async def service(start_service: StartService) -> Service:
    return await start_service(
        tasks=processes(),
        workers=[{"queue": "orders", "concurrency": 4}, {"queue": "steered", "concurrency": 8}],
    )


@pytest.fixture
def dl(service: Service) -> Client:
    return service.dl


async def events_of(conn: asyncpg.Connection, namespace: str, process_id: str) -> list[int]:
    rows = await conn.fetch(
        "SELECT e.event_id FROM dl_process_events e JOIN dl_processes p USING (process_ref)"
        " WHERE p.namespace = $1 AND p.process_id = $2 ORDER BY e.event_id",
        namespace,
        process_id,
    )
    return [r["event_id"] for r in rows]


async def test_start_runs_init_and_answers_with_its_response(dl: Client) -> None:
    assert await dl.processes.start("orders", "o-1", {"total": 10}) == {"state": "awaiting_payment"}
    process = await dl.processes.get("orders", "o-1")
    assert process is not None
    assert process.status is ProcessStatus.RUNNING
    assert process.aux_state == {"state": "awaiting_payment", "total": 10, "reminders": 0}
    assert process.timer is not None
    assert process.timer.kind is TaskKind.TIMEOUT
    events = await dl.processes.events("orders", "o-1")
    assert [(e.event_id, e.payload) for e in events] == [(1, {"created": {"total": 10}})]


async def test_a_start_again_answers_the_same_with_the_same_args_and_409_with_others(
    dl: Client, conn: asyncpg.Connection
) -> None:
    first = await dl.processes.start("orders", "o-1", {"total": 10})
    assert await dl.processes.start("orders", "o-1", {"total": 10}) == first
    with pytest.raises(ProcessConflict) as refused:
        await dl.processes.start("orders", "o-1", {"total": 99})
    assert refused.value.reason == "started_with_other_args"
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM dl_jobs WHERE task = 'process:orders' AND args->>'kind' = 'init'"
        )
        == 1
    )


async def test_calls_to_one_process_run_one_at_a_time_and_each_gets_its_own_response(
    dl: Client, conn: asyncpg.Connection
) -> None:
    await dl.processes.start("steered", "p")
    answers = await asyncio.gather(
        *(dl.processes.call("steered", "p", {"n": n, "sleep": 0.01}) for n in range(20))
    )
    # each call saw the history its predecessors left: one at a time, none lost, none twice
    assert sorted(a["seen"] for a in answers) == list(range(1, 21))
    assert await events_of(conn, "steered", "p") == list(range(1, 22))
    process = await dl.processes.get("steered", "p")
    assert process is not None
    assert process.aux_state == {"calls": 21}


async def test_calls_run_in_the_order_they_arrive(dl: Client) -> None:
    await dl.processes.start("steered", "p")
    blocker = await dl.processes.submit("steered", "p", TaskKind.CALL, {"sleep": 0.5})
    await wait_until(
        lambda: running(dl, blocker), what="the blocking call to run"
    )  # the calls below queue behind it, in order
    ids = [await dl.processes.submit("steered", "p", TaskKind.CALL, {"n": n}) for n in range(5)]
    answers = [await dl.processes.response(task_id, 30) for task_id in ids]
    assert (await dl.processes.response(blocker, 30))["seen"] == 1
    assert [a["seen"] for a in answers] == [2, 3, 4, 5, 6]


async def test_a_timer_fires_after_its_delay_and_its_step_is_saved(dl: Client) -> None:
    await dl.processes.start("steered", "p", {"timer": SOON})
    process = await dl.processes.get("steered", "p")
    assert process is not None
    assert process.timer is not None
    timer = await dl.wait(process.timer.task_id, timeout=30)
    assert timer.status is JobStatus.SUCCEEDED
    events = await dl.processes.events("steered", "p")
    assert [e.payload["kind"] for e in events] == ["init", "timeout"]
    process = await dl.processes.get("steered", "p")
    assert process is not None
    assert process.timer is None  # fired, and its step set no other


async def test_a_replaced_or_unset_timer_never_fires(dl: Client, conn: asyncpg.Connection) -> None:
    await dl.processes.start("steered", "a", {"timer": LATER})
    await dl.processes.start("steered", "b", {"timer": LATER})
    first_a = await dl.processes.get("steered", "a")
    first_b = await dl.processes.get("steered", "b")
    assert first_a is not None
    assert first_b is not None
    assert first_a.timer is not None
    assert first_b.timer is not None
    await dl.processes.call("steered", "a", {"timer": LATER * 2})
    await dl.processes.call("steered", "b", {"unset": True})
    statuses = await conn.fetch(
        "SELECT job_id, status::text FROM dl_jobs WHERE job_id = ANY($1)",
        [first_a.timer.task_id, first_b.timer.task_id],
    )
    assert {r["status"] for r in statuses} == {"canceled"}
    replaced = await dl.processes.get("steered", "a")
    assert replaced is not None
    assert replaced.timer is not None
    assert replaced.timer.task_id != first_a.timer.task_id
    unset = await dl.processes.get("steered", "b")
    assert unset is not None
    assert unset.timer is None


async def test_a_failing_processor_puts_the_process_in_error_until_repaired(
    dl: Client, conn: asyncpg.Connection
) -> None:
    await dl.processes.start("orders", "o-1", {"total": 10})
    with pytest.raises(ProcessTaskFailed, match="RuntimeError: no") as failed:
        await dl.processes.call("orders", "o-1", {"boom": "no"})
    process = await dl.processes.get("orders", "o-1")
    assert process is not None
    assert process.status is ProcessStatus.ERROR
    assert process.corrupted_by == failed.value.task_id
    assert process.detail == "RuntimeError: no"
    assert process.timer is None
    job = await dl.get(failed.value.task_id)
    assert job is not None
    assert job.status is JobStatus.FAILED
    with pytest.raises(ProcessConflict) as refused:
        await dl.processes.call("orders", "o-1", {})
    assert refused.value.reason == "in_error"
    assert await dl.processes.repair("orders", "o-1") == {"repaired": True}
    repaired = await dl.processes.get("orders", "o-1")
    assert repaired is not None
    assert repaired.status is ProcessStatus.RUNNING
    assert repaired.corrupted_by is None
    with pytest.raises(ProcessConflict) as again:
        await dl.processes.repair("orders", "o-1")
    assert again.value.reason == "not_in_error"


async def repaired_events(dl: Client, namespace: str, process_id: str) -> int:
    events = await dl.processes.events(namespace, process_id)
    return sum(1 for e in events if e.payload == {"repaired": True})


async def test_repairs_admitted_together_run_the_processor_once(dl: Client) -> None:
    """Three repairs are all admitted while the process is in error (its queue paused, so
    that none runs before the last is in); the first to run repairs it, the others find it
    repaired when they run and are refused as a later repair is."""
    await dl.processes.start("orders", "o-1", {"total": 10})
    with pytest.raises(ProcessTaskFailed):
        await dl.processes.call("orders", "o-1", {"boom": "no"})
    await dl.pause("orders")
    tasks = [await dl.processes.submit("orders", "o-1", TaskKind.REPAIR) for _ in range(3)]
    await dl.resume("orders")
    answers = await asyncio.gather(
        *(dl.processes.response(task_id, 30) for task_id in tasks), return_exceptions=True
    )
    assert answers[0] == {"repaired": True}
    for refused in answers[1:]:
        assert isinstance(refused, ProcessConflict), refused
        assert refused.reason == "not_in_error"
    assert await repaired_events(dl, "orders", "o-1") == 1
    process = await dl.processes.get("orders", "o-1")
    assert process is not None
    assert process.status is ProcessStatus.RUNNING


async def test_concurrent_repairs_and_removals_each_take_effect_once(dl: Client) -> None:
    """Sent together, with real concurrency: one repair repairs, one removal removes; the
    others get what a later one gets (409 not_in_error, 404)."""
    await dl.processes.start("orders", "o-1", {"total": 10})
    with pytest.raises(ProcessTaskFailed):
        await dl.processes.call("orders", "o-1", {"boom": "no"})
    repairs = await asyncio.gather(
        *(dl.processes.repair("orders", "o-1") for _ in range(5)), return_exceptions=True
    )
    assert sum(1 for a in repairs if a == {"repaired": True}) == 1, repairs
    assert all(
        isinstance(a, ProcessConflict) and a.reason == "not_in_error"
        for a in repairs
        if a != {"repaired": True}
    ), repairs
    assert await repaired_events(dl, "orders", "o-1") == 1
    removals = await asyncio.gather(
        *(dl.processes.remove("orders", "o-1") for _ in range(5)),
        *(dl.processes.call("orders", "o-1", {"x": n}) for n in range(5)),
        return_exceptions=True,
    )
    assert sum(1 for r in removals[:5] if r is None) == 1, removals
    assert all(isinstance(r, ProcessNotFound) for r in removals[:5] if r is not None), removals
    # a call answered before the removal, or not found: never a failure
    assert all(isinstance(r, dict | ProcessNotFound) for r in removals[5:]), [
        repr(r) for r in removals[5:]
    ]


async def test_a_call_queued_behind_a_removal_is_not_found_even_once_the_id_lives_again(
    dl: Client,
) -> None:
    await dl.processes.start("orders", "o-1", {"total": 10})
    await dl.pause("orders")
    removal = await dl.processes.submit("orders", "o-1", TaskKind.REMOVE)
    call = await dl.processes.submit("orders", "o-1", TaskKind.CALL, {"x": 1})
    await dl.resume("orders")
    assert await dl.processes.response(removal, 30) is None
    await dl.processes.start("orders", "o-1", {"total": 1})
    with pytest.raises(ProcessNotFound):
        await dl.processes.response(call, 30)


async def test_a_processor_that_fails_and_then_succeeds_is_called_again_in_the_same_claim(
    dl: Client,
) -> None:
    await dl.processes.start("steered", "p")
    answer = await dl.processes.call("steered", "p", {"fail_until_attempt": 2})
    assert answer["kind"] == "call"
    process = await dl.processes.get("steered", "p")
    assert process is not None
    assert process.status is ProcessStatus.RUNNING


async def test_a_step_that_outruns_its_timeout_is_a_zombie(dl: Client) -> None:
    await dl.processes.start("steered", "p", {"timer": LATER})
    with pytest.raises(ProcessTaskFailed, match=ZOMBIE_DETAIL) as failed:
        await dl.processes.call("steered", "p", {"sleep": 5})
    process = await dl.processes.get("steered", "p")
    assert process is not None
    assert process.status is ProcessStatus.ERROR
    assert process.detail == ZOMBIE_DETAIL
    assert process.corrupted_by == failed.value.task_id
    assert process.timer is None


async def test_a_step_whose_process_cannot_be_read_runs_again_and_is_no_zombie(
    dl: Client, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database goes away as a step reads its process: nothing of the step ran, so the
    task goes back to the queue with its attempt refunded, and runs once it is back."""
    await dl.processes.start("steered", "p")
    real = worker_processes.step_input
    cut: list[uuid.UUID] = []

    async def cut_once(*args: Any) -> Any:
        if not cut:
            cut.append(args[3])
            raise ConnectionResetError("the server restarted")
        return await real(*args)

    monkeypatch.setattr(worker_processes, "step_input", cut_once)
    assert await dl.processes.call("steered", "p", {"x": 1}) == {"kind": "call", "seen": 1}
    process = await dl.processes.get("steered", "p")
    assert process is not None
    assert process.status is ProcessStatus.RUNNING
    [task] = cut
    kinds = [e.kind for e in await dl.events(task) if e.kind != "heartbeat"]
    assert kinds == ["queued", "picked", "requeue", "picked", "done"]
    assert (await dl.get(task)).attempt == 1  # type: ignore[union-attr]  # refunded


async def test_a_call_with_an_idempotency_key_is_one_task(
    dl: Client, conn: asyncpg.Connection
) -> None:
    await dl.processes.start("steered", "p")
    answers = await asyncio.gather(
        *(dl.processes.call("steered", "p", {"x": 1}, idempotency_key="k") for _ in range(3))
    )
    assert answers[0] == answers[1] == answers[2]
    assert await events_of(conn, "steered", "p") == [1, 2]


async def test_a_repeated_keyed_call_answers_as_it_did_whatever_the_process_became(
    dl: Client,
) -> None:
    """A caller who lost the answer of an applied call and calls again with its key gets that
    answer, not a refusal from the process's state since: in error, repaired, removed."""
    await dl.processes.start("orders", "o-1", {"total": 10})
    paid = await dl.processes.call("orders", "o-1", {"x": 1}, idempotency_key="pay-1")
    with pytest.raises(ProcessTaskFailed) as failed:
        await dl.processes.call("orders", "o-1", {"boom": "no"}, idempotency_key="boom-1")
    assert await dl.processes.call("orders", "o-1", {"x": 1}, idempotency_key="pay-1") == paid
    with pytest.raises(ProcessConflict) as other_args:
        await dl.processes.call("orders", "o-1", {"x": 2}, idempotency_key="pay-1")
    assert other_args.value.reason == "idempotency_key_reused"
    await dl.processes.repair("orders", "o-1")
    with pytest.raises(ProcessTaskFailed) as again:  # it failed, whatever came after
        await dl.processes.call("orders", "o-1", {"boom": "no"}, idempotency_key="boom-1")
    assert again.value.task_id == failed.value.task_id
    await dl.processes.remove("orders", "o-1")
    assert await dl.processes.call("orders", "o-1", {"x": 1}, idempotency_key="pay-1") == paid
    with pytest.raises(ProcessNotFound):  # a new call to the removed process
        await dl.processes.call("orders", "o-1", {"x": 1}, idempotency_key="pay-2")
    await dl.processes.start("orders", "o-1", {"total": 1})
    # a new incarnation: the key is free again, for a call of its own
    await dl.processes.call("orders", "o-1", {"x": 1}, idempotency_key="pay-1")
    assert [e.payload for e in await dl.processes.events("orders", "o-1")][1:] == [{"x": 1}]


async def test_a_task_refused_when_it_ran_answers_so_whatever_the_process_became(
    dl: Client,
) -> None:
    """A call queued behind a step that fails is refused `in_error`; asked for again after
    the repair, it still says so (not that its processor failed)."""
    await dl.processes.start("steered", "p")
    blocker = await dl.processes.submit(
        "steered", "p", TaskKind.CALL, {"sleep": 0.3, "fail_until_attempt": 9}
    )
    await wait_until(lambda: running(dl, blocker), what="the failing call to run")
    queued = await dl.processes.submit("steered", "p", TaskKind.CALL, {"x": 1})
    with pytest.raises(ProcessTaskFailed):
        await dl.processes.response(blocker, 30)
    with pytest.raises(ProcessConflict) as refused:
        await dl.processes.response(queued, 30)
    assert refused.value.reason == "in_error"
    await dl.processes.repair("steered", "p")
    with pytest.raises(ProcessConflict) as still:
        await dl.processes.response(queued, 30)
    assert still.value.reason == "in_error"


async def test_remove_frees_the_id_and_cancels_the_timer(
    dl: Client, conn: asyncpg.Connection
) -> None:
    await dl.processes.start("orders", "o-1", {"total": 10})
    before = await dl.processes.get("orders", "o-1")
    assert before is not None
    assert before.timer is not None
    await dl.processes.remove("orders", "o-1")
    assert await dl.processes.get("orders", "o-1") is None
    timer = await dl.get(before.timer.task_id)
    assert timer is not None
    assert timer.status is JobStatus.CANCELED
    with pytest.raises(ProcessNotFound):
        await dl.processes.call("orders", "o-1", {})
    with pytest.raises(ProcessNotFound):
        await dl.processes.events("orders", "o-1")
    assert await dl.processes.start("orders", "o-1", {"total": 1}) == {"state": "awaiting_payment"}
    # the removed incarnation's row and history stay until retention prunes them
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM dl_processes WHERE process_id = 'o-1' AND removed_at IS NOT NULL"
        )
        == 1
    )


async def test_a_response_not_given_in_time_is_a_timeout_and_can_be_read_later(
    dl: Client,
) -> None:
    await dl.processes.start("steered", "p")
    task_id = await dl.processes.submit("steered", "p", TaskKind.CALL, {"sleep": 0.5})
    with pytest.raises(ProcessTimeout) as late:
        await dl.processes.response(task_id, 0.05)
    assert late.value.task_id == task_id
    assert (await dl.processes.response(task_id, 30))["kind"] == "call"


async def test_a_call_to_a_process_that_does_not_exist_is_not_found(dl: Client) -> None:
    with pytest.raises(ProcessNotFound):
        await dl.processes.call("orders", "nope", {})


async def test_processes_are_listed_newest_first_in_pages_and_counted(dl: Client) -> None:
    for n in range(5):
        await dl.processes.start("steered", f"p{n}")
    first = await dl.processes.list(namespace="steered", limit=3)
    assert [p.process_id for p in first.processes] == ["p4", "p3", "p2"]
    assert first.next_cursor is not None
    rest = await dl.processes.list(namespace="steered", limit=3, cursor=first.next_cursor)
    assert [p.process_id for p in rest.processes] == ["p1", "p0"]
    assert rest.next_cursor is None
    assert (await dl.processes.list(status="error")).processes == []
    assert (await dl.processes.counts())[("steered", "running")] == 5


async def running(dl: Client, job_id: uuid.UUID) -> bool:
    job = await dl.get(job_id)
    return job is not None and job.status is JobStatus.RUNNING


async def test_a_due_timer_waits_while_calls_to_its_process_wait_or_run(dl: Client) -> None:
    await dl.processes.start("steered", "p", {"timer": SOON})
    # the first call outlasts the timer's due time; the second arrives while it runs
    first = await dl.processes.submit("steered", "p", TaskKind.CALL, {"sleep": SOON * 3})
    await wait_until(lambda: running(dl, first), what="the first call to run")
    second = await dl.processes.submit("steered", "p", TaskKind.CALL, {"n": 2})
    await dl.processes.response(second, 30)
    process = await dl.processes.get("steered", "p")
    assert process is not None
    if process.timer is not None:  # it had not fired when the second call ended
        await dl.wait(process.timer.task_id, timeout=30)
    kinds = [e.payload["kind"] for e in await dl.processes.events("steered", "p")]
    assert kinds == ["init", "call", "call", "timeout"]


async def test_a_step_whose_task_lost_its_claim_writes_nothing_to_its_process(
    db_dsn: str, conn: asyncpg.Connection, start_service: StartService
) -> None:
    api = await start_service(run_workers=False, tasks=processes())
    await api.dl.processes.submit("steered", "p", TaskKind.INIT)
    pool = await create_pool(db_dsn, 2, "lost-claim")
    try:
        protocol = WorkerProtocol(pool)
        (claimed,) = await protocol.claim("steered", 1, "test-worker")
        facts = ProcessFacts(1, ProcessStatus.INIT, queue="steered")
        save = StepSave(
            namespace="steered",
            process_ref=int(claimed.args["process_ref"]),
            lock_key=claimed.lock_key,
            task_id=claimed.job_id,
            write=after_step(
                facts,
                TaskArgs.of_job(claimed.args),
                claimed.job_id,
                ProcessResult(events=["late"], aux_state={"late": True}),
                1000,
            ),
        )
        stale = replace(claimed, claim_token=uuid.uuid4())  # another claim's since
        outcome = Outcome(Ended.SUCCEEDED, result="null", effects=save)
        decided = after_attempt(outcome, stale.facts(), Linear())
        applied = await protocol.finish(
            [(stale, stale.facts(), decided)], "test-worker", effects={stale.job_id: save}
        )
        assert stale.job_id not in applied or applied[stale.job_id].state != "written"
        row = await conn.fetchrow(
            "SELECT status, aux_state, last_event_id FROM dl_processes WHERE process_id = 'p'"
        )
        assert (row["status"], row["aux_state"], row["last_event_id"]) == ("init", None, 0)
        # the claim that holds the task writes it
        current = await protocol.finish(
            [(claimed, claimed.facts(), decided)], "test-worker", effects={claimed.job_id: save}
        )
        assert current[claimed.job_id].state == "written"
        assert (
            await conn.fetchval("SELECT last_event_id FROM dl_processes WHERE process_id = 'p'")
            == 1
        )
    finally:
        await pool.close()


async def test_two_replicas_run_every_call_of_50_processes_in_order_once(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    workers = [{"queue": "steered", "concurrency": 8}]
    first = await start_service(tasks=processes(), workers=workers)
    second = await start_service(tasks=processes(), workers=workers)
    names = [f"p{n}" for n in range(50)]
    await asyncio.gather(*(first.dl.processes.start("steered", name) for name in names))

    async def calls_of(name: str) -> list[Any]:
        clients = (first.dl, second.dl)
        return list(
            await asyncio.gather(
                *(
                    clients[k % 2].processes.call("steered", name, {"k": k}, timeout=120)
                    for k in range(20)
                )
            )
        )

    answers = await asyncio.gather(*(calls_of(name) for name in names))
    for name, got in zip(names, answers, strict=True):
        # each call saw its own moment of the history: none twice, none lost
        assert sorted(a["seen"] for a in got) == list(range(1, 21)), name
    rows = await conn.fetch(
        "SELECT p.process_id, array_agg(e.event_id ORDER BY e.event_id) AS ids,"
        " count(DISTINCT e.payload->'args'->>'k') AS ks"
        " FROM dl_processes p JOIN dl_process_events e USING (process_ref)"
        " WHERE p.namespace = 'steered' GROUP BY p.process_id"
    )
    assert len(rows) == 50
    for row in rows:
        assert row["ids"] == list(range(1, 22)), row["process_id"]
        assert row["ks"] == 20, row["process_id"]
    workers_used = await conn.fetchval(
        "SELECT count(DISTINCT worker_id) FROM dl_jobs WHERE task = 'process:steered'"
    )
    assert workers_used == 2


async def test_status_warns_of_processes_in_error_and_metrics_count_them(
    service: Service, dl: Client
) -> None:
    await dl.processes.start("orders", "o-1", {"total": 1})
    with pytest.raises(ProcessTaskFailed):
        await dl.processes.call("orders", "o-1", {"boom": "x"})
    warnings = (await service.client.get("/status")).json()["warnings"]
    assert any("namespace 'orders' are in error" in w for w in warnings), warnings
    scraped = (await service.client.get("/metrics")).text
    assert 'dataloader_processes{namespace="orders",status="error"} 1.0' in scraped
    assert 'progressor_task_processing_duration_ms_count{namespace="orders"}' in scraped
    assert 'progressor_calls_scanning_duration_ms_count{namespace="orders"}' in scraped


async def test_the_pruner_deletes_removed_processes_with_their_history_after_retention(
    dl: Client, conn: asyncpg.Connection, service: Service
) -> None:
    await dl.processes.start("steered", "gone")
    await dl.processes.call("steered", "gone", {"k": 1})
    await dl.processes.remove("steered", "gone")
    await dl.processes.start("steered", "kept")
    await conn.execute(
        "UPDATE dl_processes SET removed_at = now() - interval '8 days' WHERE process_id = 'gone'"
    )
    store = MaintenanceStore(GuardedPool(service.context.pool))
    retention = replace(Retention.of(service.settings), removed_processes_sec=7 * 86400)
    deleted = await Pruner(store, retention, batch_size=1).prune()
    assert (deleted["process_events"], deleted["processes"]) == (2, 1)
    assert await conn.fetchval("SELECT count(*) FROM dl_processes") == 1
    assert await dl.processes.get("steered", "kept") is not None


async def test_a_process_at_its_limits_is_started_run_listed_and_read(
    start_service: StartService,
) -> None:
    """A namespace and a process_id at their limits, in 4-byte characters that do not
    compress: the unique index of live processes and the task's lock_key still hold them."""
    namespace = "🙂" * NAMESPACE_MAX_CHARS
    process_id = "🙃" * PROCESS_ID_MAX_CHARS
    local = TaskRegistry()

    @local.process(namespace)
    async def echo(task: ProcessTask, process: Process) -> ProcessResult:
        return ProcessResult(events=[task.args], response=process.last_event_id)

    service = await start_service(tasks=local, workers=[{"queue": namespace, "concurrency": 1}])
    processes = service.dl.processes
    assert await processes.start(namespace, process_id, {"x": "🙂" * 100}) == 0
    assert await processes.call(namespace, process_id, {"y": 1}) == 1
    page = await processes.list(namespace=namespace)
    assert [p.process_id for p in page.processes] == [process_id]
    assert len(await processes.events(namespace, process_id)) == 2
    with pytest.raises(InvalidJob, match="process_id"):
        await processes.start(namespace, process_id + "x")
