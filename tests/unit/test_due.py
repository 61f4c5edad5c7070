"""When a claim loop puts back its delayed jobs come due (`core.due`), and the loop that acts
on it (`QueueClaims`), driven by scripted answers of the database: no clock is read for the
decision, so a timer that wakes a few milliseconds before the database's clock reaches the
due time is reproduced exactly, every time."""

from __future__ import annotations

import math
import time
import uuid
from types import SimpleNamespace
from typing import Any, cast

import pytest

from dataloader.core.due import DUE_RETRY_SEC, PutBack, next_put_back_at
from dataloader.storage.protocol import ClaimRound
from dataloader.workers.claims import QueueClaims
from dataloader.workers.runtime import WorkerRuntime

NOW = 1000.0


def test_a_job_due_later_is_put_back_at_its_time_by_the_databases_clock() -> None:
    assert next_put_back_at(NOW, None, 0.25) == NOW + 0.25
    assert next_put_back_at(NOW, PutBack(0, 0.25), 0.25) == NOW + 0.25


def test_a_job_that_came_due_after_the_put_back_looked_is_put_back_at_once() -> None:
    """The loop woke 3 ms before the database's clock reached the due time: the put back found
    nothing due (the job due in 3 ms), the claim just after says it is due. Not a second
    later: at once."""
    woke_early = PutBack(0, 0.003)
    assert next_put_back_at(NOW, woke_early, -0.001) == NOW
    assert next_put_back_at(NOW, woke_early, 0.0) == NOW
    assert next_put_back_at(NOW, None, -0.5) == NOW  # due by the claim, not by the timer yet


def test_due_jobs_another_session_holds_are_tried_again_a_retry_period_later() -> None:
    assert next_put_back_at(NOW, PutBack(0, None, held=True), -0.1) == NOW + DUE_RETRY_SEC
    assert next_put_back_at(NOW, PutBack(3, 5.0, held=True), -0.1) == NOW + DUE_RETRY_SEC


def test_a_whole_batch_put_back_looks_again_at_once() -> None:
    assert next_put_back_at(NOW, PutBack(1000, None, held=True, full=True), -1.0) == NOW


def test_no_delayed_job_needs_no_timer() -> None:
    assert math.isinf(next_put_back_at(NOW, PutBack(1, None), None))


class ScriptedProtocol:
    """The database's answers to one claim round: a put back, then a claim."""

    def __init__(self, put_back: PutBack, due_in: float | None) -> None:
        self.put_back = put_back
        self.due_in = due_in
        self.put_backs = 0

    async def put_back_due(self, queue: str, limit: int) -> PutBack:
        self.put_backs += 1
        return self.put_back

    async def claim_round(self, *args: Any, **kwargs: Any) -> ClaimRound:
        return ClaimRound([], [], exhausted=True, next_due_in=self.due_in)

    async def park(self, blocked: list[uuid.UUID]) -> int:
        return 0


def claims_of(protocol: ScriptedProtocol) -> QueueClaims:
    runtime = SimpleNamespace(
        protocol=protocol,
        worker_id="w",
        registry=SimpleNamespace(tasks=list),
        settings=SimpleNamespace(poll_interval_sec=300.0),
    )
    return QueueClaims("q", cast(WorkerRuntime, runtime))


async def test_a_loop_woken_before_the_databases_due_time_puts_the_job_back_at_once() -> None:
    """The round the timer started found nothing to put back, and its claim says the job is
    due now: the loop claims again at once (`more`), and puts it back then."""
    protocol = ScriptedProtocol(PutBack(0, 0.003), due_in=-0.001)
    claims = claims_of(protocol)
    claimed = await claims.claim(10, now=time.monotonic())
    assert claimed.more
    assert claims.idle_timeout() <= 0.001 + 1e-9
    await claims.claim(10, now=time.monotonic())
    assert protocol.put_backs == 2


async def test_a_loop_leaves_due_jobs_another_session_holds_for_a_retry_period() -> None:
    protocol = ScriptedProtocol(PutBack(0, None, held=True), due_in=-0.001)
    claims = claims_of(protocol)
    claimed = await claims.claim(10, now=time.monotonic())
    assert not claimed.more
    assert claims.idle_timeout() == pytest.approx(DUE_RETRY_SEC, abs=0.1)


async def test_a_loop_sleeps_until_the_next_job_is_due_by_the_databases_clock() -> None:
    protocol = ScriptedProtocol(PutBack(0, 0.5), due_in=0.5)
    claims = claims_of(protocol)
    claimed = await claims.claim(10, now=time.monotonic())
    assert not claimed.more
    assert claims.idle_timeout() == pytest.approx(0.5, abs=0.1)
