"""Plans that stale statistics cannot spoil.

The trap: statistics taken while no job ran make the spec's `ix_dl_jobs_status_queue` look as
cheap for `status = 'running'` as the right index, and reading it means reading every running
job. Here statistics are taken with nothing running, then thousands of jobs start (autovacuum
off, so nothing re-analyzes): each worker statement must still find its rows by the index
meant for it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dataloader.base import JobStatus
from dataloader.core.processes import ProcessStatus, StepWrite
from dataloader.core.retry import Linear
from dataloader.core.transitions import Ended, JobFacts, Outcome, after_attempt
from dataloader.storage import db, queries
from dataloader.storage.processes import FINISH_TASKS, SAVE_PROCESSES, save_values
from dataloader.storage.statement import Statement
from dataloader.storage.transitions import Fence, parameters_of

from .helpers import parking_insert

RUNNING = 3000


def _set_states_args() -> tuple[Any, ...]:
    """SET_JOB_STATES's arguments for one job's success."""
    facts = JobFacts(JobStatus.RUNNING, attempt=1, max_attempts=5)
    fence = Fence(uuid.uuid4(), facts, uuid.uuid4())
    transition = after_attempt(Outcome(Ended.SUCCEEDED), facts, Linear())
    arrays = parameters_of([(fence, transition)])
    return queries.SET_JOB_STATES.bind(**arrays, actor_role="worker", actor="w")


def _finish_args() -> tuple[Any, ...]:
    """FINISH_JOBS's arguments for one job's success, handing off the next job of its key."""
    facts = JobFacts(JobStatus.RUNNING, attempt=1, max_attempts=5)
    fence = Fence(uuid.uuid4(), facts, uuid.uuid4())
    transition = after_attempt(Outcome(Ended.SUCCEEDED), facts, Linear())
    arrays = parameters_of([(fence, transition)])
    return queries.FINISH_JOBS.bind(
        **arrays,
        actor_role="worker",
        actor="w",
        wakes_own_queue=True,
        hand_off=[fence.job_id],
        claim_seed=uuid.uuid4(),
    )


def _freed() -> dict[str, Any]:
    """The arguments naming one job that freed its lock_key, for the statements after it."""
    job_id = uuid.uuid4()
    return {"job_ids": [job_id], "lock_keys": ["key-1"], "queues": ["q"], "written_ids": [job_id]}


#: A claim of 10 jobs of queue `q`, for 10 slots, one job each.
CLAIM_ARGS: dict[str, Any] = {
    "queue": "q",
    "limit": 10,
    "walk": 10,
    "slots": 10,
    "batched_tasks": [],
    "batch_sizes": [],
    "worker_id": "w",
    "claim_seed": uuid.uuid4(),
}


def _ids() -> dict[str, Any]:
    return {"job_id": uuid.uuid4(), "claim_token": uuid.uuid4()}


#: Statements that find their rows by primary key, with arguments of the right types.
BY_PRIMARY_KEY: dict[str, tuple[Any, ...]] = {
    "lock_key_holder": queries.LOCK_KEY_HOLDER.bind(**_ids()),
    "heartbeat": queries.HEARTBEAT_JOBS.bind(
        job_ids=[uuid.uuid4()], claim_tokens=[uuid.uuid4()], journal=[True], worker_id="w"
    ),
    "set_progress": queries.SET_PROGRESS.bind(**_ids(), progress="{}"),
    "park_jobs": queries.PARK_JOBS.bind(job_ids=[uuid.uuid4()], siblings=10),
    "set_checkpoint": queries.SET_CHECKPOINT.bind(**_ids(), checkpoint="{}"),
    "set_job_states": _set_states_args(),
    "finish_jobs": _finish_args(),
    "wake_lock_waiters": queries.WAKE_LOCK_WAITERS.bind(
        **_freed(), left_running=[True], handing=[False], wakes_own_queue=True
    ),
    "hand_off_next": queries.HAND_OFF_NEXT.bind(**_freed(), claim_seed=uuid.uuid4(), actor="w"),
    "job_facts": queries.JOB_FACTS.bind(job_id=uuid.uuid4()),
    "request_on_job": queries.REQUEST_ON_JOB.bind(
        job_id=uuid.uuid4(),
        expect_status="running",
        expect_attempt=1,
        expect_cancel=False,
        expect_rerun=False,
        cancel=True,
        rerun=False,
        args=None,
        journal="cancel_requested",
        actor="client",
    ),
}


#: The statements that look for the next job of a freed lock_key (the first tells whether one
#: waits, the others wake it, put it back, or hand it off).
FREED_KEY: dict[str, tuple[Any, ...]] = {
    name: BY_PRIMARY_KEY[name]
    for name in ("set_job_states", "wake_lock_waiters", "hand_off_next", "finish_jobs")
}


@pytest.fixture
async def stale_conn(db_dsn: str) -> AsyncIterator[db.Connection]:
    """Statistics say nothing runs; in fact `RUNNING` jobs run and 100 are queued, of 1,000
    partition_keys."""
    conn = await db.connect(db_dsn, "test-plans")
    await conn.execute("ALTER TABLE dl_jobs SET (autovacuum_enabled = false)")
    await conn.execute(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, partition_key) SELECT"
        " gen_random_uuid(), 'q', 't', 'key-' || i, 'p' || i % 1000"
        " FROM generate_series(1, $1::int) i",
        RUNNING + 100,
    )
    await conn.execute("ANALYZE dl_jobs")
    await conn.execute(
        "UPDATE dl_jobs SET status = 'running', attempt = 1 "
        "WHERE job_id IN (SELECT job_id FROM dl_jobs LIMIT $1)",
        RUNNING,
    )
    yield conn
    await conn.close()


async def plan_of(conn: db.Connection, statement: str, *args: Any) -> str:
    """The plan PostgreSQL chooses for `statement` (not executed), as JSON text."""
    return str(await conn.fetchval(f"EXPLAIN (FORMAT JSON) {statement}", *args))


@pytest.mark.parametrize("name", sorted(BY_PRIMARY_KEY))
async def test_writes_by_job_id_use_the_primary_key(stale_conn: db.Connection, name: str) -> None:
    plan = await plan_of(stale_conn, *BY_PRIMARY_KEY[name])
    assert "dl_jobs_pkey" in plan
    assert "ix_dl_jobs_status_queue" not in plan


#: One job of key `key-1` enqueued, parked if that key runs (INSERT_JOB), and a batch of two.
INSERTS: dict[str, tuple[Any, ...]] = {
    "insert_job": parking_insert(uuid.uuid4(), "q", "t", "key-1"),
    "insert_jobs": queries.INSERT_JOBS.bind(
        job_ids=[uuid.uuid4(), uuid.uuid4()],
        queue=["q", "q"],
        task=["t", "t"],
        args=["{}", "{}"],
        idempotency_key=[None, None],
        lock_key=["key-1", "key-2"],
        partition_key=["", ""],
        priority=[100, 100],
        available_at=[None, None],
        delay_sec=[],
        max_attempts=[5, 5],
        lease_ttl_sec=[60, 60],
        producer=[None, None],
        consumer_group=[None, None],
        actor="test",
        park_behind_running=True,
    ),
}


@pytest.mark.parametrize("name", sorted(INSERTS))
async def test_an_enqueue_looks_up_its_running_keys_through_their_own_index(
    stale_conn: db.Connection, name: str
) -> None:
    """Whether a new job's lock_key runs (it may then go in parked) is a probe of the index of
    running keys, never a read of every running job of the table."""
    plan = await plan_of(stale_conn, *INSERTS[name])
    assert "ix_dl_jobs_running_lock_hash" in plan
    assert "ix_dl_jobs_status_queue" not in plan
    assert "Seq Scan on dl_jobs" not in plan


async def test_claim_probes_running_lock_keys_through_their_own_index(
    stale_conn: db.Connection,
) -> None:
    claim = queries.CLAIM_JOBS.bind(**CLAIM_ARGS)
    plan = await plan_of(stale_conn, *claim)
    assert "ix_dl_jobs_running_lock_hash" in plan
    assert "ix_dl_jobs_status_queue" not in plan


async def test_a_limited_claim_counts_a_partitions_running_jobs_by_the_keys_hash(
    stale_conn: db.Connection,
) -> None:
    """A claim of a queue with a per-partition limit counts the running jobs of each candidate's
    partition_key, and of each job it walks, through the index of their hashes (the text itself
    is in no index): never by reading every running job of the queue."""
    await stale_conn.execute(
        "INSERT INTO dl_queues (queue, changed_by, max_running_per_partition)"
        " VALUES ('q', 'test', 5)"
    )
    statement, *args = queries.CLAIM_LIMITED.bind(**CLAIM_ARGS)
    plan = await stale_conn.fetchval(f"EXPLAIN (FORMAT JSON) {statement}", *args)
    probes = [
        node for node in _nodes(plan[0]["Plan"]) if "partition_key" in node.get("Index Cond", "")
    ]
    # the running jobs of a partition (in the walk and among the candidates), by the hash
    assert len(probes) == 2, plan
    assert {node["Index Name"] for node in probes} == {"ix_dl_jobs_running_partition_hash"}


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """A plan's node and every node under it."""
    return [node, *(n for child in node.get("Plans", []) for n in _nodes(child))]


