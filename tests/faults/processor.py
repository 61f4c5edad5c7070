"""The durable process the fault scenarios run (namespace `faulty`, queue `fault-processes`),
loaded by the service processes beside the fault pipeline (`DL_PIPELINE_MODULES`).

Each task appends its args as an event; `{"sleep": s}` holds the step that long (a step a
replica is killed in), `{"timer": s}` sets a timer `s` seconds away. Not idempotent: a task
whose worker dies half-way makes its process a zombie."""

from __future__ import annotations

import asyncio
from typing import Any

from dataloader import Process, ProcessResult, ProcessTask, SetTimer, process

NAMESPACE = "faulty"
QUEUE = "fault-processes"


@process(NAMESPACE, queue=QUEUE, step_timeout=120)
async def faulty(task: ProcessTask, process: Process) -> ProcessResult:
    args: dict[str, Any] = task.args if isinstance(task.args, dict) else {}
    if "sleep" in args:
        await asyncio.sleep(args["sleep"])
    action = SetTimer(in_sec=args["timer"]) if "timer" in args else None
    return ProcessResult(
        events=[{"kind": task.kind.value, "args": task.args}],
        response={"seen": process.last_event_id},
        action=action,
    )
