"""How the operators' commands print: with `--json` one JSON document on stdout (dates in ISO
8601, ids and statuses as strings), otherwise Rich tables and lines."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from pydantic_core import to_jsonable_python
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, JustifyMethod, RenderResult
from rich.table import Table
from rich.text import Text

from dataloader.base import JobStatus
from dataloader.core.models import JobEvent, JobState

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


def due(job: JobState) -> str | None:
    """When a queued job may start, from now: "now" once it is due; None for a job not
    queued."""
    if job.status != JobStatus.QUEUED:
        return None
    ahead = (job.available_at - datetime.now(UTC)).total_seconds()
    return f"in {duration(ahead)}" if ahead >= 1 else "now"


def progress_text(progress: dict[str, Any]) -> str | None:
    """A job's progress in a few characters: "3/10 30%", "42%", or its fields as JSON; None
    when it has none."""
    if not progress:
        return None
    total, done = bar_of(progress)
    if total is None:
        return json.dumps(jsonable(progress), ensure_ascii=False)
    share = f"{100 * done / total:.0f}%"
    if "done" in progress and "total" in progress:
        return f"{done:g}/{total:g} {share}"
    return share


def bar_of(progress: dict[str, Any]) -> tuple[float | None, float]:
    """(total, completed) of a job's progress: {"done": n, "total": m} or {"percent": x};
    (None, 0) when it says neither."""
    done, total = _number(progress.get("done")), _number(progress.get("total"))
    if done is not None and total is not None and total > 0:
        return total, done
    percent = _number(progress.get("percent"))
    if percent is not None:
        return 100.0, percent
    return None, 0.0


def _number(value: Any) -> float | None:
    """`value` if it is a number (JSON's true and false are not), else None."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def event_line(event: JobEvent) -> Text:
    """A journal entry on one line: its time, its kind, its payload's fields."""
    line = Text(event.ts.astimezone().strftime("%H:%M:%S "), style="dim")
    line.append(event.kind, style="bold")
    for name, value in (event.payload or {}).items():
        line.append(f" {name}={value}")
    return line


def status_text(status: JobStatus | str) -> Text:
    """A job's status, coloured after what it means."""
    return Text(str(status), style=STATUS_STYLES.get(JobStatus(status), ""))


@dataclass(frozen=True, slots=True)
class Col:
    """A column of a table that fits its terminal."""

    header: str
    #: When the terminal is narrow, columns go by this rank, the highest first; 0: never.
    drop: int = 0
    #: An identifier (a job id, a queue's name): always whole, on one line, to be copied.
    whole: bool = False
    justify: JustifyMethod = "left"


#: A cell this long (a task's or a queue's name, a time) is shown whole before a column of
#: lower rank is; a longer one (an error) may be cut short to it.
WHOLE_CELL: Final = 24


class FittedTable:
    """A table that fits the width it is printed in: identifiers whole on one line, headers
    unsplit, the columns of highest `drop` left out until the others' cells are whole (or,
    if longer than WHOLE_CELL, cut short to it with "…"). Rows are added as to a Rich
    table."""

    def __init__(self, *columns: Col | str, title: str | None = None) -> None:
        self.columns = [Col(c) if isinstance(c, str) else c for c in columns]
        self.title = title
        self.rows: list[list[Text]] = []

    def add_row(self, *cells: Text) -> None:
        self.rows.append(list(cells))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.fitted(options.max_width)

    def fitted(self, width: int) -> Table:
        """The Rich table of these rows, `width` columns wide at most (unless its identifiers
        and headers alone are wider)."""
        natural = [
            max([cell_len(col.header), *(row[i].cell_len for row in self.rows)])
            for i, col in enumerate(self.columns)
        ]
        header = [cell_len(col.header) for col in self.columns]
        wanted = [
            n if col.whole else min(n, max(header[i], WHOLE_CELL))
            for i, (col, n) in enumerate(zip(self.columns, natural, strict=True))
        ]
        by_rank = sorted(range(len(self.columns)), key=lambda i: (self.columns[i].drop, i))
        kept = list(by_rank)
        while sum(wanted[i] for i in kept) > width - _frame(len(kept)):
            if self.columns[kept[-1]].drop == 0:
                break
            kept.pop()
        widths = {i: wanted[i] for i in kept}
        room = width - _frame(len(kept)) - sum(widths.values())
        for i in kept if room > 0 else reversed(kept):
            # room left: to the columns in order of rank, each up to its whole cells; too
            # little: taken from the columns of least rank, each down to its header
            change = natural[i] - widths[i] if room > 0 else header[i] - widths[i]
            if self.columns[i].whole:
                change = 0
            change = min(change, room) if room > 0 else max(change, room)
            widths[i] += change
            room -= change
        grid = Table(title=self.title, title_justify="left", header_style="bold")
        for i in sorted(kept):
            col = self.columns[i]
            grid.add_column(
                col.header,
                justify=col.justify,
                width=widths[i],
                no_wrap=True,
                overflow="fold" if col.whole else "ellipsis",
            )
        for row in self.rows:
            grid.add_row(*(row[i] for i in sorted(kept)))
        return grid


def _frame(columns: int) -> int:
    """Characters a table's borders and padding take beside its cells."""
    return 3 * columns + 1


def table(*columns: Col | str, title: str | None = None) -> FittedTable:
    """A table with these columns (a name alone: a column never left out) that fits the
    terminal it is printed in."""
    return FittedTable(*columns, title=title)


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
