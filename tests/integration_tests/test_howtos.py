"""Every how-to page runs: the `python` blocks of each page in docs/howto/, put together in
order, are one program, run against a database of its own. Their asserts are the page's
promises, so an example that goes stale fails the suite."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest

HOWTO = Path(__file__).resolve().parents[2] / "docs" / "howto"
PAGES = sorted(HOWTO.glob("*.md"))
#: A fenced python block of a page.
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: Longest a page's program may run (a loaded machine runs several at once).
PAGE_TIMEOUT_SEC = 180


def program_of(page: Path) -> str:
    """The page's python blocks, in order."""
    return "\n\n".join(PYTHON_BLOCK.findall(page.read_text(encoding="utf-8")))


def test_there_are_how_to_pages_and_each_has_code() -> None:
    assert len(PAGES) >= 5
    for page in PAGES:
        assert program_of(page).strip(), f"{page.name} has no python block"


@pytest.mark.parametrize("page", PAGES, ids=[page.stem for page in PAGES])
async def test_the_how_to_page_runs(page: Path, db_dsn: str, tmp_path: Path) -> None:
    script = tmp_path / f"{page.stem}.py"
    script.write_text(program_of(page), encoding="utf-8")
    env = {
        **os.environ,
        "DL_DB_DSN": db_dsn,
        "DL_DATA_DIR": str(tmp_path / "data"),
        "DL_LOG_LEVEL": "WARNING",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        cwd=tmp_path,
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
    assert proc.returncode == 0, output.decode(errors="replace")
