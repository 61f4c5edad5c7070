"""Stages: the jobs a success enqueues (a task's `then=`, the handler's `ctx.then`), built
with the checks and defaults of any enqueue, and written in the transaction of the success
(`WorkerProtocol.finish`).

Each stage job's idempotency key names the job and the claim that made it (`stage_key`): the
write of an outcome that is tried again after a lost connection enqueues its stages once, and a
job that runs again (a re-run on update, a retry by hand) enqueues them again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dataloader.core import limits
from dataloader.core.models import NewJob, Stage, stage_key
from dataloader.storage.protocol import ClaimedJob
from dataloader.tasks import Task

if TYPE_CHECKING:
    from dataloader.client import Client


def stages_of(task: Task, asked: Sequence[Stage], result_json: str | None) -> list[Stage]:
    """The task's own next stages (the result as their args), then those the run asked for."""
    return [*(Stage(name, _as_args(result_json)) for name in task.then), *asked]


def stage_jobs(parent: ClaimedJob, stages: Sequence[Stage], client: Client) -> tuple[NewJob, ...]:
    """The jobs of `stages` after `parent`, checked and filled as `client.job` does (args
    against the stage task's model; InvalidJob, InvalidJobArgs)."""
    jobs = []
    for n, stage in enumerate(stages):
        known = client.registry.get(stage.task)
        own_queue = known is not None and known.queue is not None
        jobs.append(
            client.job(
                stage.task,
                stage.args,
                # a lock_free job's stages are lock_free too
                lock_key=stage.lock_key if stage.lock_key is not None else parent.lock_key,
                partition_key=(
                    stage.partition_key if stage.partition_key is not None else parent.partition_key
                ),
                queue=stage.queue if stage.queue is not None or own_queue else parent.queue,
                priority=stage.priority,
                available_at=stage.delay,
                idempotency_key=stage_key(parent.job_id, parent.claim_token, n),
                # a name at its limit leaves no room for the prefix: the label is cut to fit
                producer=f"stage:{parent.task}"[: limits.NAME_MAX_CHARS],
            )
        )
    return tuple(jobs)


def _as_args(result_json: str | None) -> dict[str, Any]:
    """A result as the next stage's args: itself when it is a JSON object."""
    result = None if result_json is None else json.loads(result_json)
    return result if isinstance(result, dict) else {"result": result}