async def test_the_next_job_of_a_freed_key_is_found_by_the_keys_index(db_dsn: str) -> None:
    """Statistics taken while the queue held only delayed jobs say that hardly any job is due:
    the search for the next job of a key freed by an outcome must still read that key's index,
    not every due job of the queue (the spec's claim index leads with available_at)."""
    conn = await db.connect(db_dsn, "test-plans")
    try:
        await conn.execute("ALTER TABLE dl_jobs SET (autovacuum_enabled = false)")
        await conn.execute(
            "INSERT INTO dl_jobs (job_id, queue, task, lock_key, available_at, parked) "
            "SELECT gen_random_uuid(), 'q', 't', 'later-' || i, now() + interval '1 day',"
            " 'delayed' FROM generate_series(1, 5000) i"
        )
        await conn.execute("ANALYZE dl_jobs")
        await conn.execute(
            "INSERT INTO dl_jobs (job_id, queue, task, lock_key) "
            "SELECT gen_random_uuid(), 'q', 't', 'key-' || i FROM generate_series(1, 5000) i"
        )
        plans = {name: await plan_of(conn, *args) for name, args in FREED_KEY.items()}
    finally:
        await conn.close()
    for plan in plans.values():
        assert "'Index Name': 'ix_dl_jobs_queued_lock_hash'" in plan
        assert "'Index Name': 'ix_dl_jobs_claim'" not in plan


