"""Periodic tasks: which time slots of a cron schedule are due. No I/O.

A schedule is a cron expression of 5 fields (minute hour day month weekday), or 6 with
seconds last (`*/10 * * * * 30`: every 10 minutes at second 30), or a nickname (`@hourly`,
`@daily` …), read in a time zone (UTC by default), daylight saving included: a schedule at
fixed times of day runs once at each of them (a wall time that does not occur at the next
one that does, a repeated one in its first pass only); one of every hour or minute follows
the clock as it is. Each slot is enqueued once, whoever leads (see `maintenance.cron`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

#: Missed slots enqueued at most when a schedule catches up (the latest ones).
MAX_CATCH_UP: Final = 100


@dataclass(frozen=True, slots=True)
class CronState:
    """A periodic task's schedule as last recorded, and its last slot enqueued."""

    name: str
    schedule: str
    task: str
    queue: str
    last_slot: datetime | None
    #: The IANA time zone the schedule is read in.
    timezone: str = "UTC"


def check_schedule(expression: object) -> str:
    """`expression` if it is a cron expression croniter reads and that has a next slot;
    ValueError otherwise. A schedule of a date that never comes (`0 0 30 2 *`) passes
    croniter's syntax check and then fails every attempt to find its slots: refused here, at
    start, it cannot stop the scheduler later."""
    if not isinstance(expression, str) or not croniter.is_valid(expression.strip()):
        raise ValueError(
            f"{expression!r} is not a cron schedule (e.g. '*/5 * * * *', '0 3 * * *',"
            " '@hourly', or 6 fields with seconds last)"
        )
    try:
        croniter(expression.strip(), datetime.now(UTC)).get_next(datetime)
    except CroniterBadDateError:
        raise ValueError(f"the cron schedule {expression!r} never fires") from None
    return expression.strip()


def check_timezone(name: object) -> ZoneInfo:
    """The IANA time zone `name` (`Europe/Moscow`); ValueError if there is none."""
    if not isinstance(name, str):
        raise ValueError(f"a time zone is a name like 'Europe/Moscow', not {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}") from None


def next_slot(schedule: str, zone: ZoneInfo, after: datetime) -> datetime:
    """The schedule's first slot strictly after `after`."""
    walk = croniter(schedule, after.astimezone(zone))
    while True:
        slot: datetime = walk.get_next(datetime)
        if not _repeated_wall_time(schedule, slot, zone):
            return slot


def _repeated_wall_time(schedule: str, slot: datetime, zone: ZoneInfo) -> bool:
    """Whether `slot` is the second occurrence of its wall time (the hour repeated when
    daylight saving ends) for a schedule at fixed times of day: a daily job at 02:30 runs once
    on that day, as in cron. Schedules of every hour (`0 * * * *`, `* * * * *`) run in both
    hours, since both pass."""
    minutes, hours = croniter(schedule).expanded[:2]
    every_hour = "*" in minutes or "*" in hours
    # the fold of the instant itself: croniter marks every slot it walks back to as fold=1,
    # and astimezone() to the slot's own zone keeps whatever fold the slot carries
    return not every_hour and slot.astimezone(UTC).astimezone(zone).fold == 1


def due_slots(
    schedule: str, zone: ZoneInfo, last: datetime, now: datetime, *, catch_up: bool
) -> list[datetime]:
    """The slots after `last` up to `now` (included), oldest first: all of them with
    `catch_up` (the latest MAX_CATCH_UP), else the latest one only (missed ones are
    skipped). Walks back from `now`: a long outage costs no more than MAX_CATCH_UP steps."""
    # from just after `now`, the previous slot may be `now` itself
    walk = croniter(schedule, (now + timedelta(microseconds=1)).astimezone(zone))
    slots: list[datetime] = []
    while len(slots) < (MAX_CATCH_UP if catch_up else 1):
        slot: datetime = walk.get_prev(datetime)
        if slot <= last:
            break
        if not _repeated_wall_time(schedule, slot, zone):
            slots.append(slot)
    return slots[::-1]


def idempotency_key(name: str, slot: datetime) -> str:
    """The key of the job of schedule `name` for `slot`: one job per slot, however many
    processes enqueue it."""
    return f"cron:{name}:{slot.isoformat()}"
