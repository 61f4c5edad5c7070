"""The status of the whole system as every face shows it (`SystemStatus`: /status,
`dataloader status`, the dashboard), and what it warns of: queues nobody serves, tasks nobody
knows (of queued jobs, of schedules), a transaction keeping vacuum from the queue table,
maintenance failing or led by nobody, processes in error. Decided from what was read, without
I/O, so every face says the same in the same words."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from dataloader.config import Settings
from dataloader.core.cron import CronState
from dataloader.core.models import QueueStats
from dataloader.storage.admin import PROCESSES_IN_ERROR_LOOKED_AT, StatusReading
from dataloader.storage.maintenance import MAINTENANCE_LEASE, Lease, MaintenanceRun
from dataloader.storage.presence import LiveWorker

#: How long /status warns of a process's held event loop (`workers.watchdog`) after it.
HELD_LOOP_SHOWN_SEC: Final = 600.0


def queue_summary(stats: Mapping[str, QueueStats]) -> dict[str, dict[str, Any]]:
    """{queue: its jobs queued, running, failed and lost, and whether it is paused}."""
    return {
        name: {
            "queued": s.ready + s.waiting + s.delayed,
            "running": s.running,
            "failed": s.failed,
            "lost": s.lost,
            "paused": s.paused,
        }
        for name, s in stats.items()
    }


@dataclass(frozen=True, slots=True)
class MaintenanceState:
    """Who leads maintenance, how each chore last ran, and each schedule's last slot."""

    #: The leader's lease (None: nobody has led yet).
    leader: Lease | None
    runs: list[MaintenanceRun]
    cron: list[CronState]

    def document(self) -> dict[str, Any]:
        return {
            "leader": None if self.leader is None else asdict(self.leader),
            "runs": {
                run.task: {**asdict(run), "ago_sec": round(run.ago_sec, 3)} for run in self.runs
            },
            "cron": [asdict(schedule) for schedule in self.cron],
        }


@dataclass(frozen=True, slots=True)
class SystemStatus:
    """The whole system, as every face shows it (/status, `dataloader status`, the
    dashboard): each queue's jobs, the live processes, maintenance, the queue table's health
    and the warnings decided from them."""

    queues: dict[str, QueueStats]
    live_workers: list[LiveWorker]
    maintenance: MaintenanceState
    #: The queue table's health: dead rows, the oldest open transaction (`AdminStore`).
    table: dict[str, Any]
    #: {namespace: durable processes in error} (a bounded count: see `process_warnings`).
    processes_in_error: dict[str, int]
    warnings: list[str]
    #: {queue: the cluster holding it}, read through several clusters (`DL_CLUSTERS`).
    clusters: dict[str, str] = field(default_factory=dict)

    def document(self) -> dict[str, Any]:
        """As JSON: what /status and `dataloader status --json` answer."""
        return {
            "database": "ok",
            "queues": queue_summary(self.queues),
            "live_workers": [
                {**asdict(worker), "seen_ago_sec": round(worker.seen_ago_sec, 3)}
                for worker in self.live_workers
            ],
            "maintenance": self.maintenance.document(),
            **self.table,
            "warnings": self.warnings,
        }


def maintenance_state(
    leases: list[Lease], runs: list[MaintenanceRun], cron: Mapping[str, CronState]
) -> MaintenanceState:
    leader = next((lease for lease in leases if lease.name == MAINTENANCE_LEASE), None)
    return MaintenanceState(leader, runs, list(cron.values()))


def system_status(reading: StatusReading, settings: Settings) -> SystemStatus:
    """The status of the whole system from what was read (and the warnings it calls for)."""
    return SystemStatus(
        queues=reading.queues,
        live_workers=reading.live,
        maintenance=maintenance_state(reading.leases, reading.runs, reading.cron),
        table=reading.table,
        processes_in_error=reading.processes_in_error,
        warnings=warnings_of(reading, settings),
    )


