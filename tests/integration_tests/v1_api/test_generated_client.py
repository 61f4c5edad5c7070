"""A Python client generated from the service's OpenAPI schema (openapi-python-client) reads
well and works: every operation is generated, its module is named after the operation id
(`api/jobs/trigger_job.py`, not FastAPI's `trigger_api_v1_jobs_trigger_post`), and it
triggers, reads and cancels a job of a running service."""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dataloader.api import create_app
from dataloader.config import Settings

from ..conftest import StartService
from ..procs import run_cli

GENERATOR = Path(sys.executable).parent / "openapi-python-client"
#: The generated package's import name (its directory).
PACKAGE = "dataloader_client"

#: Generated modules per tag, one per operation, each named after its operation id.
OPERATIONS = {
    "jobs": {
        "trigger_job",
        "list_jobs",
        "get_job",
        "get_job_status",
        "list_job_events",
        "retry_job",
        "cancel_job",
        "cancel_jobs",
        "retry_jobs",
        "stream_job",
    },
    "queues": {
        "list_queues",
        "get_queue",
        "pause_queue",
        "resume_queue",
        "set_queue_limits",
        "list_queue_events",
    },
    "tasks": {"list_tasks"},
    "processes": {
        "start_process",
        "call_process",
        "repair_process",
        "remove_process",
        "get_process",
        "list_process_events",
        "list_processes",
        "get_process_task_response",
    },
    "infra": {"health", "get_status", "get_metrics"},
}

#: Operations whose answer the client hands back unparsed (`*_detailed` only): the Prometheus
#: text of `/metrics`, and `/status`, whose answer declares no schema.
UNPARSED = {"get_metrics", "get_status", "stream_job"}

#: What FastAPI names an operation without an explicit id: `{function}_{path}_{method}`.
DEFAULT_OPERATION_ID = re.compile(r"api_v1|_(get|post|put|patch|delete)$")


def served_schema() -> dict[str, Any]:
    """The schema a service without workers serves (it accepts any task name)."""
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        db_dsn="postgresql://u@127.0.0.1/db",
        allow_unknown_tasks=True,
    )
    openapi: dict[str, Any] = create_app(settings, run_workers=False).openapi()
    return openapi


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return served_schema()


@pytest.fixture(scope="module")
def generated(schema: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The client package generated from `schema`, importable as `PACKAGE` meanwhile."""
    work = tmp_path_factory.mktemp("generated_client")
    schema_file = work / "openapi.json"
    schema_file.write_text(json.dumps(schema))
    package = work / PACKAGE
    # the generator formats its output with ruff, found on PATH next to the interpreter
    path = os.pathsep.join([str(GENERATOR.parent), os.environ.get("PATH", "")])
    result = run_cli(
        [
            str(GENERATOR),
            "generate",
            "--path",
            str(schema_file),
            "--output-path",
            str(package),
            "--meta",
            "none",
            "--fail-on-warning",
        ],
        {"PATH": path},
        work,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout[-8000:]
    assert "Warning" not in result.stdout, result.stdout[-8000:]
    sys.path.insert(0, str(work))
    try:
        yield package
    finally:
        sys.path.remove(str(work))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]
        importlib.invalidate_caches()


def test_every_operation_is_generated_under_its_operation_id(generated: Path) -> None:
    modules = {
        tag.name: {module.stem for module in tag.glob("*.py") if module.stem != "__init__"}
        for tag in (generated / "api").iterdir()
        if tag.is_dir() and not tag.name.startswith("__")
    }
    assert modules == OPERATIONS
    for tag, names in modules.items():
        for name in names:
            assert not DEFAULT_OPERATION_ID.search(name), f"api/{tag}/{name}.py"
            module = importlib.import_module(f"{PACKAGE}.api.{tag}.{name}")
            functions = ["sync_detailed", "asyncio_detailed"]
            if name not in UNPARSED:
                functions += ["sync", "asyncio"]
            for function in functions:
                assert callable(getattr(module, function, None)), f"{name}.{function}"
    models = {model.stem for model in (generated / "models").glob("*.py")}
    assert {"trigger_request", "trigger_response", "job_status_response", "job_status"} <= models
    assert not [model for model in models if DEFAULT_OPERATION_ID.search(model)]


async def test_the_generated_client_triggers_reads_and_cancels_a_job(
    generated: Path, schema: dict[str, Any], start_service: StartService
) -> None:
    service = await start_service(run_workers=False)
    served = await service.client.get("/openapi.json")
    assert served.json() == schema  # the client was generated from what the service serves

    client_module = importlib.import_module(f"{PACKAGE}.client")
    models = importlib.import_module(f"{PACKAGE}.models")
    jobs = {
        name: importlib.import_module(f"{PACKAGE}.api.jobs.{name}")
        for name in ("trigger_job", "get_job", "get_job_status", "cancel_job", "list_jobs")
    }
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=service.app), base_url="http://dataloader.test"
    ) as http:
        client: Any = client_module.Client(
            base_url="http://dataloader.test", raise_on_unexpected_status=True
        ).set_async_httpx_client(http)

        body = models.TriggerRequest.from_dict(
            {
                "queue": "generated",
                "task": "load.day",
                "lock_key": "day-1",
                "args": {"day": "2024-01-01", "tables": ["a", "b"]},
            }
        )
        triggered = await jobs["trigger_job"].asyncio_detailed(client=client, body=body)
        assert triggered.status_code == 200, triggered.content
        assert isinstance(triggered.parsed, models.TriggerResponse)
        assert triggered.parsed.created is True
        assert triggered.parsed.status == models.JobStatus.QUEUED
        job_id = triggered.parsed.job_id

        queued = await jobs["get_job"].asyncio(job_id, client=client)
        assert isinstance(queued, models.JobStatusResponse)
        assert (queued.job_id, queued.status) == (job_id, models.JobStatus.QUEUED)
        assert (queued.queue, queued.task, queued.attempt) == ("generated", "load.day", 0)

        canceled = await jobs["cancel_job"].asyncio(job_id, client=client)
        assert isinstance(canceled, models.JobStatusResponse)
        assert canceled.status == models.JobStatus.CANCELED

        read_again = await jobs["get_job"].asyncio(job_id, client=client)
        assert isinstance(read_again, models.JobStatusResponse)
        assert read_again == await jobs["get_job_status"].asyncio(job_id, client=client)
        assert read_again.status == models.JobStatus.CANCELED
        assert read_again.finished_at is not None

        listed = await jobs["list_jobs"].asyncio(client=client, queue="generated")
        assert isinstance(listed, models.JobListResponse)
        assert [(job.job_id, job.status) for job in listed.jobs] == [
            (job_id, models.JobStatus.CANCELED)
        ]
