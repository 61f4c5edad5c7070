"""The OpenAPI schema says exactly what the service does: schemathesis, every check and every
phase (stateful included, through the schema's links), finds nothing against a running
service, with and without tokens."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from dataloader.api import create_app
from dataloader.config import Settings

from ...conftest import FUZZ_EXPLORE
from ..procs import launched, run_cli
from .test_security import ADMIN, TOKENS

SCHEMATHESIS = Path(sys.executable).parent / "st"
#: The operations that wait for a durable process's response: 504 is what they answer when it
#: does not come in time (a 5xx by design), and valid requests may also meet the process's
#: state (404, 409). A repair finds no process in error to repair but by chance (a process
#: goes to error only when its processor fails, and this service has none): its 404s are
#: expected.
WAITING_OPERATIONS_CONFIG = """
[[operations]]
include-operation-id-regex = "^(start|call|repair|remove)_process$|^get_process_task_response$"
checks.not_a_server_error.enabled = false
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "504"]

[[operations]]
include-operation-id = "repair_process"
warnings = false
"""
INSTANT_FILTERS = ("created_from", "created_until", "finished_from", "finished_until")


def schema(**settings: Any) -> dict[str, Any]:
    app = create_app(Settings(_env_file=None, db_dsn="postgresql://u@127.0.0.1/db", **settings))  # type: ignore[call-arg]
    openapi: dict[str, Any] = app.openapi()
    return openapi


def securities(openapi: dict[str, Any]) -> list[Any]:
    return [op.get("security") for path in openapi["paths"].values() for op in path.values()]


def test_security_is_declared_only_when_tokens_are_configured() -> None:
    open_schema = schema()
    assert securities(open_schema) == [None] * 28
    assert "securitySchemes" not in open_schema["components"]
    secured = schema(api_tokens=TOKENS)
    assert securities(secured).count([{"HTTPBearer": []}]) == 27  # all but /health
    assert secured["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_the_trigger_links_its_job_id_to_status_and_cancel() -> None:
    links = schema()["paths"]["/api/v1/jobs/trigger"]["post"]["responses"]["200"]["links"]
    assert sorted(links) == ["CancelJob", "GetJob", "GetJobStatus", "GetQueue"]
    assert links["GetJob"]["operationId"] == "get_job"
    assert links["GetJob"]["parameters"] == {"job_id": "$response.body#/job_id"}
    assert links["GetJobStatus"]["parameters"] == {"job_id": "$response.body#/job_id"}
    assert links["CancelJob"]["parameters"] == {"job_id": "$response.body#/job_id"}
    assert links["GetQueue"]["parameters"] == {"queue": "$request.body#/queue"}


def test_every_instant_the_schema_takes_is_one_the_service_takes() -> None:
    """The years 1 and 9999 hold instants the service refuses (no UTC equivalent, or the two
    the database stores as infinities): every date-time a request carries excludes both years
    in the schema, so a client that follows the schema is never refused a date-time."""
    openapi = schema()
    bodies = openapi["components"]["schemas"]
    list_jobs = openapi["paths"]["/api/v1/jobs"]["get"]["parameters"]
    instants = [bodies["TriggerRequest"]["properties"]["available_at"]]
    instants += [bodies["JobBulkRequest"]["properties"][name] for name in INSTANT_FILTERS]
    instants += [p["schema"] for p in list_jobs if p["name"] in INSTANT_FILTERS]
    assert len(instants) == 9
    for instant in instants:
        (string,) = (option for option in instant["anyOf"] if option["type"] == "string")
        assert string["format"] == "date-time"
        assert string["pattern"] == r"^(?!0001-|9999-)\d{4}-\d{2}-\d{2}[Tt ]"


@pytest.mark.parametrize("secured", [False, True], ids=["open", "with-tokens"])
async def test_schemathesis_finds_no_failure(db_dsn: str, tmp_path: Path, secured: bool) -> None:
    env = {"DL_API_TOKENS": json.dumps(TOKENS)} if secured else {}
    # No schema can say which task names the live processes know: a trigger of a task nobody
    # knows on a queue they serve is refused with 422 (test_presence.py), which schemathesis
    # would read as a valid request refused. Accepted here, such jobs fail when claimed.
    env["DL_ALLOW_UNKNOWN_TASKS"] = "true"
    # A durable process's task waits for a processor this service does not have: the request
    # answers 504 with the task's id once its wait (capped short here) is over, as documented.
    env["DL_PROCESS_WAIT_MAX_SEC"] = "0.2"
    config = tmp_path / "schemathesis.toml"
    config.write_text(WAITING_OPERATIONS_CONFIG)
    # every check runs (schemathesis' default), but where the configuration turns one off
    command = [str(SCHEMATHESIS), "--config-file", str(config), "run"]
    command += ["--max-examples", "25", "--no-color"]
    # a job's stream lasts until the job ends, which the jobs schemathesis triggers never do
    # (tested on its own: test_job_actions.py)
    command += ["--exclude-operation-id", "stream_job"]
    if not FUZZ_EXPLORE:  # the same cases at every run
        command += ["--generation-deterministic", "--seed", "1"]
    if secured:
        command += ["--header", f"Authorization: Bearer {ADMIN}"]
    async with launched(tmp_path) as launcher:
        service = launcher.start(db_dsn, **env)
        await service.wait_healthy()
        command.append(f"{service.base_url}/openapi.json")
        result = await asyncio.to_thread(run_cli, command, {}, tmp_path, 120)
    assert result.returncode == 0, result.stdout[-8000:]
    assert "No issues found" in result.stdout, result.stdout[-3000:]
    # the trigger's three declared links were followed (those schemathesis infers, such as a
    # listed job's id, only when a random scenario happens to list a job)
    links = re.search(
        r"API Links: +(\d+) covered / (\d+) selected / \d+ total \((\d+) inferred\)",
        result.stdout,
    )
    assert links is not None, result.stdout[-2000:]
    covered, selected, inferred = int(links[1]), int(links[2]), int(links[3])
    assert covered >= selected - inferred >= 3
