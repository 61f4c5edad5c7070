"""Which slots of a cron schedule are due, and how schedules are declared."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import BaseModel

from dataloader.config import CronSpec, Settings, load_settings
from dataloader.core.cron import (
    MAX_CATCH_UP,
    check_schedule,
    check_timezone,
    due_slots,
    idempotency_key,
    next_slot,
)
from dataloader.exceptions import ConfigError
from dataloader.maintenance.cron import schedules
from dataloader.tasks import TaskRegistry

UTC_ZONE = ZoneInfo("UTC")


def at(hour: int, minute: int, second: int = 0, day: int = 1) -> datetime:
    return datetime(2026, 3, day, hour, minute, second, tzinfo=UTC)


def test_the_latest_due_slot_only_unless_catching_up() -> None:
    every_5_min = "*/5 * * * *"
    last, now = at(10, 0), at(10, 17, 30)
    assert due_slots(every_5_min, UTC_ZONE, last, now, catch_up=False) == [at(10, 15)]
    assert due_slots(every_5_min, UTC_ZONE, last, now, catch_up=True) == [
        at(10, 5),
        at(10, 10),
        at(10, 15),
    ]


def test_a_slot_at_now_is_due_and_the_last_one_is_not_again() -> None:
    assert due_slots("*/5 * * * *", UTC_ZONE, at(10, 0), at(10, 5), catch_up=True) == [at(10, 5)]
    assert due_slots("*/5 * * * *", UTC_ZONE, at(10, 5), at(10, 9, 59), catch_up=True) == []


def test_seconds_come_last_in_six_fields() -> None:
    slots = due_slots("* * * * * */10", UTC_ZONE, at(10, 0), at(10, 0, 35), catch_up=True)
    assert slots == [at(10, 0, 10), at(10, 0, 20), at(10, 0, 30)]


def test_catching_up_a_long_outage_is_bounded() -> None:
    last, now = at(0, 0), at(0, 0) + timedelta(days=30)
    slots = due_slots("* * * * * *", UTC_ZONE, last, now, catch_up=True)
    assert len(slots) == MAX_CATCH_UP
    assert slots[-1] == now
    assert slots[0] == now - timedelta(seconds=MAX_CATCH_UP - 1)


def test_a_time_zone_moves_the_slots() -> None:
    moscow = check_timezone("Europe/Moscow")  # UTC+3
    assert next_slot("0 3 * * *", moscow, at(0, 0)) == at(0, 0, day=2)
    assert next_slot("0 3 * * *", UTC_ZONE, at(0, 0)) == at(3, 0)


BERLIN = ZoneInfo("Europe/Berlin")  # falls back from 03:00 CEST to 02:00 CET on 2026-10-25


def utc(day: int, hour: int, minute: int = 0, month: int = 10) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


def in_utc(slots: list[datetime]) -> list[datetime]:
    # an instant in the hour that repeats never equals one of another zone (PEP 495)
    return [slot.astimezone(UTC) for slot in slots]


def slots_ticking(schedule: str, zone: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    """The slots a scheduler ticking every minute from `start` to `end` enqueues (in UTC)."""
    enqueued: list[datetime] = []
    last = start  # in UTC, as the database gives it: no wall-clock arithmetic
    while last < end:
        now = last + timedelta(minutes=1)
        enqueued += in_utc(due_slots(schedule, zone, last, now, catch_up=False))
        last = now
    return enqueued


@pytest.mark.parametrize(
    ("schedule", "zone", "utc_hour"),
    [
        ("0 3 * * *", UTC_ZONE, 3),
        ("@daily", UTC_ZONE, 0),
        ("30 2 * * *", BERLIN, 0),  # 02:30 summer time, before the change
        ("15 10 * * * 30", ZoneInfo("Asia/Tokyo"), 1),  # seconds last: 10:15:30 in Tokyo
    ],
)
def test_a_schedule_at_a_fixed_time_of_day_runs_every_ordinary_day(
    schedule: str, zone: ZoneInfo, utc_hour: int
) -> None:
    days = (utc(9, 23), utc(12, 23))  # three days of October without a change
    slots = in_utc(due_slots(schedule, zone, *days, catch_up=True))
    assert [(slot.day, slot.hour) for slot in slots] == [(d, utc_hour) for d in (10, 11, 12)]
    assert [slot.date() for slot in slots_ticking(schedule, zone, *days)] == [
        slot.date() for slot in slots
    ]
    assert in_utc([next_slot(schedule, zone, slots[0])]) == [slots[1]]


@pytest.mark.parametrize("catch_up", [True, False])
def test_a_daily_slot_in_the_hour_that_repeats_runs_once(catch_up: bool) -> None:
    # 02:30 local happens at 00:30 UTC (summer time) and again at 01:30 UTC (winter time)
    night = (utc(24, 20), utc(25, 6))
    if catch_up:
        slots = due_slots("30 2 * * *", BERLIN, *night, catch_up=True)
        assert in_utc(slots) == [utc(25, 0, 30)]
    else:
        assert slots_ticking("30 2 * * *", BERLIN, *night) == [utc(25, 0, 30)]
    assert in_utc([next_slot("30 2 * * *", BERLIN, utc(25, 0, 30))]) == [utc(26, 1, 30)]


def test_hourly_slots_run_in_both_passes_of_the_hour_that_repeats() -> None:
    night = (utc(24, 23), utc(25, 3))
    assert slots_ticking("0 * * * *", BERLIN, *night) == [utc(25, h) for h in range(0, 4)]
    assert slots_ticking("*/30 * * * *", BERLIN, utc(25, 0), utc(25, 2)) == [
        utc(25, 0, 30),
        utc(25, 1),
        utc(25, 1, 30),
        utc(25, 2),
    ]


def test_a_daily_slot_in_the_hour_that_is_skipped_runs_when_it_ends() -> None:
    # on 2026-03-29 Berlin springs from 02:00 CET to 03:00 CEST (01:00 UTC): 02:30 never is
    night = (utc(28, 20, month=3), utc(29, 6, month=3))
    slots = due_slots("30 2 * * *", BERLIN, *night, catch_up=True)
    assert in_utc(slots) == [utc(29, 1, month=3)]


@pytest.mark.parametrize("bad", ["61 * * * *", "every minute", "", "* * *", 5, None])
def test_bad_schedules_are_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="is not a cron schedule"):
        check_schedule(bad)


@pytest.mark.parametrize("never", ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 11 * 30"])
def test_schedules_that_never_fire_are_refused(never: str) -> None:
    """They pass croniter's syntax check, then fail every search for a slot."""
    with pytest.raises(ValueError, match=re.escape(f"the cron schedule '{never}' never fires")):
        check_schedule(never)
    with pytest.raises(ValueError, match="never fires"):
        TaskRegistry().task("t", queue="q", cron=never)
    spec = f'[{{"name": "n", "schedule": "{never}", "task": "t", "queue": "q"}}]'
    with pytest.raises(ConfigError, match="never fires"):
        load_settings(_env_file=None, cron=spec)


