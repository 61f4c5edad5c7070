"""`watch JOB_ID`: a job's progress as a live bar and its journal as it grows, until it ends.

The job's end is heard at once (`Client.wait` listens for it); its progress and journal,
which nothing announces, are read every POLL_SEC while it runs: a person is watching.
`enqueue --wait` follows the job it enqueued the same way."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import asdict
from typing import Any, Final, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from dataloader.base import JobStatus
from dataloader.cli.common import (
    ExitCode,
    HeartbeatsOption,
    JobIdArgument,
    JsonOption,
    connected,
    operator_settings,
    run,
)
from dataloader.cli.output import (
    bar_of,
    console,
    event_line,
    job_details,
    jsonable,
    print_json,
    progress_text,
    status_text,
)
from dataloader.client import Client
from dataloader.config import Settings
from dataloader.core.models import JobEvent, JobState
from dataloader.exceptions import JobNotFound

#: How often a running job's progress and journal are read.
POLL_SEC: Final = 0.5

#: Progress fields the bar itself shows (`ctx.iterate` writes done and total).
BAR_FIELDS: Final = frozenset({"done", "total", "percent"})


def watch(
    job_id: JobIdArgument,
    heartbeats: HeartbeatsOption = False,
    as_json: JsonOption = False,
) -> None:
    """Follow a job until it ends: a progress bar, its journal, then its final state.

    Its progress ({"done", "total"} or {"percent"}) shows as a bar, its journal entries as
    they come (heartbeats only with --heartbeats); printed to a pipe or a file, a plain line
    for each entry and each change of status or progress instead. Exit 0 if it succeeded, 4
    if it ended failed, canceled or lost.

    With --json, one JSON document per line: {"type": "event", …} for each journal entry,
    {"type": "progress", …} for each change of status or progress, and {"type": "state", …}
    last, the final state."""
    run(_watch(operator_settings(), job_id, heartbeats, as_json))


class View(Protocol):
    """Where a watched job is shown."""

    def event(self, event: JobEvent) -> None:
        """A new journal entry."""

    def state(self, job: JobState) -> None:
        """The job as read now (its status and progress may have changed)."""

    def end(self, job: JobState) -> None:
        """The job's final state."""

    def close(self) -> None:
        """The watch is over (also after an error)."""


async def _watch(settings: Settings, job_id: str, heartbeats: bool, as_json: bool) -> int:
    async with connected(settings) as client:
        job = await _read(client, job_id)
        final = await follow(client, job.job_id, view_for(as_json), heartbeats)
    return ExitCode.OK if final.status == JobStatus.SUCCEEDED else ExitCode.JOB_NOT_SUCCEEDED


def view_for(as_json: bool) -> View:
    """JSON lines with --json, a live bar on a terminal, plain lines on a pipe or a file."""
    if as_json:
        return JsonView()
    out = console()
    return LiveView(out) if out.is_terminal else PlainView(out)


async def follow(client: Client, job_id: uuid.UUID, view: View, heartbeats: bool) -> JobState:
    """Show the job in `view` until it ends; its final state (shown last)."""
    ended = asyncio.ensure_future(client.wait(job_id))
    try:
        await _follow(client, job_id, ended, heartbeats, view)
    finally:
        view.close()
        ended.cancel()  # when following failed: the wait is of no use any more
        await asyncio.gather(ended, return_exceptions=True)
    final = ended.result()
    view.end(final)
    return final


async def _follow(
    client: Client,
    job_id: uuid.UUID,
    ended: asyncio.Future[JobState],
    heartbeats: bool,
    view: View,
) -> None:
    """Show the job's journal and progress until `ended` is done, then read them once more:
    the entry of the end is written with the end itself, so that last read has it."""
    after = 0
    while True:
        over = ended.done()  # before reading: what is read after the end is complete
        for event in await client.events(job_id, after=after):
            after = event.event_id
            if heartbeats or event.kind != "heartbeat":
                view.event(event)
        view.state(await _read(client, str(job_id)))
        if over:
            return
        await asyncio.wait({ended}, timeout=POLL_SEC)


async def _read(client: Client, job_id: str) -> JobState:
    job = await client.get(job_id)
    if job is None:
        raise JobNotFound(f"job {job_id} not found")
    return job


class JsonView:
    """One JSON document per line, as things happen."""

    def __init__(self) -> None:
        self._shown: Any = None

    def event(self, event: JobEvent) -> None:
        print_json({"type": "event", **asdict(event)})

    def state(self, job: JobState) -> None:
        now = {
            "type": "progress",
            "job_id": job.job_id,
            "status": job.status,
            "attempt": job.attempt,
            "progress": job.progress,
        }
        shown = jsonable(now)
        if shown != self._shown:
            print_json(shown)
            self._shown = shown

    def end(self, job: JobState) -> None:
        print_json({"type": "state", **asdict(job)})

    def close(self) -> None:
        pass


class LiveView:
    """A Rich progress bar, journal entries printed above it, the final state below."""

    def __init__(self, out: Console) -> None:
        self._console = out
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[detail]}", markup=False),  # the task's own words
            console=out,
        )
        self._bar = self._progress.add_task("", total=None, detail="")
        self._progress.start()

    def event(self, event: JobEvent) -> None:
        self._progress.console.print(event_line(event))

    def state(self, job: JobState) -> None:
        description = Text(f"{job.task} ").append_text(status_text(job.status))
        detail = " ".join(
            f"{name}={value}" for name, value in job.progress.items() if name not in BAR_FIELDS
        )
        self._progress.update(self._bar, description=description.markup, detail=detail)
        total, done = bar_of(job.progress)
        if total is not None:  # else the bar stays as it was (or pulses, before any number)
            self._progress.update(self._bar, total=total, completed=done)

    def end(self, job: JobState) -> None:
        self._console.print(job_details(job))

    def close(self) -> None:
        self._progress.stop()


class PlainView:
    """Plain lines for a pipe or a file (a bar would only draw control characters there):
    each journal entry, each change of status or progress, then the final state."""

    def __init__(self, out: Console) -> None:
        self._console = out
        self._shown: Text | None = None

    def event(self, event: JobEvent) -> None:
        self._console.print(event_line(event))

    def state(self, job: JobState) -> None:
        line = Text(f"{job.task} ").append_text(status_text(job.status))
        progress = progress_text(job.progress)
        if progress is not None:
            line.append(f" {progress}")
        if line != self._shown:
            self._console.print(line)
            self._shown = line

    def end(self, job: JobState) -> None:
        self._console.print(job_details(job))

    def close(self) -> None:
        pass
