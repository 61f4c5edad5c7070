"""The operators' commands in a terminal: tables that fit its width (job ids whole on one line,
headers unsplit, columns of least use left out), `show`, cancel and retry by filter, and the
progress of `enqueue --wait`, with --json and without."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from dataloader.client import Client
from dataloader.runner import Runner

from .operators import Cli, failed_in_one_line, journal
from .procs import DATALOADER_SCRIPT, clean_env

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def header_cells(table: str) -> list[str]:
    """The headers of a table as printed, asserted to take one line (no header split)."""
    lines = table.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("┃")]
    assert len(heads) == 1, table  # a header folded over two lines would make two
    return [text.strip() for text in lines[heads[0]].split("┃")[1:-1]]


def assert_fits(table: str, width: int) -> None:
    longest = max(len(line) for line in table.splitlines())
    assert longest <= width, table


async def _varied_jobs(client: Client, conn: asyncpg.Connection) -> list[str]:
    """Jobs whose rows hold all a list shows: long task and queue names, a delay, progress, an
    error of several lines."""
    ids = []
    for n in range(3):
        job = await client.enqueue(
            "demo.sleep",
            {"seconds": 1},
            queue="nightly-warehouse-load",
            lock_key=f"region:{n}" * 5,
            available_at=timedelta(minutes=10 * n),
        )
        ids.append(str(job.job_id))
    await conn.execute(
        'UPDATE dl_jobs SET progress = \'{"done": 3, "total": 10}\' WHERE job_id = $1',
        ids[0],
    )
    await conn.execute(
        "UPDATE dl_jobs SET status = 'failed', finished_at = now(),"
        " error = E'Traceback (most recent call last):\\n  ...\\nValueError: ' || repeat('x', 120)"
        " WHERE job_id = $1",
        ids[1],
    )
    return ids


@pytest.mark.parametrize("width", [80, 120, 200])
async def test_the_job_list_fits_the_terminal_with_ids_whole(
    cli: Cli, client: Client, conn: asyncpg.Connection, width: int
) -> None:
    ids = await _varied_jobs(client, conn)
    result = await cli("jobs", env={"COLUMNS": str(width)})
    assert result.returncode == 0, result
    assert_fits(result.stdout, width)
    headers = header_cells(result.stdout)
    assert headers[:2] == ["job", "status"]
    for job_id in ids:  # each id whole on one line: a row per job
        assert len([line for line in result.stdout.splitlines() if job_id in line]) == 1
    assert len(UUID.findall(result.stdout)) == len(ids)
    if width == 200:
        assert headers == [
            "job", "status", "task", "queue", "error", "progress", "due", "attempt",
            "lock key", "created",
        ]  # fmt: skip
        assert "3/10 30%" in result.stdout
        assert re.search(r"in (19|20)m", result.stdout), result.stdout
        assert "ValueError: xxx" in result.stdout  # an error's last line, cut short
    elif width == 80:  # the queue's long name is left out rather than cut short
        assert headers == ["job", "status", "task"]


@pytest.mark.parametrize("width", [80, 120, 200])
async def test_the_queue_table_fits_the_terminal_with_headers_unsplit(
    cli: Cli, client: Client, width: int
) -> None:
    await client.enqueue("demo.noop", queue="etl", lock_key="k")
    result = await cli("queues", env={"COLUMNS": str(width)})
    assert result.returncode == 0, result
    assert_fits(result.stdout, width)
    headers = header_cells(result.stdout)
    every = [
        "queue", "ready", "waiting", "delayed", "running", "failed", "lost", "oldest due",
        "paused", "workers", "slots", "/min 1m", "/min 5m", "/min 60m",
    ]  # fmt: skip
    assert headers == [h for h in every if h in headers]  # whole, in order
    assert {"queue", "ready", "running", "failed", "paused"} <= set(headers)
    if width == 200:
        assert headers == every


async def test_show_prints_a_job_whole_with_its_journal(
    cli: Cli, client: Client, workers: Callable[[], Runner]
) -> None:
    job = await client.enqueue(
        "demo.fail", {"fail_times": 1}, queue="default", lock_key="k", max_attempts=1
    )
    async with workers():
        await client.wait(job.job_id, timeout=30)
    shown = await cli.json("show", str(job.job_id))
    assert (shown["job"]["job_id"], shown["job"]["status"]) == (str(job.job_id), "failed")
    assert "DemoFailure" in shown["job"]["error"]
    kinds = [event["kind"] for event in shown["events"]]
    assert kinds[0] == "queued"
    assert {"picked", "failed"} <= set(kinds)
    assert "heartbeat" not in kinds

    text = await cli("show", str(job.job_id), env={"COLUMNS": "80"})
    assert text.returncode == 0, text
    assert re.search(rf"^job +{job.job_id} *$", text.stdout, re.MULTILINE), text.stdout
    assert "DemoFailure" in text.stdout
    assert re.search(r"^journal$", text.stdout, re.MULTILINE)
    assert re.search(r"^\d\d:\d\d:\d\d picked", text.stdout, re.MULTILINE), text.stdout

    missing = "00000000-0000-0000-0000-000000000000"
    assert failed_in_one_line(await cli("show", missing), 1) == (
        f"dataloader: job {missing} not found"
    )


async def test_cancel_and_retry_by_filter_report_what_they_did(
    cli: Cli, client: Client, conn: asyncpg.Connection
) -> None:
    etl = [
        (await client.enqueue("demo.noop", queue="etl", lock_key=str(n))).job_id for n in range(3)
    ]
    other = (await client.enqueue("demo.noop", queue="other", lock_key="k")).job_id

    first = await cli.json("cancel", "--queue", "etl", "--limit", "2")
    assert (first["matched"], len(first["changed"]), first["more"]) == (2, 2, True)
    rest = await cli("cancel", "--queue", "etl", "--status", "queued")
    assert rest.returncode == 0, rest
    assert rest.stdout.strip() == "1 jobs matched, 1 canceled"
    statuses = dict(await conn.fetch("SELECT job_id, status::text FROM dl_jobs"))
    assert {statuses[j] for j in etl} == {"canceled"}
    assert statuses[other] == "queued"

    retried = await cli.json("retry", "--status", "canceled", "--as", "cli:ops")
    assert (retried["matched"], sorted(retried["changed"])) == (3, sorted(map(str, etl)))
    assert await journal(client, str(etl[0])) == [
        ("queued", "client"), ("canceled", "cli"), ("retried", "cli:ops"),
    ]  # fmt: skip
    shown = await cli("retry", "--queue", "other")
    assert shown.stdout.strip() == "1 jobs matched, 0 retried"


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ([], "give a JOB_ID, or at least one filter"),
        (["00000000-0000-0000-0000-000000000000", "--queue", "etl"], "not both"),
        (["--limit", "5"], "give a JOB_ID, or at least one filter"),
    ],
    ids=["nothing", "both", "a-limit-alone"],
)
@pytest.mark.parametrize("command", ["cancel", "retry"])
async def test_a_bulk_change_without_a_filter_is_refused(
    cli: Cli, client: Client, conn: asyncpg.Connection, command: str, args: list[str], reason: str
) -> None:
    await client.enqueue("demo.noop", queue="etl", lock_key="k")
    for as_json in ([], ["--json"]):
        assert reason in failed_in_one_line(await cli(command, *args, *as_json), 2)
    assert await conn.fetchval("SELECT count(*) FROM dl_job_events WHERE kind <> 'queued'") == 0


async def test_enqueue_wait_shows_progress_as_plain_lines_on_a_pipe(
    cli: Cli, workers: Callable[[], Runner]
) -> None:
    async with workers():
        result = await cli(
            "enqueue", "demo.sleep", "--queue", "default", "--lock-key", "k",
            "--args", '{"seconds": 0.8, "chunks": 4}', "--wait",
        )  # fmt: skip
    assert result.returncode == 0, result
    lines = result.stdout.splitlines()
    assert lines[0].startswith("job ")
    assert "demo.sleep running" in result.stdout
    assert "demo.sleep succeeded 4/4 100%" in lines
    assert "\x1b" not in result.stdout  # no bar drawn on a pipe
    assert re.search(r"^status +succeeded", result.stdout, re.MULTILINE)

    async with workers():
        as_json = await cli.json(
            "enqueue", "demo.sleep", "--queue", "default", "--lock-key", "k",
            "--args", '{"seconds": 0.2, "chunks": 2}', "--wait",
        )  # fmt: skip
    assert (as_json["status"], as_json["progress"]) == ("succeeded", {"done": 2, "total": 2})


def _in_a_terminal(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """Run `dataloader …` with a terminal as its stdout; its exit code and what it drew."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [str(DATALOADER_SCRIPT), *args],
        stdout=follower,
        stderr=follower,
        env=clean_env({**env, "TERM": "xterm", "COLUMNS": "100"}),
        cwd=cwd,
    )
    os.close(follower)
    drawn = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        drawn += chunk
    os.close(leader)
    return process.wait(timeout=30), drawn.decode(errors="replace")


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
async def test_enqueue_wait_draws_a_progress_bar_in_a_terminal(
    db_dsn: str, tmp_path: Path, workers: Callable[[], Runner]
) -> None:
    args = [
        "enqueue", "demo.sleep", "--queue", "default", "--lock-key", "k",
        "--args", '{"seconds": 1, "chunks": 4}', "--wait",
    ]  # fmt: skip
    async with workers():
        code, drawn = await asyncio.to_thread(_in_a_terminal, args, {"DL_DB_DSN": db_dsn}, tmp_path)
    assert code == 0, drawn
    assert "━" in drawn  # Rich's bar
    assert "100%" in drawn
    assert "succeeded" in drawn
