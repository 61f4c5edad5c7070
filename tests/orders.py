"""An order as a durable process, for the tests of processes: it waits for its payment, sends
a reminder after a day, and is canceled after a second day without payment; a paid order is
removed a week later."""

from __future__ import annotations

from typing import Any

from dataloader import (
    Process,
    ProcessResult,
    ProcessTask,
    Remove,
    SetTimer,
    TaskKind,
    TaskRegistry,
    UnsetTimer,
)

DAY = 86_400.0
registry = TaskRegistry()


@registry.process("orders", history=10, step_timeout=10, attempts=2, retry=0)
async def order(task: ProcessTask, process: Process) -> ProcessResult:
    state: dict[str, Any] = dict(process.aux_state or {})
    if task.kind is TaskKind.INIT:
        state = {"state": "awaiting_payment", "total": task.args["total"], "reminders": 0}
        return ProcessResult(
            events=[{"created": task.args}],
            aux_state=state,
            response={"state": "awaiting_payment"},
            action=SetTimer(in_sec=DAY),
        )
    if task.kind is TaskKind.TIMEOUT:
        if state["reminders"] == 0:
            state["reminders"] = 1
            return ProcessResult(
                events=[{"reminded": 1}], aux_state=state, action=SetTimer(in_sec=DAY)
            )
        state["state"] = "canceled"
        return ProcessResult(events=[{"canceled": "unpaid"}], aux_state=state, detail="unpaid")
    if task.kind is TaskKind.REPAIR:
        return ProcessResult(events=[{"repaired": True}], response={"repaired": True})
    args = task.args or {}
    if "boom" in args:
        raise RuntimeError(args["boom"])
    if "pay" in args:
        if state["state"] != "awaiting_payment":
            return ProcessResult(response={"error": f"the order is {state['state']}"})
        state["state"] = "paid"
        return ProcessResult(
            events=[{"paid": args["pay"]}],
            aux_state=state,
            response={"state": "paid"},
            action=Remove(in_sec=7 * DAY),
        )
    if "cancel_timer" in args:
        return ProcessResult(response={"timer": "unset"}, action=UnsetTimer())
    return ProcessResult(events=[args], response={"echo": args, "seen": process.last_event_id})