def test_unknown_time_zones_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown time zone"):
        check_timezone("Mars/Olympus")


def test_the_key_names_the_schedule_and_the_slot() -> None:
    assert idempotency_key("nightly", at(3, 0)) == "cron:nightly:2026-03-01T03:00:00+00:00"


def test_dl_cron_is_read_and_checked() -> None:
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        cron='[{"name": "n", "schedule": "@hourly", "task": "t", "queue": "q", "args": {"a": 1}}]',
    )
    assert settings.cron == [
        CronSpec(name="n", schedule="@hourly", task="t", queue="q", args={"a": 1})
    ]
    bad = [
        ('[{"name": "n", "schedule": "nope", "task": "t", "queue": "q"}]', "not a cron"),
        ('[{"name": "n", "schedule": "@daily", "task": "t"}]', "queue"),
        ('[{"name": "n", "schedule": "@daily", "task": "t", "queue": "q", "x": 1}]', "x"),
        (
            '[{"name": "n", "schedule": "@daily", "task": "t", "queue": "q", "timezone": "X/Y"}]',
            "unknown time zone",
        ),
        (
            '[{"name": "n", "schedule": "@daily", "task": "t", "queue": "q"},'
            ' {"name": "n", "schedule": "@hourly", "task": "t", "queue": "q"}]',
            "same name",
        ),
        ("{", "not valid JSON"),
    ]
    for value, message in bad:
        with pytest.raises(ConfigError, match=message):
            load_settings(_env_file=None, cron=value)


def test_tasks_declare_their_own_schedule() -> None:
    registry = TaskRegistry()

    @registry.task("etl.hourly", queue="etl", cron="@hourly")
    async def hourly(ctx: Any) -> None: ...

    declared = [CronSpec(name="other", schedule="@daily", task="t", queue="q")]
    found = schedules(declared, registry)
    assert [(s.name, s.schedule, s.task, s.queue) for s in found] == [
        ("other", "@daily", "t", "q"),
        ("etl.hourly", "@hourly", "etl.hourly", "etl"),
    ]
    twice = [CronSpec(name="etl.hourly", schedule="@daily", task="t", queue="q")]
    with pytest.raises(ValueError, match="declared in DL_CRON and on its task"):
        schedules(twice, registry)


def test_a_task_schedule_needs_a_queue_a_valid_expression_and_args_that_may_be_empty() -> None:
    registry = TaskRegistry()

    class Needs(BaseModel):
        day: str

    with pytest.raises(ValueError, match="needs the task's queue"):
        registry.task("a", cron="@hourly")
    with pytest.raises(ValueError, match="not a cron schedule"):
        registry.task("b", queue="q", cron="sometimes")
    with pytest.raises(ValueError, match="empty args"):
        registry.task("c", queue="q", args=Needs, cron="@hourly")


def test_dl_cron_args_its_registered_task_refuses_are_a_configuration_error() -> None:
    registry = TaskRegistry()

    class Needs(BaseModel):
        day: str

    @registry.task("etl.daily", queue="etl", args=Needs)
    async def daily(ctx: Any) -> None: ...

    good = CronSpec(name="ok", schedule="@daily", task="etl.daily", queue="etl", args={"day": "x"})
    other = CronSpec(name="elsewhere", schedule="@daily", task="not.here", queue="q", args={"a": 1})
    assert [s.name for s in schedules([good, other], registry)] == ["ok", "elsewhere"]
    bad = CronSpec(name="bad", schedule="@daily", task="etl.daily", queue="etl", args={"dya": 1})
    with pytest.raises(ValueError, match=r"the schedule 'bad': etl\.daily refuses its args: .*day"):
        schedules([good, bad], registry)
