"""The command line as a user meets it: `python -m dataloader` and the `dataloader` script are
one program; the start-up fails early and in one line for every mistake a user can make."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator
from importlib.metadata import version
from pathlib import Path

import asyncpg
import pytest

from .procs import DATALOADER_SCRIPT, Launcher, launched, run_cli

#: The two spellings of the program.
PROGRAMS = {
    "python -m dataloader": [sys.executable, "-m", "dataloader"],
    "dataloader": [str(DATALOADER_SCRIPT)],
}


@pytest.fixture
async def launcher(tmp_path: Path) -> AsyncIterator[Launcher]:
    async with launched(tmp_path) as started:
        yield started


@pytest.mark.parametrize("program", PROGRAMS)
def test_version_prints_the_package_version(program: str, tmp_path: Path) -> None:
    result = run_cli([*PROGRAMS[program], "--version"], {}, cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip() == f"dataloader {version('dataloader')}"


@pytest.mark.parametrize("program", PROGRAMS)
def test_help_names_the_program_and_its_commands(program: str, tmp_path: Path) -> None:
    result = run_cli([*PROGRAMS[program], "--help"], {"COLUMNS": "100"}, cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    assert f"Usage: {program} [OPTIONS] COMMAND [ARGS]..." in result.stdout
    for command in ("serve", "migrate"):
        assert command in result.stdout


@pytest.mark.parametrize(
    "command",
    [["-m", "dataloader"], ["-m", "dataloader", "serve"], ["script", "serve"], ["script"]],
    ids=["python-m", "python-m-serve", "script-serve", "script"],
)
async def test_every_spelling_of_serve_starts_the_service(
    launcher: Launcher, db_dsn: str, command: list[str]
) -> None:
    argv = [str(DATALOADER_SCRIPT), *command[1:]] if command[0] == "script" else command
    service = launcher.start(db_dsn, argv=argv)
    await service.wait_healthy()
    job_id = await service.trigger(task="demo.noop")
    assert (await service.wait_status(job_id, "succeeded"))["attempt"] == 1


async def test_python_m_migrate_is_the_migrate_command(empty_db_dsn: str, tmp_path: Path) -> None:
    env = {"DL_DB_DSN": empty_db_dsn}
    result = await asyncio.to_thread(
        run_cli, [*PROGRAMS["python -m dataloader"], "migrate"], env, tmp_path
    )
    assert result.returncode == 0, result.stdout
    assert "schema at version" in result.stdout


def one_line(output: str) -> str:
    """The only non-blank line of `output` (fails naming them all otherwise)."""
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{output}"
    return lines[0]


async def test_a_taken_http_port_stops_the_start_before_any_worker(
    db_dsn: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id = await conn.fetchval(
        "INSERT INTO dl_jobs (job_id, queue, task, lock_key) VALUES"
        " (gen_random_uuid(), 'default', 'demo.noop', 'k') RETURNING job_id"
    )
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = await asyncio.to_thread(
            run_cli,
            [*PROGRAMS["python -m dataloader"]],
            {"DL_DB_DSN": db_dsn, "DL_HTTP_PORT": str(port)},
            tmp_path,
        )
    assert result.returncode == 1, result.stdout
    line = one_line(result.stdout)
    assert "DL_HTTP_PORT" in line
    assert f"127.0.0.1:{port}" in line
    assert "in use" in line
    row = await conn.fetchrow("SELECT status, attempt FROM dl_jobs WHERE job_id = $1", job_id)
    assert (row["status"], row["attempt"]) == ("queued", 0)  # no worker ever ran
    assert await conn.fetchval("SELECT count(*) FROM dl_job_events WHERE kind = 'picked'") == 0
