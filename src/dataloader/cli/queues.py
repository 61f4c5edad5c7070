"""Queues: `queues` (what each holds and how fast it runs), `pause`, `resume` and `limits`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Annotated, Any, Final

import typer
from rich.text import Text

from dataloader.cli.common import (
    CLI_ACTOR,
    ActorOption,
    ExitCode,
    JsonOption,
    acting,
    checked_name,
    connected,
    fail,
    operator_settings,
    run,
)
from dataloader.cli.output import Col, cell, console, duration, print_json, table, when
from dataloader.client import Client
from dataloader.config import Settings
from dataloader.core.models import QueueStats
from dataloader.core.queues import QueueLimits, QueueSettings

#: Queues a refusal of an unknown queue names, at most.
SHOWN_QUEUES: Final = 20

QueueArgument = Annotated[
    str, typer.Argument(metavar="QUEUE", callback=checked_name, help="The queue's name.")
]


def queues(
    queue: Annotated[
        str | None, typer.Argument(metavar="[QUEUE]", help="Only this queue (zeros if empty).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """What each queue holds, whether it is paused, who serves it and how fast it runs.

    Per queue: its jobs ready, waiting for their lock key, delayed and running, its failed
    and lost jobs, the age of its oldest due job, whether it is paused (and by whom), the
    live processes serving it and their slots, and the jobs it ended per minute over the
    last 1, 5 and 60 minutes. Every queue with jobs queued, running, failed or lost, paused,
    served or busy in the last hour."""
    run(_queues(operator_settings(), queue, as_json))


async def _queues(settings: Settings, queue: str | None, as_json: bool) -> int:
    async with connected(settings) as client:
        stats = await client.stats(queue)
    if as_json:
        print_json({"queues": [queue_document(s) for s in stats.values()]})
    else:
        _show_queues(list(stats.values()))
    return ExitCode.OK


def queue_document(stats: QueueStats) -> dict[str, Any]:
    """A queue's statistics as `GET /api/v1/queues` gives them (with the total, and each
    window's jobs per minute)."""
    document = asdict(stats)
    document["total"] = stats.total
    document["throughput"] = [{**asdict(t), "per_minute": t.per_minute} for t in stats.throughput]
    return document


def _count(header: str, drop: int = 0) -> Col:
    return Col(header, drop=drop, justify="right")


#: The columns of `queues`, the first left out first when the terminal is narrow (a rank of
#: 0: never). Each header is one line: 80 columns hold the queue and its counts.
QUEUE_COLUMNS: Final = (
    Col("queue", whole=True),
    _count("ready"),
    _count("waiting", 5),
    _count("delayed", 4),
    _count("running"),
    _count("failed", 2),
    _count("lost", 3),
    _count("oldest due", 6),
    Col("paused", drop=1),
    _count("workers", 7),
    _count("slots", 8),
    _count("/min 1m", 9),
    _count("/min 5m", 11),
    _count("/min 60m", 10),
)


def _show_queues(stats: list[QueueStats]) -> None:
    out = console()
    if not stats:
        out.print("no queue holds jobs, is paused, served or was busy in the last hour")
        return
    grid = table(*QUEUE_COLUMNS)
    for s in stats:
        per_minute = [f"{t.per_minute:.1f}" for t in s.throughput]
        grid.add_row(
            cell(s.queue),
            *(cell(n) for n in (s.ready, s.waiting, s.delayed, s.running, s.failed, s.lost)),
            cell(duration(s.oldest_ready_age_sec)),
            _paused(s.paused, s.paused_by),
            cell(s.workers),
            cell(s.slots),
            *(cell(rate) for rate in per_minute),
        )
    out.print(grid)


def _paused(paused: bool, by: str | None) -> Text:
    if not paused:
        return Text("no")
    return Text(f"by {by}" if by else "yes", style="yellow")


