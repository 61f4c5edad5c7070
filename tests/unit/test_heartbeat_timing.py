"""The heartbeat's timing rules, without a database: how often leases are extended, and when a
job whose lease could not be extended is stopped."""

from __future__ import annotations

import pytest

from dataloader.workers.fencing import MIN_SLACK_SEC, beat_period_for, fence_window


@pytest.mark.parametrize("ttl", [1, 2, 3, 5, 10, 30, 60, 300, 3600])
def test_a_missed_beat_leaves_two_more_tries_before_the_job_is_stopped(ttl: int) -> None:
    # A beat skips a row that the job's own progress write holds at that moment; a single
    # such collision must not cost the job its run. After the last extension, beats come
    # at one, two and three periods; each needs time for its round trip before the deadline
    # (the stop falls between beats, or during a slow one).
    period = beat_period_for(ttl)
    third_beat_at = 3 * period
    assert fence_window(ttl) - third_beat_at >= period


@pytest.mark.parametrize("ttl", [1, 2, 3, 5, 10, 30, 60, 300, 3600])
def test_a_job_is_stopped_early_enough_to_hand_itself_back_before_the_lease_expires(
    ttl: int,
) -> None:
    assert 0 < fence_window(ttl) <= ttl - MIN_SLACK_SEC
