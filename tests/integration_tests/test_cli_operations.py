"""The operators' commands as a user runs them: the real `dataloader` script in a subprocess
against a real database, its output (`--json` parsed; tables read as text), its exit codes and
its one-line errors, and who the journal and the audit log say acted."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from dataloader.client import Client
from dataloader.runner import Runner

from .helpers import add_worker, wait_until
from .operators import Cli, failed_in_one_line, journal

#: A password that must never appear in the output.
PASSWORD = "secretpw-51ac"


def rows(table: str) -> dict[str, list[str]]:
    """The rows of a table as the commands print it (not its header), by their first cell."""
    found = {}
    for line in table.splitlines():
        cells = [text.strip() for text in line.split("│")[1:-1]]
        if cells:
            found[cells[0]] = cells
    return found


# --- enqueue --------------------------------------------------------------------------------------


async def test_enqueue_prints_the_job_and_journals_the_cli_as_its_actor(
    cli: Cli, client: Client, conn: asyncpg.Connection
) -> None:
    job = await cli.json(
        "enqueue", "demo.sleep", "--queue", "etl", "--lock-key", "day:1",
        "--args", '{"seconds": 1}', "--priority", "7", "--max-attempts", "2",
        "--partition-key", "p1", "--delay", "600",
    )  # fmt: skip
    assert (job["status"], job["created"], job["rerun"]) == ("queued", True, False)
    state = await client.get(job["job_id"])
    assert state is not None
    assert (state.queue, state.task, state.lock_key, state.priority, state.max_attempts) == (
        "etl", "demo.sleep", "day:1", 7, 2,
    )  # fmt: skip
    delayed = await conn.fetchval(
        "SELECT available_at > now() + interval '500 seconds' AND partition_key = 'p1'"
        " FROM dl_jobs WHERE job_id = $1",
        state.job_id,
    )
    assert delayed is True
    assert await journal(client, job["job_id"]) == [("queued", "cli")]

    shown = await cli(
        "enqueue", "demo.noop", "--queue", "etl", "--lock-key", "k", "--as", "cli:alice"
    )
    assert shown.returncode == 0, shown
    job_id = shown.stdout.split()[1]
    assert shown.stdout.strip() == f"job {job_id} queued"
    assert await journal(client, job_id) == [("queued", "cli:alice")]

    # without --lock-key the job excludes no other
    free = await cli.json("enqueue", "demo.noop", "--queue", "etl")
    assert (await client.get(free["job_id"])).lock_key is None


async def test_enqueue_under_a_known_idempotency_key_says_so(cli: Cli) -> None:
    command = ("enqueue", "demo.noop", "--queue", "etl", "--lock-key", "k")
    first = await cli.json(*command, "--idempotency-key", "once")
    again = await cli.json(*command, "--idempotency-key", "once")
    assert (again["job_id"], again["created"]) == (first["job_id"], False)
    shown = await cli(*command, "--idempotency-key", "once")
    assert "already enqueued" in shown.stdout


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["demo.noop", "--queue", "q", "--args", "{not json"], "--args: not JSON"),
        (["demo.noop", "--queue", "q", "--args", "[1, 2]"], "--args: must be a JSON object"),
        (["demo.sleep", "--queue", "q", "--args", '{"seconds": "soon"}'], "seconds"),
        (["demo.noop"], "queue: required"),
        (["demo.noop", "--queue", "q", "--max-attempts", "0"], "max_attempts"),
    ],
    ids=["not-json", "not-an-object", "args-of-the-wrong-type", "no-queue", "no-attempts"],
)
async def test_enqueue_refuses_invalid_input_in_one_line(
    cli: Cli, conn: asyncpg.Connection, args: list[str], reason: str
) -> None:
    result = await cli("enqueue", *args, "--lock-key", "k", "--json")
    assert reason in failed_in_one_line(result, 2)
    assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 0


async def test_enqueue_routes_a_task_as_the_http_trigger_does(
    cli: Cli, conn: asyncpg.Connection
) -> None:
    """Accepted while nobody serves the queue (its workers are away); refused in one line
    where live processes serve the queue and none knows the task, unless opted out."""
    command = ("enqueue", "etl.load", "--queue", "etl", "--lock-key", "k", "--json")
    assert (await cli.json(*command[:-1]))["created"] is True

    await add_worker(conn, "elsewhere", {"etl": 1}, ["etl.other"])
    typo = ("enqueue", "etl.laod", "--queue", "etl", "--lock-key", "k2")
    line = failed_in_one_line(await cli(*typo), 1)
    assert "'etl.laod' is unknown (known: demo.fail, demo.noop, demo.sleep, etl.other)" in line
    assert "live processes serve queue 'etl'" in line
    assert "DL_ALLOW_UNKNOWN_TASKS" in line
    assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 1

    opted_out = await cli(*typo, env={"DL_ALLOW_UNKNOWN_TASKS": "true"})
    assert opted_out.returncode == 0, opted_out
    tasks = await conn.fetch("SELECT task FROM dl_jobs ORDER BY created_at")
    assert [row["task"] for row in tasks] == ["etl.load", "etl.laod"]


async def test_enqueue_refuses_another_queue_than_the_tasks_naming_both(
    cli: Cli, conn: asyncpg.Connection
) -> None:
    """Known from DL_PIPELINE_MODULES or from a live process's contract."""
    env = {
        "DL_PIPELINE_MODULES": "tests.integration_tests.etl_task",
        "PYTHONPATH": str(Path(__file__).parents[2]),  # where `tests` is found
    }
    here = ("enqueue", "etl.load_rows", "--queue", "default", "--lock-key", "k")
    line = failed_in_one_line(await cli(*here, env=env), 2)
    assert "task 'etl.load_rows' runs on queue 'etl', not 'default'" in line

    await add_worker(conn, "elsewhere", {"etl": 1}, ["etl.load"], task_queues={"etl.load": "etl"})
    live = ("enqueue", "etl.load", "--queue", "default", "--lock-key", "k")
    line = failed_in_one_line(await cli(*live), 2)
    assert "task 'etl.load' runs on queue 'etl', not 'default'" in line
    assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 0
    assert (await cli.json("enqueue", "etl.load", "--queue", "etl", "--lock-key", "k"))["created"]


