"""The `dataloader` command (also `python -m dataloader`), one module per group of commands:

* `service.py`: `serve` (the default when no command is given), `worker`, `migrate`;
* `contracts.py`: `contract export | check | generate` (queue contracts);
* `jobs.py`, `watch.py`: `enqueue`, `jobs`, `show`, `cancel`, `retry`, `watch`;
* `queues.py`: `queues`, `pause`, `resume`, `limits`;
* `processes.py`: `processes list | show | events | start | call | repair | remove`;
* `status.py`, `maintenance.py`: `status`, `prune`.

The operators' commands (all but the service's and the contracts') go through
`dataloader.Client`, as the HTTP API and the library do; each takes `--json`. `common.py` holds
what all share (settings, exit codes, one-line errors), `output.py` how they print.
"""

from __future__ import annotations

import os
import signal
import sys
from importlib.metadata import version
from types import FrameType
from typing import NoReturn

import typer

from dataloader.cli import jobs, maintenance, queues, service, status, watch
from dataloader.cli.common import BUILTIN_PIPELINES, ExitCode, import_pipelines, say
from dataloader.cli.contracts import contract_app
from dataloader.cli.processes import processes_app

__all__ = ["BUILTIN_PIPELINES", "ExitCode", "app", "import_pipelines", "main"]

app = typer.Typer(add_completion=False)


def _print_version(requested: bool) -> None:
    if requested:
        typer.echo(f"dataloader {version('dataloader')}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _program(
    ctx: typer.Context,
    show_version: bool = typer.Option(
        False,
        "--version",
        help="Print the version and exit.",
        callback=_print_version,
        is_eager=True,
    ),
) -> None:
    """PostgreSQL job queue and job runner. Without a command: serve.

    Configured by environment variables (DL_DB_DSN, WORKERS_JSON, DL_PIPELINE_MODULES …, see
    the README) or a .env file in the working directory.

    Exit codes of the operators' commands: 0 done; 1 the request failed (no such job, not
    retryable, invalid input); 2 a usage error or an invalid setting; 3 the database cannot
    be reached; 4 the job ended failed, canceled or lost (enqueue --wait, watch); 5 the job
    had not ended within --timeout (enqueue --wait)."""
    if ctx.invoked_subcommand is None:
        service.serve()


_SERVICE, _JOBS, _QUEUES, _PROCESSES, _SYSTEM = "Service", "Jobs", "Queues", "Processes", "System"

app.command(rich_help_panel=_SERVICE)(service.serve)
app.command(rich_help_panel=_SERVICE)(service.worker)
app.command(rich_help_panel=_SERVICE)(service.migrate)
app.add_typer(contract_app, name="contract", rich_help_panel=_SERVICE)
app.command(rich_help_panel=_JOBS)(jobs.enqueue)
app.command(rich_help_panel=_JOBS)(jobs.jobs)
app.command(rich_help_panel=_JOBS)(jobs.show)
app.command(rich_help_panel=_JOBS)(watch.watch)
app.command(rich_help_panel=_JOBS)(jobs.cancel)
app.command(rich_help_panel=_JOBS)(jobs.retry)
app.command(rich_help_panel=_QUEUES)(queues.queues)
app.command(rich_help_panel=_QUEUES)(queues.pause)
app.command(rich_help_panel=_QUEUES)(queues.resume)
app.command(rich_help_panel=_QUEUES)(queues.limits)
app.add_typer(processes_app, rich_help_panel=_PROCESSES)
app.command(rich_help_panel=_SYSTEM)(status.status)
app.command(rich_help_panel=_SYSTEM)(maintenance.prune)


def main() -> None:
    """Entry point of the `dataloader` script and of `python -m dataloader` (click names the
    program in usage lines after the way it was started). A usage error is one line, as
    every other refusal of the commands is, not click's framed panel."""
    _find_modules_in_working_directory()
    signal.signal(signal.SIGTERM, _terminated)
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as exc:  # a usage error (exit 2), or Typer's own failure
        ctx = getattr(exc, "ctx", None)  # a usage error's: the command it was made to
        where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        say(" ".join(exc.format_message().split()) + where)
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        raise SystemExit(ExitCode.INTERRUPTED) from None
    raise SystemExit(code if isinstance(code, int) else ExitCode.OK)


def _terminated(signum: int, frame: FrameType | None) -> NoReturn:
    """SIGTERM (`timeout`, `kill`, a container stopping) ends a command as an error or Ctrl+C
    does: the stack unwinds, connections close, and the process lets go of the embedded
    server, which its last user stops. Python's default would end the process on the spot,
    leaving the server running with the dead pid among its users. `serve` and `worker`
    replace this with their graceful stop."""
    raise SystemExit(ExitCode.TERMINATED)


def _find_modules_in_working_directory() -> None:
    """Let the modules of DL_PIPELINE_MODULES be found in the directory the command runs in,
    as `python -m dataloader` does (and Celery's and RQ's commands): a console script's
    import path starts with the script's own directory instead. `python -P` (or
    PYTHONSAFEPATH) asks for no such entry, and gets none."""
    if sys.flags.safe_path:
        return
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