def pause(
    queue: QueueArgument,
    create: Annotated[
        bool,
        typer.Option("--create", help="Pause a queue nothing knows yet, ahead of its first job."),
    ] = False,
    actor: ActorOption = CLI_ACTOR,
    as_json: JsonOption = False,
) -> None:
    """Pause a queue: no worker of any process claims its jobs until it is resumed.

    Running jobs finish, and jobs are still enqueued. Recorded in the queue's audit log with
    the actor (`cli`, or --as). Prints the queue's settings after. A queue nothing knows (no
    job, no live process serving it, no limit, no audit entry) is refused as a likely typo
    (exit 2): --create pauses it all the same, ahead of its first job."""

    async def known_first(client: Client) -> QueueSettings:
        if not create:
            await _check_known(client, queue)
        return await client.pause(queue)

    run(_steer(operator_settings(), actor, known_first, as_json))


async def _check_known(client: Client, queue: str) -> None:
    """ValueError unless something knows `queue`: a job of it (in any state), a live process
    serving it, a setting (paused, limits) or an entry of its audit log. A pause of a name
    nothing knows would stop nothing, silently: most likely a typo. Read on the primary: a
    queue whose first job was just enqueued is known."""
    client = client.exact()
    stats = (await client.stats(queue))[queue]
    if (
        stats.total
        or stats.failed
        or stats.lost
        or stats.workers
        or stats.paused
        or stats.limits != QueueLimits()
        or (await client.list(queue=queue, limit=1)).jobs
        or await client.queue_events(queue, limit=1)
    ):
        return
    in_use = sorted(await client.stats())
    shown = f"queues in use: {', '.join(in_use[:SHOWN_QUEUES])}" if in_use else "no queue is in use"
    raise ValueError(
        f"queue {queue!r} is unknown: no job, live process, limit or audit entry names it"
        f" ({shown}); pass --create to pause it ahead of its first job"
    )


def resume(
    queue: QueueArgument, actor: ActorOption = CLI_ACTOR, as_json: JsonOption = False
) -> None:
    """Resume a paused queue: its workers are woken and claim again.

    Recorded in the queue's audit log with the actor (`cli`, or --as). Prints the queue's
    settings after."""
    run(_steer(operator_settings(), actor, lambda client: client.resume(queue), as_json))


def limits(
    queue: QueueArgument,
    max_running: Annotated[
        int | None, typer.Option(min=1, help="Jobs of the queue running at once.")
    ] = None,
    max_running_per_partition: Annotated[
        int | None, typer.Option(min=1, help="Jobs of one partition_key running at once.")
    ] = None,
    max_per_second: Annotated[
        float | None, typer.Option(min=0.001, help="Jobs started per second.")
    ] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove every limit.")] = False,
    actor: ActorOption = CLI_ACTOR,
    as_json: JsonOption = False,
) -> None:
    """Set a queue's limits, held across every replica (a limit not given is removed), or
    remove them all with --clear.

    Recorded in the queue's audit log with the actor (`cli`, or --as). Prints the queue's
    settings after. `dataloader queues` shows the limits set."""
    given = (max_running, max_running_per_partition, max_per_second) != (None, None, None)
    if given == clear:
        # without this, a look at the limits (`limits etl`) would remove them
        fail(
            "give the limits to set (--max-running, --max-running-per-partition,"
            " --max-per-second), or --clear to remove them all",
            ExitCode.USAGE,
        )
    run(
        _steer(
            operator_settings(),
            actor,
            lambda client: client.set_limits(
                queue,
                max_running=max_running,
                max_running_per_partition=max_running_per_partition,
                max_per_second=max_per_second,
            ),
            as_json,
        )
    )


async def _steer(
    settings: Settings,
    actor: str,
    change: Callable[[Client], Awaitable[QueueSettings]],
    as_json: bool,
) -> int:
    """Make `change` (a pause, a resume, limits) as `actor` and show the queue's settings
    after."""
    after = await acting(settings, actor, change)
    if as_json:
        print_json(after)
        return ExitCode.OK
    state = Text("paused", style="yellow") if after.paused else Text("running", style="green")
    line = Text(f"queue {after.queue}: ").append_text(state)
    if after.changed_at is not None:
        line.append(f" (last changed {when(after.changed_at)} by {after.changed_by})")
    set_limits = {name: value for name, value in asdict(after.limits).items() if value is not None}
    line.append(
        "; limits: " + ", ".join(f"{name} {value:g}" for name, value in set_limits.items())
        if set_limits
        else "; no limits"
    )
    console().print(line)
    return ExitCode.OK