async def test_the_job_put_back_is_written_by_its_primary_key(db_dsn: str) -> None:
    """Statistics taken while the table was empty (a new database, a chain of jobs of one key
    enqueued at once): putting back the next job of a freed key must find it by its primary
    key, not walk the queue's queued jobs through the spec's claim index."""
    conn = await db.connect(db_dsn, "test-plans")
    try:
        await conn.execute("ALTER TABLE dl_jobs SET (autovacuum_enabled = false)")
        await conn.execute("ANALYZE dl_jobs")
        await conn.execute(
            "INSERT INTO dl_jobs (job_id, queue, task, lock_key, parked) "
            "SELECT gen_random_uuid(), 'q', 't', 'chain', 'lock_key'"
            " FROM generate_series(1, 1000) i"
        )
        plans = {name: await plan_of(conn, *args) for name, args in FREED_KEY.items()}
    finally:
        await conn.close()
    for plan in plans.values():
        assert "'Index Name': 'ix_dl_jobs_claim'" not in plan


#: A value of each filter of a job list, as the client passes it.
LIST_VALUES: dict[str, Any] = {
    "queue": "q3",
    "status": "succeeded",
    "task": "t",
    "lock_key": "key-7",
    "partition_key": "p",
    "created_from": datetime(2026, 1, 1, tzinfo=UTC),
    "created_until": datetime(2036, 1, 1, tzinfo=UTC),
    "finished_from": datetime(2026, 1, 1, tzinfo=UTC),
    "finished_until": datetime(2036, 1, 1, tzinfo=UTC),
    "args": '{"n": 7}',
}


