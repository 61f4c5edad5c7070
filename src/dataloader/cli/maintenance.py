"""`prune`: the pruner's work done once, now, with the retention settings (DL_PRUNE_*), as
the process leading maintenance does every DL_PRUNE_PERIOD_SEC."""

from __future__ import annotations

import time
from typing import Annotated, Final

import typer

from dataloader.cli.common import (
    CLI_ACTOR,
    ActorOption,
    ExitCode,
    JsonOption,
    inspected,
    operator_settings,
    run,
)
from dataloader.cli.output import Col, cell, console, duration, print_json, table
from dataloader.config import Settings
from dataloader.maintenance.pruner import Pruner, Retention
from dataloader.storage.maintenance import MaintenanceStore

#: The name the record of maintenance runs (and /status) gives the pruner's runs.
PRUNER: Final = "pruner"


def prune(
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Count what would be deleted (jobs and heartbeats), delete nothing."
        ),
    ] = False,
    actor: ActorOption = CLI_ACTOR,
    as_json: JsonOption = False,
) -> None:
    """Delete old finished jobs now, as the pruner does, and print what went, per status.

    Deletes the jobs that ended longer ago than their status's retention
    (DL_PRUNE_SUCCEEDED_AFTER_SEC, …_CANCELED_…, …_FAILED_…, …_LOST_…; 0 keeps them) with
    their journals, heartbeat entries older than DL_PRUNE_HEARTBEATS_AFTER_SEC, and old
    throughput buckets; in batches of DL_PRUNE_BATCH_SIZE, each a short transaction. The run
    is recorded as the pruner's last (`status` and /status show it)."""
    run(_prune(operator_settings(), dry_run, actor, as_json))


async def _prune(settings: Settings, dry_run: bool, actor: str, as_json: bool) -> int:
    retention = Retention.of(settings)
    async with inspected(settings) as (_, pool):
        store = MaintenanceStore(pool)
        if dry_run:
            counts = await _prunable(store, retention)
        else:
            started = time.monotonic()
            counts = await Pruner(store, retention, settings.prune_batch_size).prune()
            took = time.monotonic() - started
            await store.record_run(PRUNER, actor, took, None, counts)
    kept = {status.value: sec for status, sec in retention.by_status().items()}
    if retention.heartbeats_sec > 0:
        kept["heartbeats"] = retention.heartbeats_sec
    if retention.removed_processes_sec > 0:
        kept["processes"] = retention.removed_processes_sec
    if as_json:
        key = "would_delete" if dry_run else "deleted"
        print_json({"dry_run": dry_run, key: counts, "retention_sec": kept})
    else:
        _show(counts, kept, dry_run)
    return ExitCode.OK


async def _prunable(store: MaintenanceStore, retention: Retention) -> dict[str, int]:
    """What the pruner would delete now: {status, "heartbeats" or "processes": rows}."""
    counts = {
        status.value: await store.count_prunable_jobs(status, age)
        for status, age in retention.by_status().items()
    }
    if retention.heartbeats_sec > 0:
        counts["heartbeats"] = await store.count_prunable_heartbeats(retention.heartbeats_sec)
    if retention.removed_processes_sec > 0:
        age = retention.removed_processes_sec
        counts["processes"] = await store.count_prunable_processes(age)
    return counts


def _show(counts: dict[str, int], kept: dict[str, float], dry_run: bool) -> None:
    grid = table("what", Col("would delete" if dry_run else "deleted", justify="right"), "kept for")
    for what, n in counts.items():
        grid.add_row(cell(what), cell(n), cell(duration(kept[what]) if what in kept else None))
    console().print(grid)
