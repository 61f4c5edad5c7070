"""The live worker processes, and the schedules with maintenance's runs."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from dataloader.api.parameters import CheckedRoute
from dataloader.client import Client
from dataloader.core.cron import CronState, check_timezone, idempotency_key, next_slot
from dataloader.dashboard.common import PREFIX, PageClient, PageViewer, render
from dataloader.health import MaintenanceState

router = APIRouter(prefix=PREFIX, route_class=CheckedRoute)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule as the cron page shows it."""

    state: CronState
    #: Its next slot (None: its schedule or time zone is no longer readable).
    next_slot: datetime | None
    #: The job of its last slot, if it still exists.
    last_job: uuid.UUID | None


async def schedules_of(client: Client, maintenance: MaintenanceState) -> list[Schedule]:
    """Each recorded schedule with its next slot and the job of its last one."""
    now = datetime.now(UTC)
    shown = []
    for state in maintenance.cron:
        try:
            zone = check_timezone(state.timezone)
        except ValueError:  # recorded by another version, not readable here
            shown.append(Schedule(state, None, None))
            continue
        last_job = None
        if state.last_slot is not None:
            # the slot's job is keyed by the slot as the schedule's zone writes it
            key = idempotency_key(state.name, state.last_slot.astimezone(zone))
            found = await client.find(key)
            last_job = None if found is None else found.job_id
        shown.append(Schedule(state, upcoming(state, zone, now), last_job))
    return shown


def upcoming(state: CronState, zone: ZoneInfo, now: datetime) -> datetime | None:
    """The schedule's first slot after `now` and its last one (None: a schedule recorded by
    another version that this one cannot read)."""
    after = now if state.last_slot is None else max(now, state.last_slot)
    try:
        return next_slot(state.schedule, zone, after)
    except ValueError:  # croniter's errors are ValueErrors
        return None


@router.get("/workers", response_class=HTMLResponse, include_in_schema=False)
async def workers(request: Request, client: PageClient, viewer: PageViewer) -> HTMLResponse:
    return render(request, viewer, "workers.html", workers=await client.workers())


@router.get("/cron", response_class=HTMLResponse, include_in_schema=False)
async def cron(request: Request, client: PageClient, viewer: PageViewer) -> HTMLResponse:
    maintenance = await client.maintenance()
    schedules = await schedules_of(client, maintenance)
    return render(request, viewer, "cron.html", maintenance=maintenance, schedules=schedules)
