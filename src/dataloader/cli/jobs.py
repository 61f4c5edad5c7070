"""Jobs: `enqueue`, `jobs` (the list), `show`, and `cancel` and `retry` of one job or of the
jobs a filter matches, through `dataloader.Client` (the same rules as the library and the HTTP
API). `watch` is in `watch.py`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Annotated, Any, Final

import typer
from rich.text import Text

from dataloader.base import JobStatus
from dataloader.cli.common import (
    CLI_ACTOR,
    ActorOption,
    ExitCode,
    HeartbeatsOption,
    JobIdArgument,
    JsonOption,
    acting,
    connected,
    fail,
    import_pipelines,
    inspected,
    operator_settings,
    run,
    seconds,
)
from dataloader.cli.output import (
    Col,
    cell,
    console,
    due,
    event_line,
    job_details,
    print_json,
    progress_text,
    status_text,
    table,
)
from dataloader.cli.watch import follow, view_for
from dataloader.client import MAX_BULK, Client
from dataloader.config import Settings
from dataloader.core.limits import ARGS_MAX_DEPTH
from dataloader.core.models import EnqueueResult, JobState
from dataloader.core.routing import check_route
from dataloader.exceptions import ConfigError, InvalidJob, JobNotFound
from dataloader.storage.repositories import BulkResult, JobPage
from dataloader.tasks import registry as default_registry


def enqueue(
    task: Annotated[str, typer.Argument(metavar="TASK", help="The task's name, e.g. demo.sleep.")],
    lock_key: Annotated[
        str | None,
        typer.Option(
            help="Jobs sharing a lock key never run at the same time (default: none; the job"
            " excludes no other)."
        ),
    ] = None,
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
        float | None,
        typer.Option(metavar="SEC", callback=seconds, help="Start no earlier than this."),
    ] = None,
    max_attempts: Annotated[int | None, typer.Option(help="Attempts before it fails.")] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the job to end and print its final state.")
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            metavar="SEC", callback=seconds, help="With --wait: give up after this long (exit 5)."
        ),
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
    it); a TASK nobody knows on a queue nobody serves waits for its workers. With --wait: the
    job's progress as it runs (a bar on a terminal, a line per change on a pipe; with --json
    only the final state), its final state, and exit 4 if it ended failed, canceled or lost
    (5 if --timeout ran out first)."""
    settings = operator_settings()
    try:
        import_pipelines(settings.pipeline_modules)
    except ConfigError as exc:
        fail(f"invalid configuration: {exc}", ExitCode.USAGE)
    try:
        parsed = _json_object(args)
    except InvalidJob as exc:
        fail(str(exc), ExitCode.USAGE)
    job = {
        "task": task,
        "args": parsed,
        "lock_key": lock_key,
        "queue": queue,
        "idempotency_key": idempotency_key,
        "partition_key": partition_key,
        "priority": priority,
        "available_at": None if delay is None else timedelta(seconds=delay),
        "max_attempts": max_attempts,
    }
    run(_enqueue(settings, actor, job, wait, timeout, as_json))