@pytest.mark.parametrize(
    "filters",
    [
        (),
        *((name,) for name in LIST_VALUES),
        ("queue", "status"),
        ("after",),
    ],
    ids=lambda filters: "+".join(filters) or "none",
)
async def test_a_page_of_jobs_is_read_in_order_from_an_index(
    db_dsn: str, filters: tuple[str, ...]
) -> None:
    """Beside 20,000 finished jobs, whatever the filters: no pass over the whole table, no sort
    of every match (a page of 100 took 100-700 ms beside 1,000,000 jobs that way)."""
    conn = await db.connect(db_dsn, "test-plans")
    try:
        await conn.execute(
            "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, finished_at)"
            " SELECT gen_random_uuid(), 'q' || (i % 10), 't', 'key-' || i, 'succeeded', now()"
            " FROM generate_series(1, 20000) i"
        )
        await conn.execute("ANALYZE dl_jobs")
        # as the repository asks it: a status given is one part of the jobs, running or not
        statement = queries.list_jobs(
            frozenset(filters), running=False if "status" in filters else None
        )
        values = {name: LIST_VALUES[name] for name in filters if name != "after"}
        if "after" in filters:
            values |= {"after_created": datetime(2036, 1, 1, tzinfo=UTC), "after_id": uuid.uuid4()}
        plan = await plan_of(conn, *statement.bind(**values, limit=101))
        assert "Seq Scan" not in plan, plan
    finally:
        await conn.close()


async def test_a_queue_with_few_jobs_of_a_status_is_listed_from_the_status_index(
    db_dsn: str,
) -> None:
    """A queue and status matching few jobs: read from the (status, queue) index, not by
    walking the newest jobs of every queue for matches that may never come."""
    conn = await db.connect(db_dsn, "test-plans")
    try:
        await conn.execute(
            "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, finished_at)"
            " SELECT gen_random_uuid(), 'q' || (i % 10),  't', 'key-' || i,"
            " CASE WHEN i % 50 = 0 THEN 'failed' ELSE 'succeeded' END::dl_status, now()"
            " FROM generate_series(1, 20000) i"
        )
        await conn.execute("ANALYZE dl_jobs")
        found = await conn.fetchval(
            *queries.STATUS_QUEUE_PROBE.bind(status="failed", queue="q3", probe=5000)
        )
        assert found == 0  # every failed job is in q0
        statement = queries.list_jobs(frozenset({"queue", "status"}), narrow=True, running=False)
        plan = await plan_of(conn, *statement.bind(queue="q3", status="failed", limit=101))
        assert "ix_dl_jobs_status_queue" in plan, plan
        assert "ix_dl_jobs_created" not in plan, plan
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("column", "index"),
    [("task", "ix_dl_jobs_task_created"), ("partition_key", "ix_dl_jobs_partition_created")],
)
async def test_a_rare_task_or_partition_key_is_listed_from_its_own_index(
    db_dsn: str, column: str, index: str
) -> None:
    """A task or partition_key that few jobs (or none) have: read newest first from its own
    index, not by walking the newest jobs of every task for matches that may never come
    (seconds beside 10,000,000 finished jobs)."""
    conn = await db.connect(db_dsn, "test-plans")
    try:
        await conn.execute(
            "INSERT INTO dl_jobs (job_id, queue, task, lock_key, partition_key, status,"
            " finished_at)"
            " SELECT gen_random_uuid(), 'q', 't', 'key-' || i, '', 'succeeded', now()"
            " FROM generate_series(1, 20000) i"
        )
        await conn.execute("ANALYZE dl_jobs")
        statement = queries.list_jobs(frozenset({column}))
        sql, *args = statement.bind(**{column: "rare"}, limit=101)
        plan = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
        plan = json.loads(plan) if isinstance(plan, str) else plan
        # the running jobs are few, and sorted; the others are read in order
        assert index in str(plan), plan
        assert index not in _sorted_scans(plan[0]["Plan"]), plan
    finally:
        await conn.close()


