"""Retry policies: how long a failed attempt waits before the next one. No I/O.

A policy is called with the number of the attempt that just failed (1 for the first run) and
returns seconds. Any callable `(attempt) -> seconds` is a policy; these are the usual ones:

    @dataloader.task("etl.load", retry=dataloader.Exponential(base=5, cap=600))

`Linear(30)` is the default: the n-th failure waits 30 s × n, as the service always did
(`DL_RETRY_BASE_SEC` sets its base).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeAlias

#: Seconds to wait after attempt number `attempt` (1 for the first run) failed.
RetryPolicy: TypeAlias = Callable[[int], float]
#: What a task's `retry=` accepts: a policy, or seconds (a fixed delay).
RetrySpec: TypeAlias = RetryPolicy | float | int | timedelta


@dataclass(frozen=True, slots=True)
class Linear:
    """`base` × attempt seconds: 30, 60, 90 … for the default base of 30."""

    base: float = 30.0

    def __post_init__(self) -> None:
        _check_delay("base", self.base)

    def __call__(self, attempt: int) -> float:
        return self.base * attempt


@dataclass(frozen=True, slots=True)
class Fixed:
    """The same delay after every failure."""

    seconds: float

    def __post_init__(self) -> None:
        _check_delay("seconds", self.seconds)

    def __call__(self, attempt: int) -> float:
        return self.seconds


@dataclass(frozen=True, slots=True)
class Exponential:
    """`base` × `factor`^(attempt − 1), at most `cap`; with `jitter`, a random delay between
    half of that and all of it, so that jobs failing together do not all come back together."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: bool = True

    def __post_init__(self) -> None:
        _check_delay("base", self.base)
        _check_delay("cap", self.cap)
        if not self.factor >= 1:  # also refuses NaN
            raise ValueError(f"factor must be at least 1, not {self.factor}")

    def __call__(self, attempt: int) -> float:
        # the exponent is bounded so that an int factor's power stays small; a float's power
        # may still overflow (3.0 ** 1000), and is then far beyond any cap
        try:
            growth = float(self.factor) ** min(attempt - 1, 1000)
        except OverflowError:
            growth = math.inf
        delay = min(self.cap, self.base * growth) if self.base else 0.0
        if self.jitter:
            delay = random.uniform(delay / 2, delay)
        return delay


def as_policy(spec: RetrySpec) -> RetryPolicy:
    """A task's `retry=` as a policy: a number or timedelta is `Fixed`."""
    if isinstance(spec, timedelta):
        return Fixed(spec.total_seconds())
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        return Fixed(float(spec))
    if callable(spec):
        return spec
    raise TypeError(f"retry must be a policy, a callable or seconds, not {type(spec).__name__}")


def seconds(value: float | timedelta, name: str) -> float:
    """A delay given as seconds or a timedelta, checked."""
    if isinstance(value, timedelta):
        delay = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        delay = float(value)
    else:
        raise TypeError(f"{name} must be seconds or a timedelta, not {type(value).__name__}")
    _check_delay(name, delay)
    return delay


def _check_delay(name: str, value: float) -> None:
    if not 0 <= value <= MAX_DELAY_SEC:
        raise ValueError(f"{name} must be between 0 and {MAX_DELAY_SEC:.0f} seconds, not {value}")


#: Longest delay a policy or a job may ask for, and the longest retention of finished jobs:
#: ten years. PostgreSQL's intervals go much further, nothing here has a reason to; and its
#: calendar does not (now() less 10^12 s lies before 4713 BC, where it begins).
MAX_DELAY_SEC = 10 * 365 * 86_400.0


def delay_of(policy: RetryPolicy, attempt: int, fallback: RetryPolicy) -> tuple[float, str | None]:
    """`policy(attempt)`, or `fallback(attempt)` with the reason when the policy raised or
    returned something that is not a delay (a user's callable can)."""
    try:
        delay = float(policy(attempt))
    except Exception as exc:
        return fallback(attempt), f"retry policy raised {type(exc).__name__}: {exc}"
    if not 0 <= delay <= MAX_DELAY_SEC:  # also false for NaN
        return fallback(attempt), f"retry policy returned {delay!r}, not a delay in seconds"
    return delay, None
