"""Where pipelines are registered: the task definitions of `dataloader.tasks` under this path,
and their older names.

    from dataloader.workers.pipelines.registry import TaskRegistry, task

`Task`, `TaskRegistry`, the `task` decorator and the process-wide `registry` are those of
`dataloader.tasks` (the same objects, imported from there); `pipeline`, `Pipeline` and
`PipelineRegistry` are their older names, kept for existing code.
"""

from __future__ import annotations

from dataloader.tasks import H, Handler, Task, TaskRegistry, describe, registry, task

#: Older names, kept for existing code.
Pipeline = Task
PipelineRegistry = TaskRegistry
#: `@pipeline("name", args=Model)`: the older spelling of `task`.
pipeline = registry.register

__all__ = [
    "H",
    "Handler",
    "Pipeline",
    "PipelineRegistry",
    "Task",
    "TaskRegistry",
    "describe",
    "pipeline",
    "registry",
    "task",
]