async def _enqueue(
    settings: Settings,
    actor: str,
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
        async with inspected(settings) as (client, _):
            known = default_registry.known(await client.known_tasks())
        check_route(job["task"], job["queue"], known, allow_unknown=settings.allow_unknown_tasks)
    async with connected(settings, actor, default_registry) as client:
        enqueued = await client.enqueue(**job)
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
    except RecursionError:  # the parser's own limit, far beyond the one args have
        raise InvalidJob("--args", f"nested deeper than {ARGS_MAX_DEPTH} levels") from None
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
    """Wait for the job to end, showing its progress (not with --json), then its final
    state; the command's exit code."""
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            if as_json:
                state = await client.wait(job.job_id)
                print_json(state)
            else:
                state = await follow(client, job.job_id, view_for(as_json), heartbeats=False)
    except TimeoutError:
        if not deadline.expired():  # a statement's timeout: the database is not answering
            raise
        now = await client.get(job.job_id)
        if now is not None:
            show_job(now, as_json)
        fail(f"job {job.job_id} has not ended within {timeout:g}s", ExitCode.STILL_RUNNING)
    return ExitCode.OK if state.status == JobStatus.SUCCEEDED else ExitCode.JOB_NOT_SUCCEEDED


QueueFilter = Annotated[str | None, typer.Option(help="Only this queue's jobs.")]
StatusFilter = Annotated[JobStatus | None, typer.Option(help="Only jobs in this status.")]
TaskFilter = Annotated[str | None, typer.Option(help="Only this task's jobs.")]
LockKeyFilter = Annotated[str | None, typer.Option(help="Only jobs of this lock key.")]
PartitionKeyFilter = Annotated[str | None, typer.Option(help="Only jobs of this partition key.")]
ArgsFilter = Annotated[
    str | None,
    typer.Option(
        "--args",
        help='Only jobs whose args contain this JSON object, e.g. \'{"day": "2026-01-01"}\'.',
    ),
]


def jobs(
    queue: QueueFilter = None,
    status: StatusFilter = None,
    task: TaskFilter = None,
    lock_key: LockKeyFilter = None,
    partition_key: PartitionKeyFilter = None,
    args: ArgsFilter = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Jobs at most.")] = 50,
    cursor: Annotated[
        str | None, typer.Option(help="The next page: the cursor the page before printed.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """List jobs, newest first, and the cursor of the next page.

    The table fits the terminal: job ids stay whole on one line (to copy), other cells are
    cut short, and on a narrow terminal the columns of least use are left out (created,
    lock key, attempt, due, progress, error: in that order). `show JOB_ID` shows a job
    whole; --json gives every field."""
    filters = {
        "queue": queue,
        "status": status,
        "task": task,
        "lock_key": lock_key,
        "partition_key": partition_key,
        "args": args,
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


#: The columns of the list, the first left out first when the terminal is narrow (a rank of
#: 0: never).
JOB_COLUMNS: Final = (
    Col("job", whole=True),
    Col("status"),
    Col("task", drop=1),
    Col("queue", drop=2),
    Col("error", drop=3),
    Col("progress", drop=4),
    Col("due", drop=5),
    Col("attempt", drop=6, justify="right"),
    Col("lock key", drop=7),
    Col("created", drop=8),
)


def _show_page(page: JobPage) -> None:
    out = console()
    if not page.jobs:
        out.print("no jobs")
    else:
        grid = table(*JOB_COLUMNS)
        for job in page.jobs:
            grid.add_row(
                cell(job.job_id),
                status_text(job.status),
                cell(job.task),
                cell(job.queue),
                cell(None if job.error is None else job.error.strip().split("\n")[-1]),
                cell(progress_text(job.progress)),
                cell(due(job)),
                cell(f"{job.attempt}/{job.max_attempts}"),
                cell(job.lock_key),
                cell(job.created_at),
            )
        out.print(grid)
    if page.next_cursor is not None:
        out.print(Text(f"next page: --cursor {page.next_cursor}"))


def show(
    job_id: JobIdArgument,
    heartbeats: HeartbeatsOption = False,
    as_json: JsonOption = False,
) -> None:
    """Show a job whole: every field, its result or its error (in full), and its journal.

    With --json: {"job": {…every field…}, "events": [{…each journal entry…}]}. Heartbeat
    entries are left out of the journal unless --heartbeats. Exit 1 if there is no such
    job."""
    run(_show(operator_settings(), job_id, heartbeats, as_json))


async def _show(settings: Settings, job_id: str, heartbeats: bool, as_json: bool) -> int:
    async with connected(settings) as client:
        job = await client.get(job_id)
        if job is None:
            raise JobNotFound(f"job {job_id} not found")
        events = [e for e in await client.events(job.job_id) if heartbeats or e.kind != "heartbeat"]
    if as_json:
        print_json({"job": job, "events": events})
        return ExitCode.OK
    out = console()
    out.print(job_details(job))
    out.print(Text("journal", style="bold"))
    for event in events:
        out.print(event_line(event))
    return ExitCode.OK


def show_job(job: JobState, as_json: bool) -> None:
    """A job's state: its JSON document, or its fields one per line."""
    if as_json:
        print_json(job)
    else:
        console().print(job_details(job))


OptionalJobId = Annotated[
    str | None,
    typer.Argument(metavar="[JOB_ID]", help="The job's id; or, instead, filters of the jobs."),
]
BulkLimit = Annotated[
    int | None,
    typer.Option(
        min=1, max=MAX_BULK, help="With filters: the jobs looked at, at most (default 1000)."
    ),
]


def _job_change(
    name: str,
    done: str,
    one: Callable[[Client, str], Awaitable[JobState]],
    many: Callable[..., Awaitable[BulkResult]],
    doc: str,
) -> Callable[..., None]:
    """The command `name` (cancel, retry): `one` makes the change to the job a JOB_ID names,
    `many` to the jobs that filters match (`done`: what it did to each, for the summary)."""

    def command(
        job_id: OptionalJobId = None,
        queue: QueueFilter = None,
        status: StatusFilter = None,
        task: TaskFilter = None,
        lock_key: LockKeyFilter = None,
        partition_key: PartitionKeyFilter = None,
        args: ArgsFilter = None,
        limit: BulkLimit = None,
        actor: ActorOption = CLI_ACTOR,
        as_json: JsonOption = False,
    ) -> None:
        filters = _bulk_filters(job_id, queue, status, task, lock_key, partition_key, args, limit)
        settings = operator_settings()
        if job_id is not None:
            run(_change(settings, actor, lambda client: one(client, job_id), as_json))
        run(_bulk(settings, actor, done, lambda client: many(client, **filters), as_json))

    command.__name__ = command.__qualname__ = name
    command.__doc__ = doc
    return command


cancel = _job_change(
    "cancel",
    "canceled",
    Client.cancel,
    Client.cancel_many,
    """Cancel a job and print its state after; or, with filters instead of a JOB_ID, the
    jobs that match them all.

    A queued job ends canceled now; a running one is asked to stop (its task stops at its
    next check); a finished one is left as it is. The journal names the actor (`cli`, or
    --as). With filters (at least one: a cancel of every job is not offered), newest first,
    --limit at most, as `POST /api/v1/jobs/cancel`: prints the jobs matched, those changed,
    and whether more match (run it again to go on).""",
)

retry = _job_change(
    "retry",
    "retried",
    Client.retry,
    Client.retry_many,
    """Send a failed, lost or canceled job back to its queue, and print its state after; or,
    with filters instead of a JOB_ID, those among the jobs that match them all.

    The job gets a fresh budget of attempts and resumes from its checkpoint; the journal names
    the actor (`cli`, or --as). A job in another state cannot be retried: exit 1. With
    filters (at least one), newest first, --limit at most, as `POST /api/v1/jobs/retry`: the
    jobs in other states are skipped; prints the jobs matched, those retried, and whether
    more match (run it again to go on).""",
)


def _bulk_filters(
    job_id: str | None,
    queue: str | None,
    status: JobStatus | None,
    task: str | None,
    lock_key: str | None,
    partition_key: str | None,
    args: str | None,
    limit: int | None,
) -> dict[str, Any]:
    """The filters of a change by filter (with its limit, if given); ends the command (exit
    2) unless exactly one of a job id and filters is given."""
    filters = {
        name: value
        for name, value in (
            ("queue", queue),
            ("status", status),
            ("task", task),
            ("lock_key", lock_key),
            ("partition_key", partition_key),
            ("args", args),
        )
        if value is not None
    }
    if job_id is not None and (filters or limit is not None):
        fail("give a JOB_ID or filters, not both", ExitCode.USAGE)
    if job_id is None and not filters:
        fail(
            "give a JOB_ID, or at least one filter (--queue, --status, --task, --lock-key,"
            " --partition-key, --args): a change of every job is not offered",
            ExitCode.USAGE,
        )
    return filters if limit is None else {**filters, "limit": limit}


async def _change(
    settings: Settings,
    actor: str,
    change: Callable[[Client], Awaitable[JobState]],
    as_json: bool,
) -> int:
    """Make `change` (a cancel, a retry) as `actor` and show the job's state after."""
    show_job(await acting(settings, actor, change), as_json)
    return ExitCode.OK


async def _bulk(
    settings: Settings,
    actor: str,
    done: str,
    change: Callable[[Client], Awaitable[BulkResult]],
    as_json: bool,
) -> int:
    """Make `change` (a cancel or retry by filter) as `actor` and show what it did."""
    result = await acting(settings, actor, change)
    if as_json:
        print_json(result)
        return ExitCode.OK
    more = "; more jobs match: run it again to go on" if result.more else ""
    console().print(Text(f"{result.matched} jobs matched, {len(result.changed)} {done}{more}"))
    return ExitCode.OK
