"""What a user reads: the one line of a refused setting or of a database without dataloader's
schema, and the log of a job that fails, as the library's default logging shows it (Python's
last-resort handler: warnings and errors on stderr, with the tracebacks they carry)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import asyncpg
import pytest

from dataloader.config import Settings
from dataloader.exceptions import DataloaderError
from dataloader.runner import Runner

from .procs import DATALOADER_SCRIPT, PYTHON_M_DATALOADER, free_port, one_line, run_cli


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"DL_HTTP_HOST": "0.0.0.0"},
            "dataloader: invalid configuration: DL_HTTP_HOST=0.0.0.0 is reachable from other"
            " machines and DL_API_TOKENS is empty: set tokens, or DL_ALLOW_UNAUTHENTICATED=true",
        ),
        (
            {"DL_API_TOKENS": "not-json"},
            "dataloader: invalid configuration: DL_API_TOKENS: not valid JSON",
        ),
    ],
    ids=["cross-check", "token-variable"],
)
def test_a_refused_setting_is_one_line_that_says_it_once_and_whole(
    tmp_path: Path, env: dict[str, str], line: str
) -> None:
    result = run_cli([*PYTHON_M_DATALOADER], {"DL_HTTP_PORT": str(free_port()), **env}, tmp_path)
    assert result.returncode == 2, result.stdout
    assert one_line(result.stdout).startswith(line), result.stdout
    assert "***" not in result.stdout


PROGRAM = """
import asyncio
import os

import dataloader


@dataloader.task("flaky.load", queue="q", max_attempts=3)
async def flaky(ctx: dataloader.JobContext[dict[str, str]]) -> None:
    if ctx.job.attempt == 1:
        raise dataloader.Retry(after=0, reason="source not ready")
    if ctx.job.attempt == 2:
        raise RuntimeError("transient glitch")


@dataloader.task("broken.load", queue="q", max_attempts=1)
async def broken(ctx: dataloader.JobContext[dict[str, str]]) -> None:
    raise RuntimeError("for good")


async def main() -> None:
    settings = dataloader.Settings(
        db_dsn=os.environ["DL_DB_DSN"], workers=[{"queue": "q", "concurrency": 1}],
        retry_base_sec=0,
    )
    async with dataloader.Runner(settings) as runner:
        flaky_job = await runner.client.enqueue("flaky.load", lock_key="a")
        broken_job = await runner.client.enqueue("broken.load", lock_key="b")
        await runner.run_until_empty()
        assert (await runner.client.get(flaky_job.job_id)).status == "succeeded"
        assert (await runner.client.get(broken_job.job_id)).status == "failed"


asyncio.run(main())
"""


def test_an_expected_retry_is_one_line_and_a_final_failure_keeps_its_traceback(
    db_dsn: str, tmp_path: Path
) -> None:
    script = tmp_path / "jobs.py"
    script.write_text(PROGRAM, encoding="utf-8")
    result = run_cli([sys.executable, str(script)], {"DL_DB_DSN": db_dsn}, tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    # Retry is the task's own request: not a warning
    assert not [line for line in lines if "source not ready" in line], result.stdout
    # a failure that will be retried: one line, no traceback
    assert [line for line in lines if "transient glitch" in line] == [
        "job attempt failed (requeue): RuntimeError: transient glitch"
    ], result.stdout
    # the final failure: its line, then the traceback of what the task raised
    assert result.stdout.count("Traceback (most recent call last)") == 1, result.stdout
    final = lines.index("job attempt failed (failed): RuntimeError: for good")
    assert lines[final + 1] == "Traceback (most recent call last):", result.stdout
    assert "RuntimeError: for good" in lines[final + 2 :], result.stdout


NO_SCHEMA = (
    "has no dataloader schema: run `dataloader migrate` against it, or start a dataloader"
    " service on it, first"
)


async def test_without_auto_migrate_the_worker_refuses_a_database_without_the_schema(
    empty_db_dsn: str, tmp_path: Path
) -> None:
    result = run_cli(
        [str(DATALOADER_SCRIPT), "worker"],
        {
            "DL_DB_DSN": empty_db_dsn,
            "DL_AUTO_MIGRATE": "false",
            "WORKERS_JSON": '[{"queue": "q", "concurrency": 1}]',
        },
        tmp_path,
    )
    assert result.returncode == 1, result.stdout
    assert one_line(result.stdout).endswith(f"with DL_AUTO_MIGRATE=false, {NO_SCHEMA}")
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        db_dsn=empty_db_dsn,
        auto_migrate=False,
        workers=[{"queue": "q", "concurrency": 1}],
    )
    with pytest.raises(DataloaderError, match=re.escape(NO_SCHEMA)):
        async with Runner(settings):
            pass
    conn = await asyncpg.connect(empty_db_dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'dl%'") == 0
    finally:
        await conn.close()
