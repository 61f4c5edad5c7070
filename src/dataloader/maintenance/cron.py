"""The cron scheduler: enqueues each slot of each periodic task once (`DL_CRON`, and tasks
defined with `cron=`), run by the process that leads maintenance.

The last slot enqueued of each schedule is kept in `dl_cron`. A tick reads the database's
clock, and for each schedule enqueues the slots since the last one (the latest only, or all
of them with `catch_up`), each with the idempotency key `cron:<name>:<slot>` and the slot as
its `available_at`: a slot enqueued twice (by two processes that both believe they lead, or
again after a crash between the enqueue and its record) is one job. A schedule seen for the
first time, or changed, starts from now: no slot of the past is enqueued for it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final
from zoneinfo import ZoneInfo

from dataloader.config import CronSpec
from dataloader.core.cron import CronState, due_slots, idempotency_key, next_slot
from dataloader.core.models import NewJob
from dataloader.exceptions import ConfigError, IdempotencyConflict, InvalidJobArgs
from dataloader.storage.db import CONNECTION_ERRORS
from dataloader.storage.maintenance import MaintenanceStore
from dataloader.tasks import TaskRegistry

if TYPE_CHECKING:
    from dataloader.client import Client

log = logging.getLogger(__name__)

#: Longest sleep between ticks: a schedule's row is refreshed at least this often.
MAX_SLEEP_SEC: Final = 60.0
#: Who enqueues, in the job's `producer` and its journal's `by`.
CRON_ACTOR: Final = "cron"


def schedules(declared: list[CronSpec], registry: TaskRegistry) -> list[CronSpec]:
    """The schedules of `DL_CRON`, then those of tasks defined with `cron=` (named after the
    task) that `DL_CRON` does not name; ValueError for two schedules of one name, or for
    `DL_CRON` args that the registered task refuses (every slot's job would be refused)."""
    found = {spec.name: spec for spec in declared}
    for spec in declared:
        task = registry.get(spec.task)
        if task is None:
            continue  # a task of other processes: its args are checked where it runs
        try:
            task.check_args(spec.args)
        except InvalidJobArgs as exc:
            raise ValueError(
                f"the schedule {spec.name!r}: {spec.task} refuses its args: {exc}"
            ) from None

    for task in registry.tasks():
        if task.cron is None:
            continue
        if task.name in found:
            raise ValueError(f"the schedule {task.name!r} is declared in DL_CRON and on its task")
        assert task.queue is not None  # a task with a cron schedule names its queue
        found[task.name] = CronSpec(
            name=task.name, schedule=task.cron, task=task.name, queue=task.queue
        )
    return list(found.values())


def configured_schedules(declared: list[CronSpec], registry: TaskRegistry) -> list[CronSpec]:
    """`schedules`, its ValueError a ConfigError naming DL_CRON (checked before the service
    starts, and by every process that runs workers)."""
    try:
        return schedules(declared, registry)
    except ValueError as exc:
        raise ConfigError(f"DL_CRON: {exc}") from None


class CronSchedulesFailed(Exception):
    """Schedules of a tick that could not enqueue their job (their args refused by their task,
    say), by name: the tick enqueued the others' jobs, and tries these again at the next."""

    def __init__(self, failed: dict[str, str]) -> None:
        super().__init__(
            "; ".join(f"schedule {name!r}: {error}" for name, error in sorted(failed.items()))
        )
        self.failed = failed


class CronScheduler:
    """Enqueues the due slots of `schedules` through `client`."""

    def __init__(self, store: MaintenanceStore, client: Client, specs: list[CronSpec]) -> None:
        self._store = store
        self._client = client.acting_as(CRON_ACTOR)
        self._specs = specs
        self._zones = {spec.name: ZoneInfo(spec.timezone) for spec in specs}
        self._now: datetime | None = None

    async def tick(self, stopping: asyncio.Event | None = None) -> dict[str, Any]:
        """Enqueue every due slot; {"enqueued": new jobs, "schedules": how many}."""
        if not self._specs:
            return {"enqueued": 0, "schedules": 0}
        now = await self._store.now()
        known = await self._store.cron_state()
        enqueued = 0
        failed: dict[str, str] = {}
        for spec in self._specs:
            try:
                enqueued += await self._tick_one(spec, known.get(spec.name), now)
            except CONNECTION_ERRORS:
                raise
            except Exception as exc:  # this schedule's own trouble: the others have their turn
                failed[spec.name] = f"{type(exc).__name__}: {exc}"
                log.warning("schedule %r could not enqueue: %s", spec.name, failed[spec.name])
        self._now = now
        if failed:
            # the run is recorded as failed, and /status warns, naming the schedules
            raise CronSchedulesFailed(failed)
        return {"enqueued": enqueued, "schedules": len(self._specs)}

    async def _tick_one(self, spec: CronSpec, state: CronState | None, now: datetime) -> int:
        """Enqueue the due slots of one schedule; how many new jobs."""
        if state is None or state.last_slot is None or _changed(state, spec):
            # new or changed: it starts from now
            await self._store.set_cron(
                CronState(spec.name, spec.schedule, spec.task, spec.queue, now, spec.timezone)
            )
            return 0
        slots = due_slots(
            spec.schedule, self._zones[spec.name], state.last_slot, now, catch_up=spec.catch_up
        )
        enqueued = 0
        for slot in slots:
            enqueued += await self._enqueue(spec, slot)
        if slots:
            await self._store.set_cron(replace(state, last_slot=slots[-1]))
        return enqueued

    def next_in_sec(self) -> float:
        """Seconds from the last tick's clock to the next slot of any schedule (at most
        MAX_SLEEP_SEC)."""
        if self._now is None or not self._specs:
            return MAX_SLEEP_SEC
        now = self._now
        soonest = min(next_slot(spec.schedule, self._zones[spec.name], now) for spec in self._specs)
        return max(0.0, min(MAX_SLEEP_SEC, (soonest - now).total_seconds()))

    async def _enqueue(self, spec: CronSpec, slot: datetime) -> int:
        """Enqueue the job of `spec` for `slot`; 1 if it is new, 0 if it was there."""
        job = NewJob(
            queue=spec.queue,
            task=spec.task,
            args=spec.args,
            lock_key=spec.lock_key or f"cron:{spec.name}",
            idempotency_key=idempotency_key(spec.name, slot),
            available_at=slot,
            producer=CRON_ACTOR,
        )
        try:
            result = await self._client.enqueue(job)
        except IdempotencyConflict as exc:  # the slot's job exists, written with other fields
            log.warning("schedule %r, slot %s: %s", spec.name, slot.isoformat(), exc)
            return 0
        if result.created:
            log.info("schedule %r: enqueued its job of %s", spec.name, slot.isoformat())
        return int(result.created)


def _changed(state: CronState, spec: CronSpec) -> bool:
    recorded = (state.schedule, state.task, state.queue, state.timezone)
    return recorded != (spec.schedule, spec.task, spec.queue, spec.timezone)
