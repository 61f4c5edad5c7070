"""`GET /api/v1/tasks`: the contracts live workers publish (dl_workers.task_specs)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext

from .conftest import StartService


class ReportArgs(BaseModel):
    region: str


async def tasks_of(service: Any) -> list[dict[str, Any]]:
    response = await service.client.get("/api/v1/tasks")
    assert response.status_code == 200, response.text
    tasks: list[dict[str, Any]] = response.json()["tasks"]
    return tasks


async def test_live_workers_publish_each_task_with_its_schemas(
    start_service: StartService, registry: TaskRegistry
) -> None:
    @registry.task("reports.build", queue="reports", args=ReportArgs, max_attempts=2)
    async def build(ctx: JobContext[ReportArgs]) -> dict[str, int]:
        return {"rows": 1}

    service = await start_service()
    tasks = {t["name"]: t for t in await tasks_of(service)}
    assert set(registry) <= set(tasks)  # the demo tasks too
    report = tasks["reports.build"]
    assert (report["queue"], report["max_attempts"], report["priority"]) == ("reports", 2, None)
    assert report["args_schema"] == ReportArgs.model_json_schema()
    assert report["result_schema"] == {
        "type": "object",
        "additionalProperties": {"type": "integer"},
    }
    assert report["workers"] == [service.manager.worker_id]


async def test_a_process_without_workers_publishes_no_task(start_service: StartService) -> None:
    api_only = await start_service(run_workers=False)
    assert await tasks_of(api_only) == []


async def test_two_contracts_under_one_name_are_both_listed(
    start_service: StartService, registry: TaskRegistry
) -> None:
    """A rolling upgrade: the old and the new process publish different args for one task."""
    old = registry.copy()
    new = registry.copy()

    @old.task("reports.build", args=ReportArgs)
    async def build_old(ctx: JobContext[ReportArgs]) -> None:
        return None

    class ReportArgsV2(ReportArgs):
        day: str

    @new.task("reports.build", args=ReportArgsV2)
    async def build_new(ctx: JobContext[ReportArgsV2]) -> None:
        return None

    first = await start_service(tasks=old)
    second = await start_service(tasks=new)
    listed = [t for t in await tasks_of(first) if t["name"] == "reports.build"]
    assert len(listed) == 2
    by_worker = {t["workers"][0]: t["args_schema"] for t in listed}
    assert by_worker[first.manager.worker_id] == ReportArgs.model_json_schema()
    assert by_worker[second.manager.worker_id] == ReportArgsV2.model_json_schema()
