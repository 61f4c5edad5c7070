"""Jobs: `enqueue`, `jobs` (the list), `cancel` and `retry`, through `dataloader.Client` (the
same rules as the library and the HTTP API). `watch` is in `watch.py`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Annotated, Any

import typer
from rich.text import Text

from dataloader.base import JobStatus
from dataloader.cli.common import (
    CLI_ACTOR,
    ActorOption,
    ExitCode,
    JsonOption,
    acting,
    connected,
    fail,
    import_pipelines,
    inspected,
    operator_settings,
    run,
)
from dataloader.cli.output import (
    cell,
    console,
    job_details,
    print_json,
    status_text,
    table,
)
from dataloader.client import Client
from dataloader.config import Settings
from dataloader.core.models import EnqueueResult, JobState
from dataloader.core.routing import check_route
from dataloader.exceptions import ConfigError, InvalidJob
from dataloader.storage.presence import PresenceStore
from dataloader.storage.repositories import JobPage
from dataloader.workers.pipelines.registry import registry as default_registry

JobIdArgument = Annotated[str, typer.Argument(metavar="JOB_ID", help="The job's id.")]


def enqueue(
    task: Annotated[str, typer.Argument(metavar="TASK", help="The task's name, e.g. demo.sleep.")],
    lock_key: Annotated[
        str, typer.Option(help="Jobs sharing a lock key never run at the same time.")
    ],
    queue: Annotated[
        str | None, typer.Option(help="The queue (default: the task's own, if it names one).")
    ] = None,
    args: Annotated[
        str | None, typer.Option("--args", metavar="JSON", help="The task's args: a JSON object.")
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Enqueueing again under this key returns the same job.")
    ] = None,
    partition_key: Annotated[str, typer.Option(help="A key to find the job by later.")] = "",
    priority: Annotated[int | None, typer.Option(help="Lower runs first (default 100).")] = None,
    delay: Annotated[
        float | None, typer.Option(min=0, metavar="SEC", help="Start no earlier than this.")
    ] = None,
    max_attempts: Annotated[int | None, typer.Option(help="Attempts before it fails.")] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the job to end and print its final state.")
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option(min=0, metavar="SEC", help="With --wait: give up after this long (exit 5)."),
    ] = None,
    actor: ActorOption = CLI_ACTOR,
    as_json: JsonOption = False,
) -> None:
    """Enqueue a job of TASK and print its id and status.

    Options left out come from the task's definition when DL_PIPELINE_MODULES registers it
    (its queue, priority, attempts; its args are checked against its model), then from the
    settings. Refused, as over HTTP: a queue other than the one the task's definition names,
    and a TASK that neither DL_PIPELINE_MODULES registers nor any live process knows while
    live processes serve the queue (they would fail it; DL_ALLOW_UNKNOWN_TASKS=true accepts
    it); a TASK nobody knows on a queue nobody serves waits for its workers. With --wait: the job's
    final state, and exit 4 if it ended failed, canceled or lost (5 if --timeout ran out
    first)."""
    settings = operator_settings()
    try:
        import_pipelines(settings.pipeline_modules)
    except ConfigError as exc:
        fail(f"invalid configuration: {exc}", ExitCode.USAGE)
    job = {
        "task": task,
        "lock_key": lock_key,
        "queue": queue,
        "idempotency_key": idempotency_key,
        "partition_key": partition_key,
        "priority": priority,
        "available_at": None if delay is None else timedelta(seconds=delay),
        "max_attempts": max_attempts,
    }
    run(_enqueue(settings, actor, args, job, wait, timeout, as_json))


async def _enqueue(
    settings: Settings,
    actor: str,
    args: str | None,
    job: dict[str, Any],
    wait: bool,
    timeout: float | None,
    as_json: bool,
) -> int:
    """Enqueue `job` (`Client.enqueue`'s arguments) with `args` (the JSON text given), and
    with `wait` wait for its end; the command's exit code."""
    if default_registry.get(job["task"]) is None and job["queue"] is not None:
        # a task defined here is checked by the client; one that is not, against the live
        # processes (closed before a --wait that may be long)
        async with inspected(settings) as (_, pool):
            known = default_registry.known(await PresenceStore(pool).known_tasks())
        check_route(job["task"], job["queue"], known, allow_unknown=settings.allow_unknown_tasks)
    async with connected(settings, actor, default_registry) as client:
        enqueued = await client.enqueue(args=_json_object(args), **job)
        if not (wait and as_json):  # with --json only the final state is shown
            _show_enqueued(enqueued, as_json)
        if not wait:
            return ExitCode.OK
        return await _wait_for(client, enqueued, timeout, as_json)


def _json_object(text: str | None) -> dict[str, Any]:
    """`--args` as the JSON object it must be (InvalidJob otherwise)."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidJob("--args", f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidJob("--args", f"must be a JSON object, not {type(value).__name__}")
    return value


def _show_enqueued(job: EnqueueResult, as_json: bool) -> None:
    if as_json:
        print_json(job)
        return
    found = "" if job.created else " (already enqueued under this idempotency key)"
    console().print(f"job {job.job_id} ", status_text(job.status), found, sep="")


async def _wait_for(
    client: Client, job: EnqueueResult, timeout: float | None, as_json: bool
) -> int:
    """Wait for the job to end and show its final state; the command's exit code."""
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            state = await client.wait(job.job_id)
    except TimeoutError:
        if not deadline.expired():  # a statement's timeout: the database is not answering
            raise
        now = await client.get(job.job_id)
        if now is not None:
            show_job(now, as_json)
        fail(f"job {job.job_id} has not ended within {timeout:g}s", ExitCode.STILL_RUNNING)
    show_job(state, as_json)
    return ExitCode.OK if state.status == JobStatus.SUCCEEDED else ExitCode.JOB_NOT_SUCCEEDED


def show_job(job: JobState, as_json: bool) -> None:
    """A job's state: its JSON document, or its fields one per line."""
    if as_json:
        print_json(job)
    else:
        console().print(job_details(job))


def jobs(
    queue: Annotated[str | None, typer.Option(help="Only this queue's jobs.")] = None,
    status: Annotated[JobStatus | None, typer.Option(help="Only jobs in this status.")] = None,
    task: Annotated[str | None, typer.Option(help="Only this task's jobs.")] = None,
    lock_key: Annotated[str | None, typer.Option(help="Only jobs of this lock key.")] = None,
    partition_key: Annotated[
        str | None, typer.Option(help="Only jobs of this partition key.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Jobs at most.")] = 50,
    cursor: Annotated[
        str | None, typer.Option(help="The next page: the cursor the page before printed.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """List jobs, newest first, and the cursor of the next page."""
    filters = {
        "queue": queue,
        "status": status,
        "task": task,
        "lock_key": lock_key,
        "partition_key": partition_key,
    }
    run(_jobs(operator_settings(), filters, limit, cursor, as_json))


async def _jobs(
    settings: Settings, filters: dict[str, Any], limit: int, cursor: str | None, as_json: bool
) -> int:
    async with connected(settings) as client:
        page = await client.list(**filters, limit=limit, cursor=cursor)
    if as_json:
        print_json({"jobs": page.jobs, "next_cursor": page.next_cursor})
    else:
        _show_page(page)
    return ExitCode.OK


#: The longest error shown in a row of the list (`dataloader cancel`/`watch` show it whole).
ERROR_WIDTH = 60


def _show_page(page: JobPage) -> None:
    out = console()
    if not page.jobs:
        out.print("no jobs")
    else:
        grid = table("job", "status", "task", "queue", "lock key", "attempt", "created", "error")
        for job in page.jobs:
            error = None if job.error is None else _shortened(job.error, ERROR_WIDTH)
            grid.add_row(
                cell(job.job_id),
                status_text(job.status),
                cell(job.task),
                cell(job.queue),
                cell(job.lock_key),
                cell(f"{job.attempt}/{job.max_attempts}"),
                cell(job.created_at),
                cell(error),
            )
        out.print(grid)
    if page.next_cursor is not None:
        out.print(Text(f"next page: --cursor {page.next_cursor}"))


def _shortened(text: str, width: int) -> str:
    """The first line of `text`, at most `width` characters."""
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def cancel(
    job_id: JobIdArgument, actor: ActorOption = CLI_ACTOR, as_json: JsonOption = False
) -> None:
    """Cancel a job and print its state after.

    A queued job ends canceled now; a running one is asked to stop (its task stops at its
    next check); a finished one is left as it is. The journal names the actor (`cli`, or
    --as)."""
    run(_change(operator_settings(), actor, lambda client: client.cancel(job_id), as_json))


def retry(
    job_id: JobIdArgument, actor: ActorOption = CLI_ACTOR, as_json: JsonOption = False
) -> None:
    """Send a failed, lost or canceled job back to its queue, and print its state after.

    The job gets a fresh budget of attempts and resumes from its checkpoint; the journal names
    the actor (`cli`, or --as). A job in another state cannot be retried: exit 1."""
    run(_change(operator_settings(), actor, lambda client: client.retry(job_id), as_json))


async def _change(
    settings: Settings,
    actor: str,
    change: Callable[[Client], Awaitable[JobState]],
    as_json: bool,
) -> int:
    """Make `change` (a cancel, a retry) as `actor` and show the job's state after."""
    show_job(await acting(settings, actor, change), as_json)
    return ExitCode.OK