@pytest.mark.parametrize("status", ["failed", "lost", "canceled"])
async def test_a_tasks_failures_are_read_from_their_own_index_in_any_plan(
    db_dsn: str, status: str
) -> None:
    """A task with many jobs and few (or none) of a status it ended badly in: read newest
    first from the index of tasks' failures, not by walking the task's jobs (1.2 s for a task
    of 500,000 beside 10,000,000), in a generic plan too (a prepared statement's)."""
    conn = await db.connect(db_dsn, "test-plans")
    try:
        await conn.execute(
            "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, finished_at)"
            " SELECT gen_random_uuid(), 'q', CASE WHEN i % 2 = 0 THEN 't' ELSE 'u' END,"
            " 'key-' || i, CASE WHEN i % 2 = 0 THEN 'succeeded' ELSE $1 END::dl_status, now()"
            " FROM generate_series(1, 20000) i",
            status,
        )  # t: 10,000 jobs, all succeeded; u: 10,000 of the status
        await conn.execute("ANALYZE dl_jobs")
        statement = queries.list_jobs(frozenset({"task", "status", "ended_badly"}), running=False)
        sql, *args = statement.bind(task="t", status=status, limit=101)
        custom = await plan_of(conn, sql, *args)
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE listed AS {sql}")
        values = ", ".join(f"'{value}'" for value in args)  # the test's own constants
        generic = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE listed({values})")
        for plan in (custom, str(generic)):
            assert "ix_dl_jobs_task_ended_badly" in plan, plan
            assert "Sort" not in plan, plan
    finally:
        await conn.close()


async def test_a_search_by_args_reads_the_args_index(db_dsn: str) -> None:
    """Jobs whose args contain an object few jobs' args do: found from the args index, not by
    walking every job newest first for matches that may never come."""
    conn = await db.connect(db_dsn, "test-plans")
    try:
        await conn.execute(
            "INSERT INTO dl_jobs (job_id, queue, task, lock_key, args, status, finished_at)"
            " SELECT gen_random_uuid(), 'q', 't', 'key-' || i,"
            " jsonb_build_object('n', i, 'day', '2026-01-' || (i % 28 + 10)), 'succeeded', now()"
            " FROM generate_series(1, 20000) i"
        )
        await conn.execute("ANALYZE dl_jobs")
        statement = queries.list_jobs(frozenset({"args"}))
        plan = await plan_of(conn, *statement.bind(args='{"n": 4242}', limit=101))
        assert "ix_dl_jobs_args" in plan, plan
    finally:
        await conn.close()


async def test_a_jobs_stages_are_read_from_the_stage_index(db_dsn: str) -> None:
    """The stages a job's success enqueued: from the index of stage jobs by parent, not by a
    walk of every job (a dashboard's job page asks it)."""
    conn = await db.connect(db_dsn, "test-plans")
    try:
        await conn.execute(
            "INSERT INTO dl_jobs (job_id, queue, task, lock_key, idempotency_key, status,"
            " finished_at)"
            " SELECT gen_random_uuid(), 'q', 't', 'key-' || i,"
            " CASE WHEN i % 2 = 0 THEN 'stage:' || gen_random_uuid() || ':' || gen_random_uuid()"
            " || ':0' END, 'succeeded', now()"
            " FROM generate_series(1, 20000) i"
        )
        await conn.execute("ANALYZE dl_jobs")
        plan = await plan_of(conn, *queries.STAGE_JOB_IDS.bind(parent=uuid.uuid4(), limit=100))
        assert "ix_dl_jobs_stage_parent" in plan, plan
    finally:
        await conn.close()


async def test_a_past_finished_range_starts_its_walk_at_the_range(db_dsn: str) -> None:
    """Jobs that finished in a day of the past: the newest first are read from the range on, not
    from the newest job of all (300 ms beside 1,000,000 jobs, seconds beside 10,000,000): a job
    is created before it finishes, so `finished_until` bounds `created_at` too."""
    conn = await db.connect(db_dsn, "test-plans")
    try:
        await conn.execute(
            "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, created_at, finished_at)"
            " SELECT gen_random_uuid(), 'q', 't', 'key-' || i, 'succeeded', at, at"
            " FROM generate_series(1, 20000) i,"
            " LATERAL (SELECT now() - make_interval(secs => 30 * 86400.0 * i / 20000)) AS t(at)"
        )
        await conn.execute("ANALYZE dl_jobs")
        statement = queries.list_jobs(frozenset({"finished_from", "finished_until"}))
        day = datetime.now(UTC) - timedelta(days=25)
        sql, *args = statement.bind(
            finished_from=day, finished_until=day + timedelta(days=1), limit=101
        )
        plan = await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args)
        plan = json.loads(plan) if isinstance(plan, str) else plan
        # without the bound, the 16,000 jobs that finished since are read and thrown away; with
        # it, at most those created before the range's end (a bitmap of them: 3,334)
        assert _rows_removed(plan[0]["Plan"]) < 5000, plan
    finally:
        await conn.close()


