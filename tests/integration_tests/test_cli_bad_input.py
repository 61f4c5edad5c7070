"""Bad input to the `dataloader` command, wherever it comes from (an option, an argument, a
setting): one line on stderr, exit 2 (as click's usage errors), no traceback, nothing
written; and what is not bad input (an empty DL_CRON) is not refused."""

from __future__ import annotations

import subprocess
from pathlib import Path

import asyncpg
import pytest

from dataloader.client import Client

from .operators import Cli, failed_in_one_line

#: `--args` nested far deeper than JSON's own parser goes (it gives up near 1,000 levels).
DEEP = "[" * 50_000 + "]" * 50_000


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """Assert the command refused its input: exit 2, one line, no traceback; the line."""
    line = failed_in_one_line(result, 2)
    assert "Traceback" not in line
    return line


async def written(conn: asyncpg.Connection) -> int:
    """Rows of jobs, queue settings and queue audit log: what a refusal must leave at 0."""
    return int(
        await conn.fetchval(
            "SELECT (SELECT count(*) FROM dl_jobs) + (SELECT count(*) FROM dl_queues)"
            " + (SELECT count(*) FROM dl_queue_events)"
        )
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--delay", "inf"], "--delay"),
        (["--delay", "nan"], "--delay"),
        (["--delay", "1e300"], "--delay"),
        (["--delay", "-10"], "--delay"),
        (["--wait", "--timeout", "nan"], "--timeout"),
        (["--wait", "--timeout", "inf"], "--timeout"),
        (["--priority", "-5"], "priority"),
        (["--max-attempts", "0"], "max_attempts"),
        (["--args", '{"a": ' + DEEP + "}"], "nested deeper than 64 levels"),
        (["--args", DEEP], "nested deeper than 64 levels"),
        (["--args", '{"a": ' + "[" * 100 + "]" * 100 + "}"], "nested deeper than 64 levels"),
        (["--args", "{"], "--args: not JSON"),
    ],
    ids=[
        "delay-inf", "delay-nan", "delay-1e300", "delay-negative", "timeout-nan",
        "timeout-inf", "priority-negative", "no-attempts", "args-deep", "args-deep-array",
        "args-100-deep", "args-not-json",
    ],
)  # fmt: skip
async def test_enqueue_refuses_bad_input_in_one_line_with_exit_2(
    cli: Cli, conn: asyncpg.Connection, args: list[str], named: str
) -> None:
    result = await cli("enqueue", "demo.noop", "--queue", "q", "--lock-key", "k", *args)
    assert named in refused(result)
    assert await written(conn) == 0


async def test_a_usage_error_is_one_line_that_names_the_command(cli: Cli) -> None:
    line = refused(await cli("enqueue", "--queue", "q"))
    assert line == ("dataloader: Missing argument 'TASK'. (see `dataloader enqueue --help`)")
    assert "No such option: --nope" in refused(await cli("jobs", "--nope"))
    assert "No such command 'jbos'" in refused(await cli("jbos"))


async def test_an_empty_queue_name_is_refused_naming_the_argument(
    cli: Cli, client: Client, conn: asyncpg.Connection
) -> None:
    for command in ("pause", "resume"):
        line = refused(await cli(command, ""))
        assert "Invalid value for 'QUEUE': must not be empty" in line
    with pytest.raises(ValueError, match=r"^queue: must not be empty"):
        await client.pause("")
    assert await written(conn) == 0


async def test_pausing_a_queue_nothing_knows_is_refused_unless_created(
    cli: Cli, client: Client, conn: asyncpg.Connection
) -> None:
    await client.enqueue("demo.noop", queue="etl", lock_key="k")
    line = refused(await cli("pause", "etll"))
    assert "queue 'etll' is unknown" in line
    assert "queues in use: etl" in line
    assert "--create" in line
    assert await conn.fetchval("SELECT count(*) FROM dl_queues") == 0

    assert (await cli.json("pause", "etl"))["paused"] is True  # a queue with jobs
    ahead = await cli.json("pause", "next-week", "--create")  # before its first job
    assert (ahead["queue"], ahead["paused"]) == ("next-week", True)
    await cli.json("resume", "next-week")
    again = await cli.json("pause", "next-week")  # its audit log knows it now
    assert again["paused"] is True


async def test_an_empty_dl_cron_is_no_schedule(cli: Cli) -> None:
    result = await cli("jobs", "--json", env={"DL_CRON": ""})
    assert result.returncode == 0, result
    assert result.stderr == ""


async def test_a_misspelt_variable_is_warned_of_naming_the_closest_setting(
    cli: Cli, tmp_path: Path
) -> None:
    result = await cli("jobs", "--json", env={"DL_DB_DNS": "postgresql://x@h/db"})
    assert result.returncode == 0, result  # a warning, not a refusal
    assert result.stderr.splitlines() == [
        "dataloader: warning: DL_DB_DNS is not a setting: it is ignored (did you mean DL_DB_DSN?)"
    ]
    (tmp_path / ".env").write_text("DL_PRUNE_SUCEEDED_AFTER_SEC=60\n")
    from_file = await cli("jobs", "--json")
    assert "did you mean DL_PRUNE_SUCCEEDED_AFTER_SEC?" in from_file.stderr


@pytest.mark.parametrize("command", [["prune"], ["prune", "--dry-run"], ["worker"]])
async def test_a_retention_beyond_the_calendar_is_refused_at_start(
    cli: Cli, conn: asyncpg.Connection, command: list[str]
) -> None:
    await conn.execute(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key, status, attempt, finished_at)"
        " VALUES (gen_random_uuid(), 'q', 't', 'k', 'succeeded', 1, now() - interval '30 days')"
    )
    result = await cli(*command, env={"DL_PRUNE_SUCCEEDED_AFTER_SEC": "1e12"})
    line = refused(result)
    assert line.startswith("dataloader: invalid configuration: DL_PRUNE_SUCCEEDED_AFTER_SEC")
    assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 1
