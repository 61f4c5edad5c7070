"""The one rule of where a job of a task may go (`core.routing`)."""

from __future__ import annotations

import pytest

from dataloader.core.routing import (
    Destination,
    KnownTasks,
    Route,
    check_destinations,
    check_route,
    route,
)
from dataloader.exceptions import ConfigError, InvalidJob, UnknownTask

KNOWN = KnownTasks(
    {
        "etl.load": frozenset({"etl"}),
        "any.queue": frozenset({None}),
        "moved": frozenset({"a", "b"}),
    },
    served=frozenset({"etl", "default"}),
)


@pytest.mark.parametrize(
    ("task", "queue", "expected"),
    [
        ("etl.load", "etl", Route.RUNNABLE),
        ("etl.load", "default", Route.WRONG_QUEUE),
        ("any.queue", "default", Route.RUNNABLE),  # a definition without a queue takes any
        ("moved", "b", Route.RUNNABLE),  # versions disagree (a rolling upgrade): either
        ("moved", "c", Route.WRONG_QUEUE),
        ("typo", "etl", Route.UNRUNNABLE),  # its queue's processes would fail it
        ("typo", "nobody", Route.AWAITED),  # its consumers are away: it waits
    ],
)
def test_route(task: str, queue: str, expected: Route) -> None:
    assert route(task, queue, KNOWN) is expected


def test_check_route_refuses_only_certain_mistakes() -> None:
    with pytest.raises(InvalidJob, match="task 'moved' runs on queue 'a' or 'b', not 'c'"):
        check_route("moved", "c", KNOWN, allow_unknown=True)
    with pytest.raises(UnknownTask, match="live processes serve queue 'etl'"):
        check_route("typo", "etl", KNOWN)
    assert check_route("typo", "etl", KNOWN, allow_unknown=True) is Route.UNRUNNABLE
    assert check_route("typo", "nobody", KNOWN) is Route.AWAITED


def test_check_destinations_refuses_the_first_mistake_and_returns_the_awaited() -> None:
    awaited = Destination("schedule 'a'", "typo", "nobody")
    unknown_queue = Destination("a stage (then=) of task 'p'", "typo", None)
    known_anywhere = Destination("a stage (then=) of task 'p'", "etl.load", None)
    found = check_destinations(
        [awaited, unknown_queue, known_anywhere, Destination("s", "etl.load", "etl")],
        KNOWN,
        allow_unknown=False,
    )
    assert found == [awaited, unknown_queue]
    with pytest.raises(
        ConfigError, match=r"^schedule 'b': queue: task 'etl\.load' runs on queue 'etl', not 'x'$"
    ):
        check_destinations(
            [Destination("schedule 'b'", "etl.load", "x")], KNOWN, allow_unknown=True
        )
    with pytest.raises(ConfigError, match=r"^schedule 'c': task 'typo' is unknown"):
        check_destinations([Destination("schedule 'c'", "typo", "etl")], KNOWN, allow_unknown=False)
    unrunnable = Destination("schedule 'c'", "typo", "etl")
    assert check_destinations([unrunnable], KNOWN, allow_unknown=True) == [unrunnable]
