"""Durable processes: `dataloader processes list | show | events | start | call | repair |
remove`, through `client.processes` as the HTTP API's routes go."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated, Any, Final

import typer
from rich.table import Table

from dataloader.cli.common import (
    CLI_ACTOR,
    ActorOption,
    ExitCode,
    JsonOption,
    checked_name,
    connected,
    operator_settings,
    run,
)
from dataloader.cli.output import Col, cell, console, print_json, table, when
from dataloader.config import Settings
from dataloader.core.processes import Event, Process, ProcessStatus, TaskKind
from dataloader.exceptions import InvalidJob, ProcessNotFound, ProcessTimeout
from dataloader.processes import DEFAULT_TIMEOUT_SEC, MAX_PAGE

processes_app = typer.Typer(
    name="processes",
    help="Durable processes: list, show, read their history, start, call, repair, remove.",
    no_args_is_help=True,
)

NamespaceArgument = Annotated[
    str, typer.Argument(metavar="NAMESPACE", callback=checked_name, help="The namespace.")
]
IdArgument = Annotated[str, typer.Argument(metavar="PROCESS_ID", help="The process's id.")]
ArgsOption = Annotated[
    str | None, typer.Option("--args", metavar="JSON", help="The task's args: a JSON object.")
]
TimeoutOption = Annotated[
    float,
    typer.Option("--timeout", min=0.001, help="Seconds to wait for the response (exit 5 after)."),
]
KeyOption = Annotated[
    str | None,
    typer.Option("--idempotency-key", help="A repeated call with the same key is the same task."),
]

#: The columns of `processes list`, the first left out first when the terminal is narrow.
LIST_COLUMNS: Final = (
    Col("namespace"),
    Col("process", whole=True),
    Col("status"),
    Col("events", justify="right", drop=3),
    Col("timer", drop=2),
    Col("detail", drop=1),
    Col("updated", drop=4),
)


@processes_app.command("list")
def list_processes(
    namespace: Annotated[
        str | None, typer.Option("--namespace", callback=checked_name, help="Only this one.")
    ] = None,
    status: Annotated[ProcessStatus | None, typer.Option("--status", help="Only these.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=MAX_PAGE)] = 100,
    cursor: Annotated[int | None, typer.Option("--cursor", min=1, help="The next page's.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Live processes, newest first (a namespace's, in a status, when given)."""
    run(_list(operator_settings(), namespace, status, limit, cursor, as_json))


async def _list(
    settings: Settings,
    namespace: str | None,
    status: ProcessStatus | None,
    limit: int,
    cursor: int | None,
    as_json: bool,
) -> int:
    async with connected(settings) as client:
        page = await client.processes.list(
            namespace=namespace, status=status, limit=limit, cursor=cursor
        )
    if as_json:
        print_json(
            {
                "processes": [process_document(p) for p in page.processes],
                "next_cursor": page.next_cursor,
            }
        )
        return ExitCode.OK
    out = console()
    if not page.processes:
        out.print("no process")
        return ExitCode.OK
    grid = table(*LIST_COLUMNS)
    for p in page.processes:
        timer = None if p.timer is None else f"{p.timer.kind.value} {when(p.timer.due_at)}"
        grid.add_row(
            cell(p.namespace),
            cell(p.process_id),
            cell(p.status.value),
            cell(p.last_event_id),
            cell(timer),
            cell(p.detail),
            cell(when(p.updated_at)),
        )
    out.print(grid)
    if page.next_cursor is not None:
        out.print(f"more: --cursor {page.next_cursor}")
    return ExitCode.OK


@processes_app.command("show")
def show(namespace: NamespaceArgument, process_id: IdArgument, as_json: JsonOption = False) -> None:
    """One process: its status, state, pending timer (exit 1 if there is none such)."""
    run(_show(operator_settings(), namespace, process_id, as_json))


async def _show(settings: Settings, namespace: str, process_id: str, as_json: bool) -> int:
    async with connected(settings) as client:
        process = await client.processes.get(namespace, process_id)
    if process is None:
        raise ProcessNotFound(namespace, process_id)
    if as_json:
        print_json(process_document(process))
    else:
        console().print(_details(process))
    return ExitCode.OK


@processes_app.command("events")
def events(
    namespace: NamespaceArgument,
    process_id: IdArgument,
    after: Annotated[int, typer.Option("--after", min=0, help="After this event's id.")] = 0,
    limit: Annotated[int, typer.Option("--limit", min=1, max=MAX_PAGE)] = 100,
    as_json: JsonOption = False,
) -> None:
    """A process's history, oldest first."""
    run(_events(operator_settings(), namespace, process_id, after, limit, as_json))


