"""The timing of presence fencing, without a database: a process stops its jobs before the
others may find it gone, and the reaper takes them back as soon as they may."""

from __future__ import annotations

import pytest

from dataloader.config import Settings
from dataloader.workers.fencing import (
    GONE_AFTER_PERIODS,
    MIN_SLACK_SEC,
    PresenceFence,
    presence_window,
)
from dataloader.workers.reaper import DUE_MARGIN_SEC, next_pass_in

PERIODS = [0.5, 1, 2, 5, 10, 60]


@pytest.mark.parametrize("period", PERIODS)
def test_a_process_stops_its_jobs_before_the_others_may_find_it_gone(period: float) -> None:
    # counted from the send of its last refresh that got through; the database stamped the
    # row later, and finds the process gone three periods after that stamp
    gone_after = GONE_AFTER_PERIODS * period
    assert 0 < presence_window(period) <= gone_after - MIN_SLACK_SEC


@pytest.mark.parametrize("period", [1, 2, 5, 10, 60])
def test_one_failed_refresh_leaves_another_before_the_jobs_are_stopped(period: float) -> None:
    # refreshes are sent a period apart (+10 % jitter at most): the second after the last
    # one that got through still has time for its round trip before the deadline
    second_try_at = 2 * period * 1.1
    assert presence_window(period) - second_try_at >= min(1.0, 0.2 * period)


def test_at_the_defaults_jobs_stop_at_5_4_s_and_the_process_is_gone_at_6_s() -> None:
    period = Settings(_env_file=None).presence_period_sec  # type: ignore[call-arg]
    assert period == 2
    assert presence_window(period) == pytest.approx(5.4)
    assert GONE_AFTER_PERIODS * period == 6


def test_the_fence_runs_from_each_refresh_send_and_is_lifted_by_a_deregistration() -> None:
    fence = PresenceFence(period_sec=2)
    assert not fence.lapsed(now=1e9)  # no refresh yet: no job runs either
    fence.refreshed(sent=100.0)
    assert not fence.lapsed(now=105.3)
    assert fence.lapsed(now=105.4)
    fence.refreshed(sent=102.0)
    assert not fence.lapsed(now=107.3)
    assert fence.lapsed(now=107.4)
    fence.deregistered()  # no row: nobody can find the process gone, leases alone count
    assert not fence.lapsed(now=1e9)


@pytest.mark.parametrize(
    ("period", "due_in", "expected"),
    [
        (10.0, None, 6.0),  # nothing running: a job claimed now is gone no sooner than 6 s
        (4.0, None, 4.0),
        (10.0, 3.2, 3.2 + DUE_MARGIN_SEC),  # an owner turns gone in 3.2 s unless refreshed
        (10.0, 0.0, DUE_MARGIN_SEC),
        (10.0, 50.0, 6.0),  # a lease far off
    ],
)
def test_the_reaper_passes_when_a_job_becomes_reapable_or_every_period(
    period: float, due_in: float | None, expected: float
) -> None:
    assert next_pass_in(period, due_in, presence_period_sec=2.0) == pytest.approx(expected)


def _reaped_at(kill: float, last_refresh: float, claimed: float, last_pass: float) -> float:
    """When the reaper takes back a killed process's job (the passes' schedule, simulated):
    `last_pass` was the last pass before the claim."""
    period = 2.0
    gone = last_refresh + GONE_AFTER_PERIODS * period
    at, due_in = last_pass, None
    while True:
        at += next_pass_in(10.0, due_in, period)
        if at >= gone:
            return at
        # a pass that finds the job running learns when its owner turns gone
        due_in = gone - at if at >= claimed else None


@pytest.mark.parametrize("since_refresh", [0.0, 1.0, 2.2])
@pytest.mark.parametrize("since_claim", [0.0, 0.5, 3.0, 30.0])
@pytest.mark.parametrize("since_pass", [0.0, 2.0, 5.9])
def test_at_the_defaults_a_killed_process_s_jobs_are_reaped_within_6_1_s_of_the_kill(
    since_refresh: float, since_claim: float, since_pass: float
) -> None:
    """Its last refresh was sent at most a period (+10 %) before the kill; it is gone three
    periods after that refresh; the reaper passes then, or had passed meanwhile."""
    kill = 100.0
    claimed = kill - since_claim
    reaped = _reaped_at(kill, kill - since_refresh, claimed, claimed - since_pass)
    assert reaped - kill <= 6.0 + DUE_MARGIN_SEC + 1e-9


@pytest.mark.parametrize("period", PERIODS)
def test_after_an_outage_the_reaper_waits_three_periods_from_the_databases_return(
    period: float,
) -> None:
    fence = PresenceFence(period)
    fence.refreshed(100.0)
    assert fence.outage_wait(now=100.5) == 0  # no outage seen: the reaper judges at once
    fence.failed()
    assert fence.outage_wait(now=130.0) == period  # still away: look again in a period
    fence.refreshed(140.0)  # the database is back
    assert fence.outage_wait(now=140.0) == pytest.approx(GONE_AFTER_PERIODS * period)
    assert fence.outage_wait(now=140.0 + period) == pytest.approx((GONE_AFTER_PERIODS - 1) * period)
    assert fence.outage_wait(now=140.0 + GONE_AFTER_PERIODS * period) == 0
    fence.refreshed(140.0 + 4 * period)  # refreshes without a failure start no new wait
    assert fence.outage_wait(now=140.0 + 4 * period) == 0