def _sorted_scans(node: dict[str, Any], under_sort: bool = False) -> set[str]:
    """The indexes a plan reads below a Sort node (EXPLAIN's JSON)."""
    under_sort = under_sort or node["Node Type"] == "Sort"
    found = {node["Index Name"]} if under_sort and "Index Name" in node else set()
    for child in node.get("Plans", []):
        found |= _sorted_scans(child, under_sort)
    return found


def _rows_removed(node: dict[str, Any]) -> int:
    """How many rows a plan's nodes read and threw away (EXPLAIN ANALYZE)."""
    return int(node.get("Rows Removed by Filter", 0)) + sum(
        _rows_removed(child) for child in node.get("Plans", [])
    )


async def test_the_jobs_of_a_lost_claim_are_looked_up_among_the_running_jobs_only(
    stale_conn: db.Connection,
) -> None:
    lookup = queries.RECOVER_CLAIMS.bind(
        worker_id="w", claim_seed=uuid.uuid4(), suffixes=[str(n) for n in range(1, 11)]
    )
    plan = await plan_of(stale_conn, *lookup)
    # a partial index that only running jobs enter, or the status index's range of them
    assert "'Index Name': 'ix_dl_jobs_running_" in plan or (
        "'Index Name': 'ix_dl_jobs_status_queue'" in plan
        and "'Index Cond': \"(status = 'running'::dl_status)\"" in plan
    ), plan
    assert "Seq Scan" not in plan


@pytest.fixture
async def unanalyzed_processes(db_dsn: str) -> AsyncIterator[db.Connection]:
    """50,000 live processes in a table never analyzed, and generic plans."""
    conn = await db.connect(db_dsn, "test-plans")
    await conn.execute("ALTER TABLE dl_processes SET (autovacuum_enabled = false)")
    await conn.execute("TRUNCATE dl_processes CASCADE")  # statistics: "never analyzed"
    await conn.execute(
        "INSERT INTO dl_processes (namespace, process_id, queue, status)"
        " SELECT 'ns', 'p' || i, 'q', 'running' FROM generate_series(1, 50000) i"
    )
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    yield conn
    await conn.close()


def _save_args(statement: Statement) -> tuple[Any, ...]:
    """`statement`'s arguments for the saves of 32 steps (and their tasks' success)."""
    write = StepWrite(ProcessStatus.RUNNING, events=(('"e"', None),))
    saves = [(ref, uuid.uuid4(), write, None) for ref in range(1, 33)]
    values: dict[str, Any] = save_values(saves)
    if statement is FINISH_TASKS:
        facts = JobFacts(JobStatus.RUNNING, attempt=1, max_attempts=5)
        items = [
            (
                Fence(task, facts, uuid.uuid4()),
                after_attempt(Outcome(Ended.SUCCEEDED), facts, Linear()),
            )
            for _, task, _, _ in saves
        ]
        values |= parameters_of(items) | {
            "actor_role": "worker",
            "actor": "w",
            "wakes_own_queue": True,
            "hand_off": [],
            "claim_seed": uuid.uuid4(),
        }
    return statement.bind(**values)


@pytest.mark.parametrize("statement", [SAVE_PROCESSES, FINISH_TASKS], ids=["alone", "joined"])
async def test_the_saves_of_steps_find_their_processes_by_primary_key(
    unanalyzed_processes: db.Connection, statement: Statement
) -> None:
    sql, *args = _save_args(statement)
    found = await unanalyzed_processes.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
    plan = json.loads(found) if isinstance(found, str) else found
    scans = [
        (node["Node Type"], {n.get("Index Name") for n in _nodes(node)} - {None})
        for node in _nodes(plan[0]["Plan"])
        if node.get("Relation Name") == "dl_processes" and node["Node Type"] != "ModifyTable"
    ]
    assert scans
    assert all(indexes == {"dl_processes_pkey"} for _, indexes in scans), scans


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """`node` and every node under it."""
    return [node, *(n for child in node.get("Plans", ()) for n in _nodes(child))]


