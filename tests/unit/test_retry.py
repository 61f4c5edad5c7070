"""Unit tests of `dataloader.core.retry`: the retry policies and their checks."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from dataloader.core.retry import (
    MAX_DELAY_SEC,
    Exponential,
    Fixed,
    Linear,
    as_policy,
    delay_of,
    seconds,
)

# --- Linear -----------------------------------------------------------------------------------


def test_linear_waits_base_times_the_attempt() -> None:
    policy = Linear(30)
    assert [policy(n) for n in (1, 2, 3)] == [30, 60, 90]


def test_linear_defaults_to_thirty_seconds() -> None:
    assert Linear()(1) == 30


def test_linear_of_zero_retries_at_once() -> None:
    assert Linear(0)(5) == 0


@pytest.mark.parametrize("base", [-1.0, math.nan, math.inf, MAX_DELAY_SEC + 1])
def test_linear_refuses_a_base_that_is_no_delay(base: float) -> None:
    with pytest.raises(ValueError, match=r"^base must be between 0 and"):
        Linear(base)


# --- Fixed ------------------------------------------------------------------------------------


def test_fixed_waits_the_same_after_every_failure() -> None:
    policy = Fixed(12.5)
    assert {policy(n) for n in (1, 2, 50)} == {12.5}


@pytest.mark.parametrize("delay", [-0.001, math.nan, MAX_DELAY_SEC * 2])
def test_fixed_refuses_a_delay_out_of_bounds(delay: float) -> None:
    with pytest.raises(ValueError, match=r"^seconds must be between 0 and"):
        Fixed(delay)


def test_fixed_accepts_the_longest_delay() -> None:
    assert Fixed(MAX_DELAY_SEC)(1) == MAX_DELAY_SEC


# --- Exponential ------------------------------------------------------------------------------


def test_exponential_without_jitter_doubles_from_the_base() -> None:
    policy = Exponential(base=5, jitter=False)
    assert [policy(n) for n in (1, 2, 3, 4)] == [5, 10, 20, 40]


def test_exponential_uses_its_factor() -> None:
    policy = Exponential(base=1, factor=3, jitter=False)
    assert [policy(n) for n in (1, 2, 3)] == [1, 3, 9]


def test_exponential_stops_at_its_cap() -> None:
    policy = Exponential(base=5, cap=30, jitter=False)
    assert [policy(n) for n in (3, 4, 5, 20)] == [20, 30, 30, 30]


def test_exponential_with_a_factor_of_one_is_fixed() -> None:
    policy = Exponential(base=7, factor=1, jitter=False)
    assert {policy(n) for n in (1, 10, 10**9)} == {7}


def test_exponential_with_a_base_of_zero_always_retries_at_once() -> None:
    policy = Exponential(base=0, factor=10, jitter=False)
    assert {policy(n) for n in (1, 10, 10**9)} == {0}


@pytest.mark.parametrize("factor", [2, 2.0, 3.0, 10, 10.0, 1e300, 10**400])
def test_exponential_of_a_huge_attempt_number_is_the_cap(factor: float) -> None:
    policy = Exponential(base=1.0, factor=factor, cap=600, jitter=False)
    assert policy(10**9) == 600
    assert policy(10**18) == 600


def test_exponential_jitter_stays_between_half_and_all_of_the_delay() -> None:
    policy = Exponential(base=8, cap=100)
    for attempt, full in [(1, 8), (2, 16), (3, 32), (10, 100)]:
        delays = [policy(attempt) for _ in range(200)]
        assert all(full / 2 <= d <= full for d in delays)
        assert len(set(delays)) > 1  # jittered, not constant


def test_exponential_jitter_of_a_capped_delay_stays_within_the_cap() -> None:
    policy = Exponential(base=1, factor=10, cap=60)
    assert all(30 <= policy(10**6) <= 60 for _ in range(100))


@pytest.mark.parametrize("factor", [0.5, 0.0, -2.0, math.nan])
def test_exponential_refuses_a_factor_below_one(factor: float) -> None:
    with pytest.raises(ValueError, match=r"^factor must be at least 1"):
        Exponential(factor=factor)


@pytest.mark.parametrize("field", ["base", "cap"])
def test_exponential_refuses_a_negative_base_or_cap(field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must be between 0 and"):
        Exponential(**{field: -1.0})


# --- as_policy --------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [15, 15.0])
def test_a_number_is_a_fixed_delay(spec: float) -> None:
    assert as_policy(spec) == Fixed(15.0)


def test_a_timedelta_is_a_fixed_delay() -> None:
    assert as_policy(timedelta(minutes=2)) == Fixed(120.0)


def test_a_policy_is_taken_as_it_is() -> None:
    policy = Exponential(base=3)
    assert as_policy(policy) is policy


def test_a_callable_is_taken_as_it_is() -> None:
    def policy(attempt: int) -> float:
        return attempt * 1.5

    assert as_policy(policy) is policy


@pytest.mark.parametrize("spec", [True, "30", None, [30]])
def test_other_specs_are_refused_with_a_type_error(spec: object) -> None:
    with pytest.raises(TypeError, match=r"^retry must be a policy, a callable or seconds, not"):
        as_policy(spec)  # type: ignore[arg-type]


def test_a_negative_number_is_refused() -> None:
    with pytest.raises(ValueError, match="must be between 0 and"):
        as_policy(-5)


def test_a_negative_timedelta_is_refused() -> None:
    with pytest.raises(ValueError, match="must be between 0 and"):
        as_policy(timedelta(seconds=-1))


# --- seconds ----------------------------------------------------------------------------------


def test_seconds_takes_numbers_and_timedeltas() -> None:
    assert seconds(3, "delay") == 3.0
    assert seconds(2.5, "delay") == 2.5
    assert seconds(timedelta(milliseconds=1500), "delay") == 1.5


@pytest.mark.parametrize("value", [-1, math.nan, math.inf, timedelta(days=-1)])
def test_seconds_refuses_no_delay_and_names_it(value: float | timedelta) -> None:
    with pytest.raises(ValueError, match=r"^Retry\(after=…\) must be between 0 and"):
        seconds(value, "Retry(after=…)")


@pytest.mark.parametrize("value", ["5", True, None])
def test_seconds_refuses_what_is_no_number_and_names_it(value: object) -> None:
    with pytest.raises(TypeError, match=r"^timeout must be seconds or a timedelta, not "):
        seconds(value, "timeout")  # type: ignore[arg-type]


def test_seconds_refuses_more_than_the_longest_delay() -> None:
    with pytest.raises(ValueError, match=r"^timeout must be between 0 and 315360000 seconds, not"):
        seconds(timedelta(days=365 * 11), "timeout")


# --- delay_of ---------------------------------------------------------------------------------


def test_delay_of_a_good_policy_is_its_delay_and_no_problem() -> None:
    assert delay_of(Linear(10), 3, Fixed(1)) == (30.0, None)


def test_delay_of_converts_an_int_to_a_float() -> None:
    delay, problem = delay_of(lambda attempt: 4, 1, Fixed(1))
    assert (delay, type(delay), problem) == (4.0, float, None)


def test_delay_of_a_policy_that_raises_is_the_fallback_with_the_error() -> None:
    def broken(attempt: int) -> float:
        raise KeyError("x")

    assert delay_of(broken, 2, Linear(5)) == (10, "retry policy raised KeyError: 'x'")


@pytest.mark.parametrize("bad", [math.nan, -0.5, math.inf, MAX_DELAY_SEC + 1])
def test_delay_of_a_policy_returning_no_delay_is_the_fallback(bad: float) -> None:
    delay, problem = delay_of(lambda attempt: bad, 2, Linear(5))
    assert delay == 10
    assert problem == f"retry policy returned {bad!r}, not a delay in seconds"


def test_delay_of_a_policy_returning_an_int_too_big_for_a_float_is_the_fallback() -> None:
    delay, problem = delay_of(lambda attempt: 10**400, 1, Fixed(3))
    assert delay == 3
    assert problem is not None
    assert problem.startswith("retry policy raised OverflowError")


def test_delay_of_accepts_the_bounds() -> None:
    assert delay_of(lambda attempt: 0, 1, Fixed(3)) == (0.0, None)
    assert delay_of(lambda attempt: MAX_DELAY_SEC, 1, Fixed(3)) == (MAX_DELAY_SEC, None)