@pytest.mark.parametrize(
    "args",
    [
        ["enqueue", "demo.noop", "--queue"],  # no value
        ["jobs", "--limit", "0"],
        ["jobs", "--status", "done"],
        ["watch"],
        ["enqueue", "demo.noop", "--lock-key", "k", "--delay", "-1"],
    ],
    ids=["missing-value", "limit-out-of-range", "unknown-status", "missing-argument", "delay"],
)
async def test_usage_errors_exit_2(cli: Cli, args: list[str]) -> None:
    result = await cli(*args)
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert "Traceback" not in result.stderr


async def test_enqueue_wait_ends_with_the_jobs_final_state(
    cli: Cli, workers: Callable[[], Runner]
) -> None:
    async with workers():
        done = await cli.json(
            "enqueue", "demo.noop", "--queue", "default", "--lock-key", "a", "--wait"
        )
        assert (done["status"], done["attempt"]) == ("succeeded", 1)
        failed = await cli.json(
            "enqueue", "demo.fail", "--queue", "default", "--lock-key", "b",
            "--args", '{"fail_times": 1}', "--max-attempts", "1", "--wait", code=4,
        )  # fmt: skip
        assert failed["status"] == "failed"
        assert "DemoFailure" in failed["error"]
        shown = await cli("enqueue", "demo.noop", "--queue", "default", "--lock-key", "c", "--wait")
    assert shown.returncode == 0, shown
    assert "succeeded" in shown.stdout


