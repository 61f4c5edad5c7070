"""The history a step is given is decoded only when its processor reads it."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from dataloader.core.processes import Event
from dataloader.storage.processes import LazyHistory

TASK = uuid.uuid4()


def history_json(n: int) -> str:
    """`n` events as STEP_INPUT sends them (timestamps as PostgreSQL writes them in JSON)."""
    return json.dumps(
        [
            {
                "event_id": i,
                "task_id": str(TASK),
                "ts": f"2026-11-26T02:00:0{i}.123456+03:00",
                "payload": {"n": i, "text": "<é>"},
                "metadata": None if i % 2 else {"by": "test"},
            }
            for i in range(1, n + 1)
        ]
    )


def test_the_events_read_are_the_events_sent() -> None:
    history = LazyHistory(history_json(3))
    assert len(history) == 3
    first = history[0]
    assert first == Event(
        event_id=1,
        payload={"n": 1, "text": "<é>"},
        metadata=None,
        task_id=TASK,
        ts=datetime(2026, 11, 26, 2, 0, 1, 123456, tzinfo=timezone(timedelta(hours=3))),
    )
    assert first.ts == datetime(2026, 11, 25, 23, 0, 1, 123456, tzinfo=UTC)  # the same instant
    assert history[1].metadata == {"by": "test"}
    assert [e.event_id for e in history[1:]] == [2, 3]
    assert [e.event_id for e in history] == [1, 2, 3]
    assert history == tuple(history)
    assert list(reversed(history)) == list(reversed(tuple(history)))


def test_an_empty_history_is_an_empty_sequence() -> None:
    history = LazyHistory("[]")
    assert len(history) == 0
    assert history == ()
    assert not history


def test_nothing_is_decoded_until_the_history_is_read() -> None:
    history = LazyHistory("not JSON: decoding it would fail")  # a processor that never reads it
    with pytest.raises(json.JSONDecodeError):
        len(history)
