"""The `dataloader` command as a process: the modules it finds, and what it leaves behind on
the embedded server when it ends, normally, by a signal, or killed outright."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import leftovers

from .helpers import wait_until
from .procs import DATALOADER_SCRIPT, PYTHON_M_DATALOADER, Launcher, ServiceProcess, run_cli

TASKS_MODULE = """
import dataloader


@dataloader.task("reports.build", queue="reports")
async def build(ctx: dataloader.JobContext[dict[str, str]]) -> None:
    return None
"""


@pytest.mark.parametrize(
    "command",
    [[str(DATALOADER_SCRIPT)], list(PYTHON_M_DATALOADER)],
    ids=["dataloader", "python -m dataloader"],
)
def test_the_command_finds_the_tasks_module_of_its_working_directory(
    command: list[str], tmp_path: Path
) -> None:
    (tmp_path / "reports_tasks.py").write_text(TASKS_MODULE, encoding="utf-8")
    result = run_cli(
        [*command, "contract", "export"], {"DL_PIPELINE_MODULES": "reports_tasks"}, tmp_path
    )
    assert result.returncode == 0, result.stdout
    assert "reports.build" in result.stdout


# --- the embedded server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    """A data dir whose embedded server holds a migrated database, and is stopped."""
    # not under tmp_path: run as root, the server runs as another user, who may not enter the
    # directory pytest keeps private to root
    path = Path(tempfile.mkdtemp(prefix="dl-embedded-"))
    try:
        result = run_cli(
            [str(DATALOADER_SCRIPT), "migrate"], {"DL_DATA_DIR": str(path)}, path, timeout=120
        )
        assert result.returncode == 0, result.stdout
        yield path
    finally:
        leftovers.end(leftovers.servers_of(path / "pgdata"))
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def embedded(data_dir: Path) -> Iterator[Path]:
    """The data dir, its server stopped before the test; stopped after it whatever the test
    left (the test's assertions say whether it was left)."""
    assert not leftovers.servers_of(data_dir / "pgdata")
    yield data_dir
    leftovers.end(leftovers.servers_of(data_dir / "pgdata"))
    (data_dir / "pgdata" / ".handle_pids.json").write_text("[]")


def users(data_dir: Path) -> list[int]:
    """The pids the embedded server's handle file holds."""
    return list(json.loads((data_dir / "pgdata" / ".handle_pids.json").read_text() or "[]"))


def assert_nothing_left(data_dir: Path) -> None:
    running = leftovers.servers_of(data_dir / "pgdata")
    assert not running, [leftovers.describe(proc) for proc in running]
    assert users(data_dir) == []


def cli(*args: str) -> list[str]:
    """A command of the `dataloader` script."""
    return [str(DATALOADER_SCRIPT), *args]


def run(data_dir: Path, *args: str) -> str:
    """Run a one-off command to its end on the embedded server; its output."""
    result = run_cli(cli(*args), {"DL_DATA_DIR": str(data_dir)}, data_dir, timeout=60)
    assert result.returncode == 0, result.stdout
    return result.stdout


async def watching(launcher: Launcher, data_dir: Path) -> ServiceProcess:
    """`dataloader watch` of a job no worker runs, once it shows the job: it waits for ever."""
    job = json.loads(
        run(
            data_dir,
            "enqueue",
            "demo.sleep",
            "--queue",
            "default",
            "--lock-key",
            "k",
            "--args",
            '{"seconds": 1}',
            "--json",
        )
    )
    watch = launcher.start(
        "watch",
        command=cli("watch", job["job_id"]),
        DL_DB_DSN=None,
        DL_DATA_DIR=str(data_dir),
    )

    async def shown() -> bool:
        return "queued by=cli" in watch.logs()

    await wait_until(shown, timeout=60, what="watch to show the job")
    return watch


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["TERM", "INT"]
)
async def test_a_command_stopped_by_a_signal_lets_the_embedded_server_stop(
    launcher: Launcher, embedded: Path, signum: int, code: int
) -> None:
    watch = await watching(launcher, embedded)
    assert watch.pid in users(embedded)
    watch.send(signum)
    assert await watch.wait(within=60) == code, watch.logs()
    assert "Traceback" not in watch.logs()
    assert_nothing_left(embedded)


async def test_a_killed_commands_pid_is_dropped_and_the_next_command_stops_the_server(
    launcher: Launcher, embedded: Path
) -> None:
    watch = await watching(launcher, embedded)
    watch.kill()
    assert await watch.wait() == -signal.SIGKILL
    assert leftovers.servers_of(embedded / "pgdata")  # orphaned, its dead user on file
    assert watch.pid in users(embedded)

    run(embedded, "jobs", "--json")
    assert_nothing_left(embedded)


async def test_a_service_that_adopted_an_orphaned_server_stops_it_when_it_stops(
    launcher: Launcher, embedded: Path
) -> None:
    first = launcher.start("first", DL_DB_DSN=None, DL_DATA_DIR=str(embedded))
    await first.wait_healthy(within=120)
    first.kill()
    assert await first.wait() == -signal.SIGKILL
    assert leftovers.servers_of(embedded / "pgdata")  # orphaned

    second = launcher.start("second", DL_DB_DSN=None, DL_DATA_DIR=str(embedded))
    await second.wait_healthy(within=120)
    assert users(embedded) == [second.pid]
    second.terminate()
    assert await second.wait(within=60) == 0, second.logs()
    assert_nothing_left(embedded)