async def test_enqueue_wait_gives_up_at_the_timeout(cli: Cli) -> None:
    """Nobody serves the queue: the job is still queued when the timeout runs out."""
    result = await cli(
        "enqueue", "demo.noop", "--queue", "nobody", "--lock-key", "a",
        "--wait", "--timeout", "0.3", "--json",
    )  # fmt: skip
    assert result.returncode == 5, result
    state = json.loads(result.stdout)  # the job as it is, for a script to follow up on
    assert state["status"] == "queued"
    assert result.stderr.strip() == f"dataloader: job {state['job_id']} has not ended within 0.3s"


# --- jobs -----------------------------------------------------------------------------------------


async def _three_jobs(client: Client) -> list[str]:
    """Jobs in queues etl, etl and load (lock keys k0, k1, k2), oldest first; their ids."""
    return [
        str((await client.enqueue("demo.noop", queue=queue, lock_key=f"k{i}")).job_id)
        for i, queue in enumerate(["etl", "etl", "load"])
    ]


async def test_jobs_lists_newest_first_in_pages(cli: Cli, client: Client) -> None:
    ids = await _three_jobs(client)
    first = await cli.json("jobs", "--limit", "2")
    assert [job["job_id"] for job in first["jobs"]] == ids[:0:-1]
    assert first["jobs"][0]["created_at"].endswith("Z")  # ISO 8601, UTC
    rest = await cli.json("jobs", "--limit", "2", "--cursor", first["next_cursor"])
    assert ([job["job_id"] for job in rest["jobs"]], rest["next_cursor"]) == ([ids[0]], None)

    shown = await cli("jobs", "--limit", "2")
    assert shown.returncode == 0, shown
    assert list(rows(shown.stdout)) == ids[:0:-1]
    assert f"next page: --cursor {first['next_cursor']}" in shown.stdout


async def test_jobs_takes_filters(cli: Cli, client: Client) -> None:
    ids = await _three_jobs(client)
    etl = await cli.json("jobs", "--queue", "etl", "--status", "queued", "--task", "demo.noop")
    assert [job["job_id"] for job in etl["jobs"]] == ids[1::-1]
    by_key = await cli.json("jobs", "--lock-key", "k2")
    assert [job["job_id"] for job in by_key["jobs"]] == [ids[2]]
    assert (await cli("jobs", "--status", "lost")).stdout.strip() == "no jobs"


async def test_jobs_and_a_bulk_change_find_jobs_by_args(cli: Cli, client: Client) -> None:
    wanted = await client.enqueue("demo.noop", {"day": "d1", "n": 1}, queue="etl", lock_key="a")
    await client.enqueue("demo.noop", {"day": "d2"}, queue="etl", lock_key="b")
    listed = await cli.json("jobs", "--args", '{"day": "d1"}')
    assert [job["job_id"] for job in listed["jobs"]] == [str(wanted.job_id)]
    canceled = await cli.json("cancel", "--args", '{"day": "d1"}')
    assert canceled["changed"] == [str(wanted.job_id)]
    assert "args: not valid JSON" in failed_in_one_line(await cli("jobs", "--args", "day"), 2)


async def test_a_cursor_that_no_list_made_is_one_line(cli: Cli) -> None:
    assert "cursor" in failed_in_one_line(await cli("jobs", "--cursor", "garbage"), 2)


# --- cancel and retry -----------------------------------------------------------------------------


async def test_cancel_and_retry_print_the_state_after_and_journal_the_cli(
    cli: Cli, client: Client
) -> None:
    job_id = str((await client.enqueue("demo.noop", queue="nobody", lock_key="k")).job_id)
    canceled = await cli.json("cancel", job_id)
    assert (canceled["job_id"], canceled["status"]) == (job_id, "canceled")
    retried = await cli.json("retry", job_id, "--as", "cli:alice")
    assert retried["status"] == "queued"
    assert await journal(client, job_id) == [
        ("queued", "client"),
        ("canceled", "cli"),
        ("retried", "cli:alice"),
    ]


