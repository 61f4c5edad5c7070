"""`dataloader processes …` as a user runs it: the real script in a subprocess, against a
database whose processes a Runner of this test runs (the command itself needs no processor)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from dataloader import Runner, Settings
from tests.orders import registry as orders

from .operators import Cli, failed_in_one_line


@pytest.fixture
async def running(make_settings: Callable[..., Settings]) -> AsyncIterator[Runner]:
    settings = make_settings(workers=[{"queue": "orders", "concurrency": 2}])
    async with Runner(settings, orders.copy()) as runner:
        yield runner


async def test_a_process_is_started_called_shown_listed_and_removed(
    cli: Cli, running: Runner
) -> None:
    started = await cli.json("processes", "start", "orders", "o-1", "--args", '{"total": 10}')
    assert started["response"] == {"state": "awaiting_payment"}
    paid = await cli.json("processes", "call", "orders", "o-1", "--args", '{"pay": 10}')
    assert paid["response"] == {"state": "paid"}
    shown = await cli.json("processes", "show", "orders", "o-1")
    assert (shown["status"], shown["aux_state"]["state"]) == ("running", "paid")
    assert shown["timer"]["kind"] == "remove"
    events = await cli.json("processes", "events", "orders", "o-1", "--after", "1")
    assert [e["event_id"] for e in events["events"]] == [2]
    listed = await cli.json("processes", "list", "--namespace", "orders")
    assert [p["process_id"] for p in listed["processes"]] == ["o-1"]
    table = await cli("processes", "list")
    assert "o-1" in table.stdout
    assert "running" in table.stdout
    await cli.json("processes", "remove", "orders", "o-1")
    gone = await cli("processes", "show", "orders", "o-1")
    assert "process 'o-1' of namespace 'orders' not found" in failed_in_one_line(gone, 1)


async def test_a_process_in_error_is_refused_a_call_and_repaired(cli: Cli, running: Runner) -> None:
    await cli.json("processes", "start", "orders", "o-1", "--args", '{"total": 10}')
    failed = await cli("processes", "call", "orders", "o-1", "--args", '{"boom": "x"}')
    assert "RuntimeError: x" in failed_in_one_line(failed, 1)
    refused = await cli("processes", "call", "orders", "o-1")
    assert "is in error: only a repair is accepted" in failed_in_one_line(refused, 1)
    errors = await cli.json("processes", "list", "--status", "error")
    assert [p["process_id"] for p in errors["processes"]] == ["o-1"]
    repaired = await cli.json("processes", "repair", "orders", "o-1")
    assert repaired["response"] == {"repaired": True}


async def test_a_repeated_keyed_call_prints_its_answer_after_the_process_failed(
    cli: Cli, running: Runner
) -> None:
    await cli.json("processes", "start", "orders", "o-1", "--args", '{"total": 10}')
    key = ("--idempotency-key", "pay-1")
    paid = await cli.json("processes", "call", "orders", "o-1", "--args", '{"x": 1}', *key)
    failed = await cli("processes", "call", "orders", "o-1", "--args", '{"boom": "x"}')
    assert "RuntimeError: x" in failed_in_one_line(failed, 1)
    again = await cli.json("processes", "call", "orders", "o-1", "--args", '{"x": 1}', *key)
    assert again == paid


@pytest.mark.parametrize("process_id", ["report/call", "events", "call"])
async def test_any_id_is_one_argument(cli: Cli, running: Runner, process_id: str) -> None:
    await cli.json("processes", "start", "orders", process_id, "--args", '{"total": 1}')
    called = await cli.json("processes", "call", "orders", process_id, "--args", "{}")
    assert called["response"] == {"echo": {}, "seen": 1}
    shown = await cli.json("processes", "show", "orders", process_id)
    assert shown["process_id"] == process_id
    events = await cli.json("processes", "events", "orders", process_id)
    assert [e["event_id"] for e in events["events"]] == [1, 2]
    await cli.json("processes", "remove", "orders", process_id)
    gone = await cli("processes", "show", "orders", process_id)
    assert "not found" in failed_in_one_line(gone, 1)


async def test_an_id_a_url_cannot_carry_is_refused_in_one_line(cli: Cli) -> None:
    refused = await cli("processes", "start", "orders", "..")
    assert "cannot be a segment of a URL's path" in failed_in_one_line(refused, 2)


async def test_a_call_that_gets_no_answer_in_time_exits_5_with_its_task(cli: Cli) -> None:
    # no worker runs the queue: the init waits
    late = await cli("processes", "start", "orders", "o-1", "--timeout", "0.2", "--json")
    assert late.returncode == 5, late
    assert "has not answered within 0.2 s" in late.stdout


async def test_bad_args_are_one_line_and_exit_2(cli: Cli) -> None:
    bad = await cli("processes", "call", "orders", "o-1", "--args", "{nope")
    assert "--args: not JSON" in failed_in_one_line(bad, 2)
    not_object = await cli("processes", "call", "orders", "o-1", "--args", "[1]")
    assert "must be a JSON object" in failed_in_one_line(not_object, 2)
