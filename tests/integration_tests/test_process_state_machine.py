"""Durable processes, driven by hypothesis against real PostgreSQL and a service's workers, and
compared after every step with a small model of their semantics (`ProcessHarness`, which runs
the same processor by the rules in `core.processes`, in memory).

Random sequences of starts (with the same or other args), calls (appending events, setting,
replacing and unsetting timers, failing, crashing: a step that outruns its timeout is a
zombie), calls to ids never started or removed, repairs and removals. After each one, every
process the model knows is read back: its status, state, detail, history and pending timer's
kind must be the model's, and what the caller got (a response, or which refusal) too.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from dataloader import (
    Process,
    ProcessConflict,
    ProcessNotFound,
    ProcessResult,
    ProcessTask,
    ProcessTaskFailed,
    Runner,
    SetTimer,
    Settings,
    TaskRegistry,
    UnsetTimer,
)
from dataloader.testing import ProcessHarness

T = TypeVar("T")
NAMESPACE = "machine"
#: Timers set by the machine's calls are due far later than any example runs.
LATER = 3600.0
#: A crash: a step that sleeps past the namespace's step timeout.
STEP_TIMEOUT = 0.5

registry = TaskRegistry()


@registry.process(NAMESPACE, queue="machine", step_timeout=STEP_TIMEOUT, attempts=1, retry=0)
async def machine(task: ProcessTask, process: Process) -> ProcessResult:
    """Steered by its args: append them, set, replace or unset a timer, fail, or hang."""
    args: dict[str, Any] = task.args if isinstance(task.args, dict) else {}
    if args.get("hang"):
        await asyncio.sleep(STEP_TIMEOUT * 4)
    if args.get("fail"):
        raise RuntimeError("asked to fail")
    action: Any = None
    if args.get("timer"):
        action = SetTimer(in_sec=LATER + args["timer"])
    elif args.get("unset"):
        action = UnsetTimer()
    return ProcessResult(
        events=[args],
        aux_state={"n": (process.aux_state or {}).get("n", 0) + 1},
        detail=f"{task.kind.value} {process.last_event_id}",
        response={"seen": process.last_event_id},
        action=action,
    )


#: A call's args; `hang` is a crash (a step that outruns its timeout: a zombie).
CALLS = st.sampled_from(
    [
        {"k": 1},
        {"timer": 1},
        {"timer": 2},
        {"unset": True},
        {"k": 2},
        {"timer": 3},
        {"unset": True},
        {"fail": True},
        {"hang": True},
    ]
)
IDS = st.sampled_from(["a", "b", "c"])
ARGS = st.sampled_from([None, {"x": 1}, {"x": 2}])


def outcome(value: Any) -> Any:
    """What a caller got, as the model and the service are compared: the response, or the
    kind of refusal."""
    if isinstance(value, ProcessConflict):
        return ("conflict", value.reason)
    if isinstance(value, ProcessNotFound):
        return "not found"
    if isinstance(value, ProcessTaskFailed):
        return "task failed"
    if isinstance(value, BaseException):
        raise value
    return value


class ProcessMachine(RuleBasedStateMachine):
    """One example: a service with the machine's workers, processes of ids unique to it."""

    started = Bundle("started")

    dsn = ""  # set by the test

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.prefix = uuid.uuid4().hex[:8]
        settings_ = Settings(  # type: ignore[call-arg]
            _env_file=None,
            db_dsn=self.dsn,
            workers=[{"queue": "machine", "concurrency": 2}],
            heartbeat_sec=0.2,
            auto_migrate=False,
            poll_interval_sec=300,
            shutdown_timeout_sec=5,
        )
        self.runner = Runner(settings_, registry)
        self.run(self.runner.__aenter__())
        self.model = ProcessHarness(NAMESPACE, registry=registry)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def teardown(self) -> None:
        self.run(self.runner.__aexit__(None, None, None))
        self.loop.close()

    def both(self, real: Coroutine[Any, Any, Any], model: Coroutine[Any, Any, Any]) -> None:
        """Make the same request of the service and of the model: the same answer."""
        got = self.run(_caught(real))
        expected = self.run(_caught(model))
        assert outcome(got) == outcome(expected)

    def pid(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    @rule(target=started, name=IDS, args=ARGS)
    def start(self, name: str, args: Any) -> str:
        processes = self.runner.client.processes
        self.both(
            processes.start(NAMESPACE, self.pid(name), args, timeout=30),
            self.model.start(self.pid(name), args),
        )
        return name

    @rule(name=started, args=CALLS)
    def call(self, name: str, args: dict[str, Any]) -> None:
        processes = self.runner.client.processes
        self.both(
            processes.call(NAMESPACE, self.pid(name), args, timeout=30),
            self.model.call(self.pid(name), args),
        )

    @rule(name=IDS)
    def call_any(self, name: str) -> None:
        """A call to an id that may never have been started, or was removed."""
        self.call(name, {"k": 0})

    @rule(name=started)
    def repair(self, name: str) -> None:
        processes = self.runner.client.processes
        self.both(
            processes.repair(NAMESPACE, self.pid(name), {"k": "repair"}, timeout=30),
            self.model.repair(self.pid(name), {"k": "repair"}),
        )

    @rule(name=started)
    def remove(self, name: str) -> None:
        processes = self.runner.client.processes
        self.both(
            processes.remove(NAMESPACE, self.pid(name), timeout=30),
            self.model.remove(self.pid(name)),
        )

    @invariant()
    def every_process_is_as_the_model_says(self) -> None:
        processes = self.runner.client.processes
        for name in ("a", "b", "c"):
            pid = self.pid(name)
            expected = self.model.get(pid)
            got = self.run(processes.get(NAMESPACE, pid))
            if expected is None:
                assert got is None, pid
                continue
            assert got is not None, pid
            assert (got.status, got.aux_state, got.detail, got.last_event_id) == (
                expected.status,
                expected.aux_state,
                expected.detail,
                expected.last_event_id,
            ), pid
            assert (got.timer is None) == (expected.timer is None), pid
            if got.timer is not None and expected.timer is not None:
                assert got.timer.kind == expected.timer.kind
            history = self.run(processes.events(NAMESPACE, pid, limit=1000))
            assert [e.payload for e in history] == [e.payload for e in expected.history], pid
            assert [e.event_id for e in history] == list(range(1, len(history) + 1)), pid


async def _caught(coroutine: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await coroutine
    except (ProcessConflict, ProcessNotFound, ProcessTaskFailed) as refused:
        return refused


@pytest.fixture
def process_machine(db_dsn: str) -> type[ProcessMachine]:
    ProcessMachine.dsn = db_dsn
    return ProcessMachine


def test_processes_behave_as_their_model(process_machine: type[ProcessMachine]) -> None:
    run = process_machine.TestCase
    run.settings = settings(
        max_examples=40,
        stateful_step_count=25,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    run().runTest()