async def test_a_job_that_cannot_be_retried_is_one_line(cli: Cli, client: Client) -> None:
    job_id = str((await client.enqueue("demo.noop", queue="nobody", lock_key="k")).job_id)
    refused = failed_in_one_line(await cli("retry", job_id), 1)
    assert "cannot be retried" in refused
    shown = await cli("cancel", job_id)
    assert shown.returncode == 0, shown
    assert rows(shown.stdout) == {}  # not a table: the job's fields, one per line
    assert re.search(rf"^job +{job_id} *$", shown.stdout, re.MULTILINE), shown.stdout
    assert "canceled" in shown.stdout


@pytest.mark.parametrize("command", ["cancel", "retry", "watch"])
async def test_an_unknown_job_is_one_line(cli: Cli, command: str) -> None:
    missing = str(uuid.uuid4())
    line = failed_in_one_line(await cli(command, missing, "--json"), 1)
    assert line == f"dataloader: job {missing} not found"
    assert "not a job id" in failed_in_one_line(await cli(command, "12345"), 1)


# --- watch ----------------------------------------------------------------------------------------


async def test_watch_follows_a_job_until_it_succeeds(
    cli: Cli, client: Client, workers: Callable[[], Runner]
) -> None:
    job = await client.enqueue(
        "demo.sleep", {"seconds": 1.2, "chunks": 4}, queue="default", lock_key="k"
    )
    watching = asyncio.ensure_future(cli("watch", str(job.job_id), "--json"))
    async with workers():
        result = await asyncio.wait_for(watching, 30)
    assert result.returncode == 0, result
    assert result.stderr == ""
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = [line["kind"] for line in lines if line["type"] == "event"]
    assert kinds[0] == "queued"
    assert {"picked", "done"} <= set(kinds)
    assert "heartbeat" not in kinds
    progress = [line["progress"] for line in lines if line["type"] == "progress"]
    assert progress[-1] == {"done": 4, "total": 4}
    assert lines[-1]["type"] == "state"
    assert (lines[-1]["job_id"], lines[-1]["status"]) == (str(job.job_id), "succeeded")

    shown = await cli("watch", str(job.job_id))  # ended already: shown at once
    assert shown.returncode == 0, shown
    assert "done" in shown.stdout
    assert "100%" in shown.stdout
    assert "succeeded" in shown.stdout


async def test_watch_exits_4_for_a_job_that_did_not_succeed(cli: Cli, client: Client) -> None:
    job = await client.enqueue("demo.noop", queue="nobody", lock_key="k")
    await client.cancel(job.job_id)
    result = await cli("watch", str(job.job_id), "--json")
    assert result.returncode == 4, result
    last = json.loads(result.stdout.splitlines()[-1])
    assert (last["type"], last["status"]) == ("state", "canceled")
    shown = await cli("watch", str(job.job_id))
    assert shown.returncode == 4, shown
    assert "canceled" in shown.stdout


# --- queues, pause and resume ---------------------------------------------------------------------


async def test_queues_shows_what_each_queue_holds(cli: Cli, client: Client) -> None:
    for lock_key in ("a", "b"):
        await client.enqueue("demo.noop", queue="etl", lock_key=lock_key)
    await client.enqueue(
        "demo.noop", queue="load", lock_key="a", available_at=timedelta(minutes=10)
    )
    await client.pause("load")

    queues = {q["queue"]: q for q in (await cli.json("queues"))["queues"]}
    assert (queues["etl"]["ready"], queues["etl"]["total"], queues["etl"]["paused"]) == (
        2,
        2,
        False,
    )
    assert (queues["load"]["delayed"], queues["load"]["paused"]) == (1, True)
    assert [t["window_sec"] for t in queues["etl"]["throughput"]] == [60, 300, 3600]
    assert queues["etl"]["throughput"][0]["per_minute"] == 0
    one = await cli.json("queues", "empty")
    assert [(q["queue"], q["total"]) for q in one["queues"]] == [("empty", 0)]

    shown = await cli("queues")
    assert shown.returncode == 0, shown
    table = rows(shown.stdout)
    assert table["etl"][1:3] == ["2", "0"]  # ready, waiting
    assert "by client" in table["load"]


