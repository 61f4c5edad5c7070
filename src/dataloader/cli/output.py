"""How the operators' commands print: with `--json` one JSON document on stdout (dates in ISO
8601, ids and statuses as strings), otherwise Rich tables and lines."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from typing import Any, Final

from pydantic_core import to_jsonable_python
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dataloader.base import JobStatus
from dataloader.core.models import JobState

#: Columns of output sent to a pipe or a file, which has no width of its own: wide enough that
#: a job's row stays on one line for grep (Rich would fold it at 80).
PIPE_WIDTH: Final = 200

STATUS_STYLES: Final = {
    JobStatus.QUEUED: "",
    JobStatus.RUNNING: "cyan",
    JobStatus.SUCCEEDED: "green",
    JobStatus.FAILED: "bold red",
    JobStatus.CANCELED: "yellow",
    JobStatus.LOST: "red",
}


def jsonable(value: Any) -> Any:
    """`value` (dataclasses, datetimes, UUIDs, enums …) as plain JSON values."""
    return to_jsonable_python(value)


def print_json(document: Any) -> None:
    """`document` as one line of JSON on stdout, flushed (a reader may follow it live)."""
    sys.stdout.write(json.dumps(jsonable(document), ensure_ascii=False) + "\n")
    sys.stdout.flush()


def console() -> Console:
    """stdout as Rich writes to it (a pipe gets plain text, PIPE_WIDTH wide unless COLUMNS
    says otherwise)."""
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, width=PIPE_WIDTH if piped else None)


def cell(value: Any) -> Text:
    """A table cell. Never read as Rich markup: job errors, args and names may hold brackets."""
    if value is None:
        return Text("-", style="dim")
    if isinstance(value, bool):
        return Text("yes" if value else "no")
    if isinstance(value, datetime):
        return Text(when(value))
    if isinstance(value, dict | list):
        return Text(json.dumps(jsonable(value), ensure_ascii=False))
    return Text(str(value))


def when(moment: datetime) -> str:
    """An instant in the reader's local time, to the second."""
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float | None) -> str:
    """A length of time as a person reads it: 850ms, 12.5s, 4m 05s, 3h 20m, 7d 00h."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def status_text(status: JobStatus | str) -> Text:
    """A job's status, coloured after what it means."""
    return Text(str(status), style=STATUS_STYLES.get(JobStatus(status), ""))


def table(*columns: str, title: str | None = None) -> Table:
    """A table with these column headers, numbers right-aligned by the caller's choice."""
    grid = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        grid.add_column(column, overflow="fold")
    return grid


def job_details(job: JobState) -> Table:
    """One job, field by field (those it has: no started time for a job not run yet)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    rows: list[tuple[str, Any]] = [
        ("job", job.job_id),
        ("status", status_text(job.status)),
        ("task", job.task),
        ("queue", job.queue),
        ("lock key", job.lock_key),
        ("idempotency key", job.idempotency_key),
        ("priority", job.priority),
        ("attempt", f"{job.attempt} of {job.max_attempts}"),
        ("created", job.created_at),
        ("available", job.available_at),
        ("started", job.started_at),
        ("finished", job.finished_at),
        ("duration", None if job.duration_ms is None else duration(job.duration_ms / 1000)),
        ("worker", job.worker_id),
        ("progress", job.progress or None),
        ("checkpoint", job.checkpoint),
        ("error", job.error),
        ("result", job.result),
    ]
    if job.cancel_requested:
        rows.append(("cancel requested", True))
    if job.rerun_requested:
        rows.append(("re-run requested", True))
    for name, value in rows:
        if value is not None:
            grid.add_row(name, value if isinstance(value, Text) else cell(value))
    return grid
