"""A job's attempts as its page shows them, read from its journal; a stage's parent, read from
its idempotency_key."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from dataloader.core.models import JobEvent, stage_key, stage_parent
from dataloader.dashboard.jobs import Attempt, attempts_of

T0 = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)


def journal(*entries: tuple[str, dict[str, Any] | None]) -> list[JobEvent]:
    return [
        JobEvent(n, kind, T0 + timedelta(seconds=n), payload)
        for n, (kind, payload) in enumerate(entries)
    ]


def test_each_picked_starts_an_attempt_that_the_next_end_closes() -> None:
    events = journal(
        ("queued", {"by": "api"}),
        ("picked", {"attempt": 1, "worker": "w1"}),
        ("progress", {"done": 1}),
        ("requeue", {"reason": "error", "error": "E: boom", "traceback": "Traceback…"}),
        ("picked", {"attempt": 2, "worker": "w2"}),
        ("cancel_requested", {"by": "api"}),
        ("canceled", {}),
        ("retried", {"by": "ops"}),
        ("picked", {"attempt": 1, "worker": "w1"}),
    )
    assert attempts_of(events) == [
        Attempt(1, "w1", T0 + timedelta(seconds=1), T0 + timedelta(seconds=3), "requeue",
                "E: boom", "Traceback…"),
        Attempt(2, "w2", T0 + timedelta(seconds=4), T0 + timedelta(seconds=6), "canceled"),
        Attempt(1, "w1", T0 + timedelta(seconds=8)),  # running
    ]  # fmt: skip


def test_an_end_without_an_attempt_is_no_attempt() -> None:
    # a queued job canceled before any claim; a payload that is not an object
    events = journal(("queued", None), ("canceled", None), ("picked", None), ("lost", None))
    (only,) = attempts_of(events)
    assert (only.number, only.worker, only.outcome, only.error) == (None, None, "lost", None)


def test_a_stage_names_its_parent_and_nothing_else_does() -> None:
    parent = uuid.uuid4()
    assert stage_parent(stage_key(parent, uuid.uuid4(), 3)) == parent
    assert stage_parent(stage_key(parent, None, 0)) == parent
    for key in (None, "", "day:1", "stage:", "stage:not-a-uuid:x:0", f"Stage:{parent}:x:0"):
        assert stage_parent(key) is None, key