async def test_pause_and_resume_print_the_settings_and_audit_the_cli(
    cli: Cli, client: Client
) -> None:
    await client.enqueue("demo.noop", queue="etl", lock_key="k")
    paused = await cli.json("pause", "etl")
    assert (paused["queue"], paused["paused"], paused["changed_by"]) == ("etl", True, "cli")
    resumed = await cli("resume", "etl", "--as", "cli:alice")
    assert resumed.returncode == 0, resumed
    assert resumed.stdout.startswith("queue etl: running")
    assert "by cli:alice" in resumed.stdout
    log = await client.queue_events("etl")
    assert [(e.kind, e.actor) for e in log] == [("paused", "cli"), ("resumed", "cli:alice")]
    assert (await client.stats("etl"))["etl"].paused is False


async def test_limits_are_set_and_removed(cli: Cli, client: Client) -> None:
    limited = await cli.json("limits", "etl", "--max-running", "3", "--max-per-second", "2.5")
    assert limited["limits"] == {
        "max_running": 3,
        "max_running_per_partition": None,
        "max_per_second": 2.5,
    }
    assert (await client.stats("etl"))["etl"].limits.max_running == 3
    # without a limit, the command removes nothing: a look is not a change
    assert "--clear" in failed_in_one_line(await cli("limits", "etl"), 2)
    assert "--clear" in failed_in_one_line(
        await cli("limits", "etl", "--clear", "--max-running", "2"), 2
    )
    assert (await client.stats("etl"))["etl"].limits.max_running == 3
    cleared = await cli("limits", "etl", "--clear")
    assert cleared.returncode == 0, cleared
    assert "no limits" in cleared.stdout
    assert [(e.kind, e.actor) for e in await client.queue_events("etl")] == [
        ("limits", "cli"),
        ("limits", "cli"),
    ]
    assert (await cli("limits", "etl", "--max-running", "0")).returncode == 2


async def test_an_invalid_actor_is_one_line(cli: Cli) -> None:
    line = failed_in_one_line(await cli("pause", "etl", "--as", "x" * 201), 2)
    assert "Invalid value for '--as': must be at most 200 characters" in line


# --- status ---------------------------------------------------------------------------------------


async def test_status_shows_queues_workers_maintenance_and_warnings(
    cli: Cli, client: Client, conn: asyncpg.Connection, workers: Callable[[], Runner]
) -> None:
    await client.enqueue("demo.noop", queue="orphan", lock_key="k")
    async with workers() as runner:
        assert runner.manager is not None
        leader = runner.manager.worker_id

        async def reaped() -> bool:
            return bool(await conn.fetchval("SELECT count(*) FROM dl_maintenance_runs"))

        await wait_until(reaped, what="a maintenance run recorded")
        status = await cli.json("status")
        shown = await cli("status")
    assert status["queues"]["orphan"] == {
        "queued": 1, "running": 0, "failed": 0, "lost": 0, "paused": False,
    }  # fmt: skip
    [live] = status["live_workers"]
    assert (live["worker_id"], live["queues"]) == (leader, {"default": 2})
    assert status["maintenance"]["leader"]["holder"] == leader
    assert status["maintenance"]["runs"]["reaper"]["ok"] is True
    assert "orphan" in " ".join(status["warnings"])
    assert status["queue_table"]["live_tuples"] >= 0
    assert shown.returncode == 0, shown
    for seen in ("live workers", leader, "reaper", "warning: queue 'orphan'"):
        assert seen in shown.stdout


async def test_status_with_nothing_running_warns_of_nothing(cli: Cli) -> None:
    status = await cli.json("status")
    assert (status["queues"], status["live_workers"], status["warnings"]) == ({}, [], [])
    assert status["maintenance"]["leader"] is None
    assert "no warnings" in (await cli("status")).stdout


# --- prune ----------------------------------------------------------------------------------------


async def _finished(conn: asyncpg.Connection, status: str, days_ago: float) -> uuid.UUID:
    """A job that ended `status` `days_ago` days ago."""
    job_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, attempt, started_at,"
        " finished_at, created_at)"
        " VALUES ($1::uuid, 'etl', 't', $1::uuid::text, $2::dl_status, 1, now(),"
        " now() - make_interval(days => $3), now() - interval '90 days')",
        job_id,
        status,
        days_ago,
    )
    return job_id


