"""Unit-test a processor without a database: `ProcessHarness` keeps processes in memory and
runs their tasks by the rules the workers follow (`core.processes`), on a clock of its own.

    from dataloader.testing import ProcessHarness

    async def test_an_unpaid_order_is_canceled_after_a_day() -> None:
        orders = ProcessHarness("orders")              # the registered processor of "orders"
        await orders.start("o-1", {"total": 10})
        await orders.advance(timedelta(days=1))        # its timer fires
        assert orders.get("o-1").aux_state["state"] == "canceled"

Tasks run one at a time, at once: `call` returns the processor's response or raises what a
client would (ProcessNotFound, ProcessConflict, ProcessTaskFailed). A processor that raises is
called again, its namespace's `attempts` times in all; the retry delays pass on the harness's
clock without sleeping. `advance` moves the clock and fires the timers that come due, in due
order. `get` returns a process with its whole history.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from dataloader.core import limits
from dataloader.core.processes import (
    KEEP,
    Before,
    Event,
    Process,
    ProcessFacts,
    ProcessStatus,
    ProcessTask,
    Refusal,
    StepWrite,
    TaskArgs,
    TaskKind,
    Timer,
    admit,
    admit_start,
    after_step,
    before_step,
    check_namespace,
    check_process_id,
    on_failure,
    on_removal,
    on_zombie,
    task_name_of,
)
from dataloader.exceptions import ProcessNotFound, ProcessTaskFailed, TaskTimeout
from dataloader.processes import refusal_error
from dataloader.tasks import Task, TaskRegistry
from dataloader.tasks import registry as default_registry
from dataloader.workers.executor import error_text
from dataloader.workers.processes import call_processor

#: Where a harness's clock starts.
EPOCH: Final = datetime(2026, 1, 1, tzinfo=UTC)
#: Largest value a step may store, as the service's default DL_MAX_RESULT_BYTES.
DEFAULT_MAX_BYTES: Final = 1_048_576


@dataclass
class _Live:
    """One process in memory: its row and its whole history."""

    ref: int
    process: Process
    init_args_json: str
    init_response: Any = None
    events: list[Event] = field(default_factory=list)

    def facts(self) -> ProcessFacts:
        timer = self.process.timer
        return ProcessFacts(
            self.ref,
            self.process.status,
            queue=self.process.queue,
            timer_task=None if timer is None else timer.task_id,
            init_args_json=self.init_args_json,
        )


class ProcessHarness:
    """The processes of one namespace, in memory, run by its processor in `registry`."""

    def __init__(
        self,
        namespace: str,
        *,
        registry: TaskRegistry | None = None,
        now: datetime = EPOCH,
        max_result_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        check_namespace(namespace)
        found = (registry or default_registry).get(task_name_of(namespace))
        if found is None or found.process is None:
            raise LookupError(f"no processor is registered for namespace {namespace!r}")
        self._task: Task = found
        self.namespace = namespace
        self.now = now
        self._max_bytes = max_result_bytes
        self._live: dict[str, _Live] = {}
        self._refs = 0
        #: Every task run, oldest first: (process_id, kind, task_id).
        self.tasks: list[tuple[str, TaskKind, uuid.UUID]] = []

    # tasks --------------------------------------------------------------------------------------

    async def start(
        self, process_id: str, args: Any = None, *, metadata: dict[str, Any] | None = None
    ) -> Any:
        """Start a process and return its init's response (a repeated start with the same
        args returns the first one's; with other args, ProcessConflict)."""
        check_process_id(process_id)
        args_json = limits.args_json({"args": args})
        live = self._live.get(process_id)
        if live is not None:
            if admit_start(live.facts(), args_json) is not None:
                raise refusal_error(Refusal.STARTED_WITH_OTHER_ARGS, self.namespace, process_id)
            return live.init_response
        self._refs += 1
        namespace = self._task.process
        assert namespace is not None
        live = self._live[process_id] = _Live(
            self._refs,
            Process(
                namespace=self.namespace,
                process_id=process_id,
                queue=namespace.queue,
                status=ProcessStatus.INIT,
                detail=None,
                aux_state=None,
                metadata=dict(metadata or {}),
                last_event_id=0,
                created_at=self.now,
                updated_at=self.now,
            ),
            args_json,
        )
        live.init_response = await self._run(live, TaskKind.INIT, args)
        return live.init_response

    async def call(self, process_id: str, args: Any = None) -> Any:
        """Call a process; its processor's response."""
        return await self._external(process_id, TaskKind.CALL, args)

    async def repair(self, process_id: str, args: Any = None) -> Any:
        """Repair a process in error; its processor's response."""
        return await self._external(process_id, TaskKind.REPAIR, args)

    async def remove(self, process_id: str) -> None:
        """Remove a process (its processor is not called)."""
        await self._external(process_id, TaskKind.REMOVE, None)

    async def advance(self, by: timedelta | float) -> list[tuple[str, TaskKind]]:
        """Move the clock on by `by` (seconds or a timedelta), firing every timer that comes
        due on the way, in due order (one a timer's step sets fires too, if due in time);
        which fired."""
        until = self.now + (by if isinstance(by, timedelta) else timedelta(seconds=by))
        fired = []
        while True:
            due = [
                (live.process.timer.due_at, pid)
                for pid, live in self._live.items()
                if live.process.timer is not None and live.process.timer.due_at <= until
            ]
            if not due:
                break
            at, pid = min(due)
            self.now = max(self.now, at)
            live = self._live[pid]
            timer = live.process.timer
            assert timer is not None
            fired.append((pid, timer.kind))
            # a failure leaves the process in error, as a worker would leave it
            with contextlib.suppress(ProcessTaskFailed):
                await self._run(live, timer.kind, None, timer.task_id, timer=True)
        self.now = until
        return fired

    async def zombie(self, process_id: str) -> None:
        """What a worker that dies half-way through a call leaves: the process in error, as
        if the call's second attempt found it a zombie (nothing else when the processor is
        idempotent: the call would run again)."""
        live = self._get(process_id)
        namespace = self._task.process
        assert namespace is not None
        if not namespace.idempotent:
            self._apply(live, on_zombie(live.facts(), uuid.uuid4()), uuid.uuid4())

    # readers ------------------------------------------------------------------------------------

    def get(self, process_id: str) -> Process | None:
        """The live process with its whole history, or None."""
        live = self._live.get(process_id)
        return None if live is None else replace(live.process, history=tuple(live.events))

    # running a task -------------------------------------------------------------------------------

    async def _external(self, process_id: str, kind: TaskKind, args: Any) -> Any:
        live = self._live.get(process_id)
        refusal = admit(kind, None if live is None else live.facts())
        if refusal is not None:
            raise refusal_error(refusal, self.namespace, process_id)
        assert live is not None
        return await self._run(live, kind, args)

    async def _run(
        self,
        live: _Live,
        kind: TaskKind,
        args: Any,
        task_id: uuid.UUID | None = None,
        *,
        timer: bool = False,
    ) -> Any:
        task_id = task_id or uuid.uuid4()
        pid = live.process.process_id
        self.tasks.append((pid, kind, task_id))
        namespace = self._task.process
        assert namespace is not None
        facts = live.facts()
        task = TaskArgs(live.ref, pid, kind, args, timer)
        before = before_step(facts, task, task_id, 1, idempotent=namespace.idempotent)
        if before is not Before.RUN:  # only a stale timer can get here: nothing happens
            return None
        if kind is TaskKind.REMOVE:
            self._apply(live, on_removal(facts, task_id), task_id)
            return None
        history = tuple(live.events[-namespace.history :]) if namespace.history else ()
        process = replace(live.process, history=history)
        try:
            result = await call_processor(
                self._task, ProcessTask(kind, args, task_id), process, self._sleep
            )
            write = after_step(facts, task, task_id, result, self._max_bytes)
        except Exception as exc:
            zombie = isinstance(exc, TaskTimeout) and not namespace.idempotent
            text = f"result: {exc}" if isinstance(exc, ValueError) else error_text(exc)
            broken = on_zombie(facts, task_id) if zombie else on_failure(facts, task_id, text)
            self._apply(live, broken, task_id)
            message = f"task {task_id} of process {pid!r} failed: {text}"
            raise ProcessTaskFailed(message, task_id) from exc
        self._apply(live, write, task_id)
        return None if write.response_json is None else json.loads(write.response_json)

    async def _sleep(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def _apply(self, live: _Live, write: StepWrite, task_id: uuid.UUID) -> None:
        """What storage does with `write` (`storage.processes.save_process`), in memory."""
        process = live.process
        pid = process.process_id
        if write.removed:
            del self._live[pid]
            return
        events = [
            Event(
                process.last_event_id + n,
                json.loads(payload),
                None if meta is None else json.loads(meta),
                task_id,
                self.now,
            )
            for n, (payload, meta) in enumerate(write.events, 1)
        ]
        live.events.extend(events)
        timer = process.timer
        if write.clear_timer:
            timer = None
        if write.new_timer is not None:
            due = write.new_timer.at or self.now + timedelta(seconds=write.new_timer.in_sec or 0)
            timer = Timer(write.new_timer.kind, due, uuid.uuid4())
        live.process = replace(
            process,
            status=write.status or process.status,
            detail=process.detail if write.detail is KEEP else write.detail,
            aux_state=process.aux_state
            if write.aux_state_json is KEEP
            else json.loads(write.aux_state_json),
            metadata=process.metadata
            if write.metadata_json is KEEP
            else json.loads(write.metadata_json),
            corrupted_by=process.corrupted_by if write.corrupted_by is KEEP else write.corrupted_by,
            last_event_id=process.last_event_id + len(events),
            timer=timer,
            updated_at=self.now,
        )

    def _get(self, process_id: str) -> _Live:
        live = self._live.get(process_id)
        if live is None:
            raise ProcessNotFound(self.namespace, process_id)
        return live
