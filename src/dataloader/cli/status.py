"""`status`: what `GET /status` shows of the whole system, read from the database: each
queue's jobs, the live processes, who leads maintenance and how its chores last ran, the
schedules, the queue table's health, and warnings."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from dataloader.cli.common import ExitCode, JsonOption, inspected, operator_settings, run
from dataloader.cli.output import Col, cell, console, duration, print_json, table, when
from dataloader.config import Settings


def status(as_json: JsonOption = False) -> None:
    """The whole system at a glance, with warnings (what GET /status shows).

    Per queue its jobs queued, running, failed and lost and whether it is paused; the live
    processes; the process leading maintenance, the last run of the reaper, pruner and cron
    scheduler, each schedule's last slot; the queue table's dead rows and the oldest open
    transaction; and warnings (a queue with ready jobs that no live process serves, a
    transaction keeping vacuum from the queue table, a maintenance run that failed, nobody
    leading maintenance). Exit 0 whatever the warnings."""
    run(_status(operator_settings(), as_json))


async def _status(settings: Settings, as_json: bool) -> int:
    # /status's document, less what only a serving process knows of itself (its own workers
    # and whether it leads)
    async with inspected(settings) as (client, _):
        report = (await client.status()).document()
    if as_json:
        print_json(report)
    else:
        _show(report)
    return ExitCode.OK


def _show(report: dict[str, Any]) -> None:
    out = console()
    _show_queues(out, report["queues"])
    _show_workers(out, report["live_workers"])
    _show_maintenance(out, report["maintenance"])
    _show_health(out, report)
    for warning in report["warnings"]:
        out.print(Text(f"warning: {warning}", style="yellow"))
    if not report["warnings"]:
        out.print(Text("no warnings", style="green"))


def _show_queues(out: Console, queues: dict[str, dict[str, Any]]) -> None:
    if not queues:
        out.print("queues: none holds jobs, is paused, served or was busy in the last hour")
        return
    numbers = (Col(header, justify="right") for header in ("queued", "running", "failed", "lost"))
    grid = table(Col("queue", whole=True), *numbers, "paused", title="queues")
    for name, q in queues.items():
        counts = (q["queued"], q["running"], q["failed"], q["lost"])
        grid.add_row(cell(name), *(cell(n) for n in counts), cell(q["paused"]))
    out.print(grid)


def _show_workers(out: Console, workers: list[dict[str, Any]]) -> None:
    if not workers:
        out.print("live workers: none")
        return
    grid = table(
        Col("worker", whole=True),
        Col("host", drop=2),
        Col("pid", drop=3),
        Col("version", drop=4),
        "queues (slots)",
        Col("seen", drop=1),
        title="live workers",
    )
    for w in workers:
        served = ", ".join(f"{queue} ({slots})" for queue, slots in w["queues"].items())
        grid.add_row(
            cell(w["worker_id"]),
            cell(w["host"]),
            cell(w["pid"]),
            cell(w["version"]),
            cell(served or None),
            cell(f"{duration(w['seen_ago_sec'])} ago"),
        )
    out.print(grid)


def _show_maintenance(out: Console, maintenance: dict[str, Any]) -> None:
    leader = maintenance["leader"]
    if leader is None or not leader["valid"]:
        out.print("maintenance: nobody leads it")
    else:
        out.print(
            Text(
                f"maintenance: led by {leader['holder']} (lease until {when(leader['expires_at'])})"
            )
        )
    if maintenance["runs"]:
        grid = table("chore", "by", "last run", "took", "runs", "outcome", title="last runs")
        for task, r in maintenance["runs"].items():
            took = (r["finished_at"] - r["started_at"]).total_seconds()
            outcome = Text("ok", style="green") if r["ok"] else Text(r["error"] or "failed", "red")
            grid.add_row(
                cell(task),
                cell(r["holder"]),
                cell(f"{duration(r['ago_sec'])} ago"),
                cell(duration(took)),
                cell(r["runs"]),
                outcome,
            )
        out.print(grid)
    if maintenance["cron"]:
        grid = table("schedule", "cron", "task", "queue", "last slot", title="schedules")
        for c in maintenance["cron"]:
            row = (c["name"], c["schedule"], c["task"], c["queue"], c["last_slot"])
            grid.add_row(*(cell(value) for value in row))
        out.print(grid)


def _show_health(out: Console, report: dict[str, Any]) -> None:
    table_health = report["queue_table"]
    if table_health is not None:
        vacuum = table_health["last_vacuum"]
        out.print(
            Text(
                f"queue table: {table_health['live_tuples']} live rows,"
                f" {table_health['dead_tuples']} dead, last vacuum"
                f" {'never' if vacuum is None else when(vacuum)}"
            )
        )
    oldest = report["oldest_transaction"]
    if oldest is not None:
        out.print(
            Text(
                f"oldest transaction: {duration(oldest['age_sec'])} (pid {oldest['pid']},"
                f" {oldest['state']}, application {oldest['application_name']!r})"
            )
        )
