"""When a worker claims ahead of its free slots, and how many units (`ClaimPace`)."""

from __future__ import annotations

import pytest

from dataloader.workers.claims import AHEAD_MIN_UNITS, ClaimPace


def paced(run_sec: float, claim_sec: float, *, enabled: bool = True) -> ClaimPace:
    pace = ClaimPace(enabled=enabled)
    pace.ran(run_sec)
    pace.claimed(claim_sec)
    return pace


def test_nothing_is_claimed_ahead_before_a_unit_ran_or_a_claim_was_timed() -> None:
    assert ClaimPace(enabled=True).ahead(10, 0) == 0
    only_claims = ClaimPace(enabled=True)
    only_claims.claimed(0.001)
    assert only_claims.ahead(10, 0) == 0
    only_runs = ClaimPace(enabled=True)
    only_runs.ran(0.0001)
    assert only_runs.ahead(10, 0) == 0


def test_units_shorter_than_a_claim_are_claimed_ahead_as_many_as_run_in_its_time() -> None:
    # ten slots, each running four units in a claim's time: forty would fit, the cap is twenty
    assert paced(0.00025, 0.001).ahead(10, 0) == max(10, AHEAD_MIN_UNITS)
    # a hundred slots: as many as the slots, however short the units
    assert paced(0.00001, 0.001).ahead(100, 0) == 100
    # one slot, units of half a claim: two
    assert paced(0.0005, 0.001).ahead(1, 0) == 2
    # units as long as a claim: one set of slots
    assert paced(0.001, 0.001).ahead(4, 0) == 4
    assert paced(0.0, 0.001).ahead(3, 0) == AHEAD_MIN_UNITS


def test_units_longer_than_a_claim_are_not_claimed_ahead() -> None:
    assert paced(0.002, 0.001).ahead(10, 0) == 0


def test_nothing_more_is_claimed_ahead_while_units_claimed_ahead_wait() -> None:
    assert paced(0.0001, 0.001).ahead(10, 1) == 0


def test_a_queue_with_limits_is_not_claimed_ahead() -> None:
    assert paced(0.0001, 0.001).ahead(10, 0, limited=True) == 0


def test_claiming_ahead_switched_off_claims_nothing_ahead() -> None:
    assert paced(0.0001, 0.001, enabled=False).ahead(10, 0) == 0


def test_the_estimates_follow_the_latest_measures() -> None:
    pace = paced(0.0001, 0.001)
    for _ in range(30):
        pace.ran(0.01)  # the units turned long
    assert pace.run_sec == pytest.approx(0.01, rel=0.01)
    assert pace.ahead(10, 0) == 0
    for _ in range(30):
        pace.ran(0.0001)
    assert pace.ahead(10, 0) > 0


def test_a_stall_stops_claiming_ahead_until_short_runs_bring_the_estimate_down() -> None:
    pace = paced(0.0001, 0.001)
    pace.stalled(1.0)
    assert pace.run_sec == 1.0
    assert pace.ahead(10, 0) == 0
    for _ in range(10):
        pace.ran(0.0001)
    assert pace.ahead(10, 0) == 0  # 1 s x 0.8**10 is still longer than a claim
    for _ in range(40):
        pace.ran(0.0001)
    assert pace.ahead(10, 0) > 0
