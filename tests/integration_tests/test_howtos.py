"""Every how-to page runs as written, as a newcomer runs it: on a fresh database that has no
dataloader schema yet, with only the packages the README's install (`pip install -e .`) brings,
in a shell where that virtual environment is active and `DL_DB_DSN` names the database.

A page's `bash` blocks are run by bash (`set -e`), each in page order: those before the page's
first `python` block before its program, the others after it. Its `python` blocks, put
together in order, are that program; its asserts are the page's promises, so an example that
goes stale fails the suite. A `sh` block sketches a deployment (hosts, services left running)
and is not run."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .installed import import_guard
from .procs import clean_env

HOWTO = Path(__file__).resolve().parents[2] / "docs" / "howto"
PAGES = sorted(HOWTO.glob("*.md"))
#: A fenced block of a page: its language and its text.
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: Longest a page's program may run (a loaded machine runs several at once).
PAGE_TIMEOUT_SEC = 180


@dataclass(frozen=True)
class Page:
    """A how-to page as the suite runs it."""

    before: list[str]  # bash blocks before the first python block
    program: str
    after: list[str]  # bash blocks after it


def read(page: Path) -> Page:
    before: list[str] = []
    python: list[str] = []
    after: list[str] = []
    for language, text in BLOCK.findall(page.read_text(encoding="utf-8")):
        if language == "python":
            python.append(text)
        elif language == "bash":
            (after if python else before).append(text)
    return Page(before, "\n\n".join(python), after)


def test_there_are_how_to_pages_and_each_has_code() -> None:
    assert len(PAGES) >= 5
    for page in PAGES:
        assert read(page).program.strip(), f"{page.name} has no python block"


async def run(command: list[str], cwd: Path, env: dict[str, str]) -> None:
    """Run `command` to its end; fail with its output unless it exits 0."""
    proc = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), PAGE_TIMEOUT_SEC)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, f"{' '.join(command)}:\n{output.decode(errors='replace')}"


@pytest.mark.parametrize("page", PAGES, ids=[page.stem for page in PAGES])
async def test_the_how_to_page_runs(page: Path, empty_db_dsn: str, tmp_path: Path) -> None:
    steps = read(page)
    script = tmp_path / f"{page.stem}.py"
    script.write_text(steps.program, encoding="utf-8")
    env = clean_env(
        {
            "DL_DB_DSN": empty_db_dsn,
            "DL_DATA_DIR": str(tmp_path / "data"),  # never the repository's embedded server
            # the virtual environment, active; nothing importable that its install lacks
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(import_guard(tmp_path / "guard")),
        }
    )
    for block in steps.before:
        await run(["bash", "-e", "-c", block], tmp_path, env)
    await run([sys.executable, str(script)], tmp_path, env)
    for block in steps.after:
        await run(["bash", "-e", "-c", block], tmp_path, env)