async def _events(
    settings: Settings, namespace: str, process_id: str, after: int, limit: int, as_json: bool
) -> int:
    async with connected(settings) as client:
        found = await client.processes.events(namespace, process_id, after=after, limit=limit)
    if as_json:
        print_json({"events": [event_document(e) for e in found]})
        return ExitCode.OK
    grid = table(Col("id", justify="right"), Col("at"), Col("payload", whole=True))
    for event in found:
        grid.add_row(cell(event.event_id), cell(when(event.ts)), cell(event.payload))
    console().print(grid)
    return ExitCode.OK


@processes_app.command("start")
def start(
    namespace: NamespaceArgument,
    process_id: IdArgument,
    args: ArgsOption = None,
    queue: Annotated[
        str | None, typer.Option("--queue", callback=checked_name, help="Its tasks' queue.")
    ] = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SEC,
    actor: ActorOption = CLI_ACTOR,
    as_json: JsonOption = False,
) -> None:
    """Start a process; prints its init's response."""
    run(_task(operator_settings(), actor, namespace, process_id, TaskKind.INIT, args, None,
              timeout, as_json, queue))  # fmt: skip


@processes_app.command("call")
def call(
    namespace: NamespaceArgument,
    process_id: IdArgument,
    args: ArgsOption = None,
    idempotency_key: KeyOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SEC,
    actor: ActorOption = CLI_ACTOR,
    as_json: JsonOption = False,
) -> None:
    """Call a process; prints its processor's response (exit 5 if none came in time)."""
    run(_task(operator_settings(), actor, namespace, process_id, TaskKind.CALL, args,
              idempotency_key, timeout, as_json))  # fmt: skip


@processes_app.command("repair")
def repair(
    namespace: NamespaceArgument,
    process_id: IdArgument,
    args: ArgsOption = None,
    idempotency_key: KeyOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SEC,
    actor: ActorOption = CLI_ACTOR,
    as_json: JsonOption = False,
) -> None:
    """Repair a process in error; prints its processor's response."""
    run(_task(operator_settings(), actor, namespace, process_id, TaskKind.REPAIR, args,
              idempotency_key, timeout, as_json))  # fmt: skip


@processes_app.command("remove")
def remove(
    namespace: NamespaceArgument,
    process_id: IdArgument,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SEC,
    actor: ActorOption = CLI_ACTOR,
    as_json: JsonOption = False,
) -> None:
    """Remove a process (after the task it runs); its id is free at once."""
    run(_task(operator_settings(), actor, namespace, process_id, TaskKind.REMOVE, None, None,
              timeout, as_json))  # fmt: skip


async def _task(
    settings: Settings,
    actor: str,
    namespace: str,
    process_id: str,
    kind: TaskKind,
    args: str | None,
    idempotency_key: str | None,
    timeout: float,
    as_json: bool,
    queue: str | None = None,
) -> int:
    value = _parsed(args)
    async with connected(settings, actor) as client:
        task_id = await client.processes.submit(
            namespace, process_id, kind, value, idempotency_key=idempotency_key, queue=queue
        )
        try:
            response = await client.processes.response(task_id, timeout)
        except ProcessTimeout as exc:
            if as_json:
                print_json({"task_id": task_id, "error": str(exc)})
            else:
                typer.echo(f"dataloader: {exc}", err=True)
            return ExitCode.STILL_RUNNING
    if as_json:
        print_json({"task_id": task_id, "response": response})
    else:
        typer.echo(json.dumps(response, ensure_ascii=False))
    return ExitCode.OK


def _parsed(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidJob("--args", f"not JSON: {exc}") from None


def process_document(process: Process) -> dict[str, Any]:
    """A process as `GET /api/v1/processes/{namespace}/{process_id}` gives it."""
    document = asdict(process)
    del document["history"]
    return document


def event_document(event: Event) -> dict[str, Any]:
    return asdict(event)


def _details(process: Process) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    timer = process.timer
    rows: list[tuple[str, Any]] = [
        ("process", process.process_id),
        ("namespace", process.namespace),
        ("queue", process.queue),
        ("status", process.status.value),
        ("detail", process.detail),
        ("corrupted by", process.corrupted_by),
        ("events", process.last_event_id),
        ("timer", None if timer is None else f"{timer.kind.value} at {when(timer.due_at)}"),
        ("created", process.created_at),
        ("updated", process.updated_at),
        ("metadata", dict(process.metadata) or None),
        ("state", process.aux_state),
    ]
    for name, value in rows:
        if value is not None:
            grid.add_row(name, cell(value))
    return grid