async def test_the_sweep_of_stranded_jobs_skips_from_queue_to_queue_of_each_key(
    db_dsn: str,
) -> None:
    """The reaper's sweep reads the (key hash, queue) pairs of parked jobs by a skip scan of
    their index, one probe per pair: 20,000 jobs parked behind one key in one queue cost it
    two probes, never a read of them all."""
    conn = await db.connect(db_dsn, "test-plans")
    try:
        await conn.execute(
            "INSERT INTO dl_jobs (job_id, queue, task, lock_key, parked) "
            "SELECT gen_random_uuid(), 'q', 't', 'hot', 'lock_key' FROM generate_series(1, 20000)"
        )
        await conn.execute(
            "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status) "
            "VALUES (gen_random_uuid(), 'q', 't', 'hot', 'running')"
        )
        await conn.execute("ANALYZE dl_jobs")
        statement, *args = queries.PUT_BACK_STRANDED.bind(limit=500)
        plan = await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", *args)
    finally:
        await conn.close()
    scans = [n for n in _nodes(plan[0]["Plan"]) if n.get("Relation Name") == "dl_jobs"]
    assert all(n["Node Type"] != "Seq Scan" for n in scans), plan
    pairs = [n for n in scans if n.get("Index Name") == "ix_dl_jobs_parked_lock_hash"]
    assert pairs, plan
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in pairs) <= 4, plan


async def test_a_statement_longer_than_asyncpgs_default_stays_prepared(db_dsn: str) -> None:
    """The finish of a durable process's step is longer than asyncpg's default limit of what
    it keeps prepared: unnamed, it was parsed and planned again at every call."""
    long = "SELECT $1::int + 1 AS n -- " + "x" * len(FINISH_TASKS.sql) + "\n"
    conn = await db.connect(db_dsn, "dl-test-cache")
    pool = await db.new_pool(db_dsn, 1, "dl-test-cache")
    try:
        for source in (conn, pool):
            for n in range(3):
                assert await source.fetchval(long, n) == n + 1
            prepared = await source.fetchval(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1", long
            )
            assert prepared == 1
    finally:
        await conn.close()
        await pool.close()


@pytest.mark.parametrize("name", ["set_job_states", "finish_jobs", "finish_tasks"])
async def test_an_outcome_reads_its_jobs_by_primary_key_in_a_generic_plan(
    db_dsn: str, name: str
) -> None:
    """A write of outcomes is prepared once and run with a generic plan. Statistics taken while
    the queue was small must not make that plan hash every job of the table to find the few it
    writes (as it did, to 1,000 jobs read per outcome written, with a few thousand queued)."""
    conn = await db.connect(db_dsn, "test-plans")
    try:
        await conn.execute("ALTER TABLE dl_jobs SET (autovacuum_enabled = false)")
        await conn.execute("ANALYZE dl_jobs")  # empty
        await conn.execute(
            "INSERT INTO dl_jobs (job_id, queue, task, lock_key) "
            "SELECT gen_random_uuid(), 'q', 't', 'key-' || i FROM generate_series(1, 5000) i"
        )
        token = uuid.uuid4()
        job_id = await conn.fetchval(
            "UPDATE dl_jobs SET status = 'running', attempt = 1, claim_token = $1"
            " WHERE job_id = (SELECT job_id FROM dl_jobs LIMIT 1) RETURNING job_id",
            token,
        )
        facts = JobFacts(JobStatus.RUNNING, attempt=1, max_attempts=5)
        transition = after_attempt(Outcome(Ended.SUCCEEDED), facts, Linear())
        arrays = parameters_of([(Fence(job_id, facts, token), transition)])
        common = {"actor_role": "worker", "actor": "w"}
        finish = common | {"wakes_own_queue": True, "hand_off": [], "claim_seed": uuid.uuid4()}
        saves = save_values([])
        statement = {
            "set_job_states": queries.SET_JOB_STATES.bind(**arrays, **common),
            "finish_jobs": queries.FINISH_JOBS.bind(**arrays, **finish),
            "finish_tasks": FINISH_TASKS.bind(**arrays, **finish, **saves),
        }[name]
    finally:
        await conn.close()
    # a connection of its own: the scans counted are this statement's alone
    conn = await db.connect(db_dsn, "test-plans")
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        async with conn.transaction():
            rows = await conn.fetch(*statement)
            scans = await conn.fetchval(
                "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'dl_jobs'::regclass"
            )
    finally:
        await conn.close()
    assert [r["state"] for r in rows] == ["written"]
    assert scans == 0