async def test_prune_deletes_only_jobs_past_their_retention(
    cli: Cli, client: Client, conn: asyncpg.Connection
) -> None:
    old_success = await _finished(conn, "succeeded", 8)  # kept 7 days
    recent_success = await _finished(conn, "succeeded", 1)
    recent_failure = await _finished(conn, "failed", 8)  # kept 30 days
    old_failure = await _finished(conn, "failed", 31)
    queued = (await client.enqueue("demo.noop", queue="etl", lock_key="k")).job_id

    preview = await cli.json("prune", "--dry-run")
    assert preview["dry_run"] is True
    assert preview["would_delete"] == {
        "succeeded": 1, "canceled": 0, "failed": 1, "lost": 0, "heartbeats": 0, "processes": 0,
    }  # fmt: skip
    assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 5

    pruned = await cli.json("prune")
    assert pruned["deleted"]["succeeded"] == 1
    assert pruned["deleted"]["failed"] == 1
    assert pruned["retention_sec"]["succeeded"] == 7 * 86400
    left = {row["job_id"] for row in await conn.fetch("SELECT job_id FROM dl_jobs")}
    assert left == {recent_success, recent_failure, queued}
    assert old_success not in left
    assert old_failure not in left
    run = await conn.fetchrow("SELECT holder, ok FROM dl_maintenance_runs WHERE task = 'pruner'")
    assert (run["holder"], run["ok"]) == ("cli", True)

    shown = await cli("prune", env={"DL_PRUNE_SUCCEEDED_AFTER_SEC": "3600"})
    assert shown.returncode == 0, shown
    assert rows(shown.stdout)["succeeded"] == ["succeeded", "1", "1h 00m"]
    assert {row["job_id"] for row in await conn.fetch("SELECT job_id FROM dl_jobs")} == {
        recent_failure,
        queued,
    }


# --- the database ---------------------------------------------------------------------------------

#: Every operators' command, with arguments that would be valid.
COMMANDS = {
    "enqueue": ["enqueue", "demo.noop", "--queue", "q", "--lock-key", "k"],
    "jobs": ["jobs"],
    "watch": ["watch", str(uuid.uuid4())],
    "cancel": ["cancel", str(uuid.uuid4())],
    "retry": ["retry", str(uuid.uuid4())],
    "queues": ["queues"],
    "pause": ["pause", "q"],
    "resume": ["resume", "q"],
    "status": ["status"],
    "prune": ["prune"],
}


@pytest.mark.parametrize("command", COMMANDS)
async def test_an_unreachable_database_is_exit_3_in_one_line(tmp_path: Path, command: str) -> None:
    cli = Cli(f"postgresql://dl:{PASSWORD}@127.0.0.1:1/dl", tmp_path)
    line = failed_in_one_line(await cli(*COMMANDS[command]), 3)
    assert "127.0.0.1:1" in line
    assert PASSWORD not in line


@pytest.mark.parametrize("command", ["jobs", "status"])
async def test_without_dl_db_dsn_the_commands_ask_for_it(tmp_path: Path, command: str) -> None:
    """No DSN and no embedded server's data here: no server is started to find nothing."""
    line = failed_in_one_line(
        await Cli("", tmp_path)(*COMMANDS[command], env={"DL_DB_DSN": None}), 2
    )
    assert "DL_DB_DSN is not set" in line
    assert not (tmp_path / ".dataloader").exists()


async def test_a_database_without_the_schema_says_to_migrate(
    empty_db_dsn: str, tmp_path: Path
) -> None:
    line = failed_in_one_line(await Cli(empty_db_dsn, tmp_path)("queues"), 1)
    assert "dataloader migrate" in line


async def test_help_lists_every_command(cli: Cli) -> None:
    result = await cli("--help")
    assert result.returncode == 0, result
    for command in COMMANDS:
        assert f" {command} " in result.stdout