def warnings_of(reading: StatusReading, settings: Settings) -> list[str]:
    """Every warning of what was read: queues with ready jobs nobody serves, tasks of queued
    jobs or of schedules that no live process knows, the queue table's vacuum held back,
    maintenance failing or led by nobody, durable processes in error."""
    return (
        unserved_warnings(reading.ready, reading.live)
        + unknown_task_warnings(reading.queued_tasks, reading.live)
        + unknown_schedule_warnings(list(reading.cron.values()), reading.live)
        + vacuum_warnings(reading.table, settings.long_transaction_sec)
        + maintenance_warnings(reading.runs, reading.leases, reading.live, settings)
        + process_warnings(reading.processes_in_error)
    )


def process_warnings(in_error: Mapping[str, int]) -> list[str]:
    """Namespaces with durable processes in error: each waits for a repair."""
    counted = sum(in_error.values())
    return [
        f"{n}{'+' if counted >= PROCESSES_IN_ERROR_LOOKED_AT else ''} process(es) of namespace"
        f" {namespace!r} are in error: repair them (`dataloader processes list --status error`)"
        for namespace, n in in_error.items()
    ]


def maintenance_warnings(
    runs: list[MaintenanceRun], leases: list[Lease], live: list[LiveWorker], settings: Settings
) -> list[str]:
    """Maintenance that fails, a loop of a live process that raised (it is being restarted),
    or maintenance that nobody runs while workers are live."""
    live_ids = {worker.worker_id for worker in live}
    warnings = [
        f"{r.holder}, {r.ago_sec:.0f}s ago: {r.error}"
        if r.detail.get("held_loop")
        else f"the {r.task} loop of {r.holder} failed and is restarted with a backoff: {r.error}"
        if r.detail.get("supervised")
        else f"the last {r.task} run failed: {r.error}"
        for r in runs
        # a loop stops mattering with its process; a held loop, after a while
        if not r.ok
        and (not r.detail.get("supervised") or r.holder in live_ids)
        and (not r.detail.get("held_loop") or r.ago_sec < HELD_LOOP_SHOWN_SEC)
    ]
    leader = next((lease for lease in leases if lease.name == MAINTENANCE_LEASE), None)
    if any(worker.queues for worker in live) and (leader is None or not leader.valid):
        warnings.append(
            "no process leads maintenance (reaper, pruner, cron): the next one to bid takes"
            f" it within {settings.leader_lease_sec:g}s"
        )
    return warnings


def unserved_warnings(ready: list[str], live: list[LiveWorker]) -> list[str]:
    """Queues with ready jobs that no live process serves: they would wait forever."""
    served = {queue for worker in live for queue in worker.queues}
    return [
        f"queue {queue!r} has ready jobs and no live worker serves it"
        for queue in ready
        if queue not in served
    ]


def unknown_task_warnings(queued: Mapping[str, list[str]], live: list[LiveWorker]) -> list[str]:
    """Tasks with queued jobs that no live process knows: accepted while their workers are
    away (`core.routing`), they wait until a process that knows them starts."""
    known = live_task_names(live)
    return [
        f"task {task!r} has queued jobs (queue {', '.join(map(repr, queues))}) and no live"
        " process knows it: they wait for a process that does"
        for task, queues in queued.items()
        if task not in known
    ]


def unknown_schedule_warnings(schedules: list[CronState], live: list[LiveWorker]) -> list[str]:
    """Schedules whose task no live process knows: each slot's job waits (or, if a process
    serving its queue lacks the task, fails) until one that knows it starts."""
    known = live_task_names(live)
    return [
        f"schedule {s.name!r} enqueues task {s.task!r} on queue {s.queue!r}, which no live"
        " process knows"
        for s in schedules
        if s.task not in known
    ]


def live_task_names(live: list[LiveWorker]) -> set[str]:
    """The tasks some live process knows."""
    return {task for worker in live for task in worker.tasks}


def vacuum_warnings(maintenance: dict[str, Any], limit_sec: float) -> list[str]:
    """Why the queue table may be bloating: a transaction open too long."""
    oldest = maintenance["oldest_transaction"]
    if oldest is None or oldest["age_sec"] < limit_sec:
        return []
    table = maintenance["queue_table"] or {}
    return [
        f"a transaction has been open for {oldest['age_sec']:.0f}s (pid {oldest['pid']},"
        f" {oldest['state']}, application {oldest['application_name']!r}): vacuum cannot"
        f" remove the queue table's dead rows ({table.get('dead_tuples', '?')} now) until it"
        " ends"
    ]
