"""Running the operators' commands as a user does: the real `dataloader` script in a
subprocess against the test's database, and what the tests read of their output and journal."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

from dataloader.client import Client

from .procs import DATALOADER_SCRIPT, clean_env


class Cli:
    """Runs `dataloader …` on the test's database, in a working directory of its own."""

    def __init__(self, dsn: str, cwd: Path) -> None:
        self.dsn = dsn
        self.cwd = cwd

    async def __call__(
        self, *args: str, env: dict[str, str | None] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The command's result, stdout and stderr apart (stdout must hold only what it
        prints for a reader: JSON with --json). Run in a thread: the test's own workers keep
        running meanwhile."""
        return await asyncio.to_thread(
            subprocess.run,
            [str(DATALOADER_SCRIPT), *args],
            env=clean_env({"DL_DB_DSN": self.dsn, "COLUMNS": "200", **(env or {})}),
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    async def json(self, *args: str, code: int = 0) -> Any:
        """The one JSON document `dataloader … --json` prints, once it exited `code`."""
        result = await self(*args, "--json")
        assert result.returncode == code, result
        assert result.stderr == "", result
        return json.loads(result.stdout)


def failed_in_one_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    """Assert the command exited `code` with one line on stderr and nothing on stdout; the
    line."""
    assert result.returncode == code, result
    assert result.stdout == "", result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("dataloader: "), lines[0]
    return lines[0]


async def journal(client: Client, job_id: str) -> list[tuple[str, Any]]:
    """(kind, who did it) of each entry of the job's journal, oldest first."""
    return [(e.kind, (e.payload or {}).get("by")) for e in await client.events(job_id)]
