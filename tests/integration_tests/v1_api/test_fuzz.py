"""The API fuzzed from its own OpenAPI schema (schemathesis): valid and invalid requests for
every operation, against the real database. Whatever arrives, the answer is never a 5xx (but
the 504 of a durable process's task that did not answer in time), always JSON, and a refused
request (4xx) writes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import asyncpg
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from ..conftest import Service, StartService
from .test_security import ADMIN, TOKENS

T = TypeVar("T")

COUNT_ROWS = """
SELECT (SELECT count(*) FROM dl_jobs), (SELECT count(*) FROM dl_job_events),
       (SELECT count(*) FROM dl_processes)
"""
#: The operations that wait for a durable process's response: 504 (with the task's id) when it
#: does not come in time, the task written and going on. The services below run no worker,
#: and wait a moment only (DL_PROCESS_WAIT_MAX_SEC).
WAITING = frozenset(
    {
        "POST /api/v1/processes/{namespace}/{process_id}",
        "POST /api/v1/processes/{namespace}/{process_id}/call",
        "POST /api/v1/processes/{namespace}/{process_id}/repair",
        "DELETE /api/v1/processes/{namespace}/{process_id}",
        "GET /api/v1/process-tasks/{task_id}",
    }
)
QUICK = {"process_wait_max_sec": 0.1}


def request_strategy(app_schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Cases of every operation, valid and invalid (where an operation can be made invalid)."""
    schema = schemathesis.openapi.from_dict(app_schema)
    strategies = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in GenerationMode:
            if mode is GenerationMode.NEGATIVE and operation.label == "GET /health":
                continue  # no parameters, no body: nothing to get wrong
            strategies.append(operation.as_strategy(generation_mode=mode))
    return st.one_of(strategies)


async def fuzz(
    service: Service,
    conn: asyncpg.Connection,
    add_headers: dict[str, str],
    protected_answer: int | None = None,
) -> list[int]:
    """Send a few hundred schema-derived requests; check each answer and what it wrote (and,
    with `protected_answer`, that every route but /health answered that). Hypothesis drives
    the cases from a thread; the requests run in this event loop, where the service lives.
    Returns the status codes answered."""
    loop = asyncio.get_running_loop()
    strategy = request_strategy(service.app.openapi())

    answers: list[int] = []

    def call(coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        try:
            return future.result(timeout=60)
        finally:
            future.cancel()  # a late one must not overlap the next example's use of `conn`

    @given(case=strategy)
    @settings(
        max_examples=250,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def one(case: Any) -> None:
        kwargs = case.as_transport_kwargs(base_url=str(service.client.base_url))
        kwargs.pop("cookies", None)
        if isinstance(kwargs.get("data"), bytes | str):  # requests' spelling of a raw body
            kwargs["content"] = kwargs.pop("data")
        headers = {
            name: value
            for name, value in kwargs.get("headers", {}).items()
            if name.lower() not in {h.lower() for h in add_headers}
        }
        kwargs["headers"] = headers | add_headers
        before = tuple(call(conn.fetchrow(COUNT_ROWS)))
        response = call(service.client.request(**kwargs))
        answers.append(response.status_code)
        if response.status_code == 504 and case.operation.label in WAITING:
            assert response.json()["task_id"], response.text
            return
        assert response.status_code < 500, (kwargs, response.status_code, response.text)
        if case.operation.label == "GET /metrics" and response.status_code == 200:
            assert response.text.startswith("# HELP"), response.text  # Prometheus' text format
        else:
            assert isinstance(response.json(), dict), response.text
        if protected_answer is not None and case.operation.label != "GET /health":
            assert response.status_code == protected_answer, (kwargs, response.text)
        if response.status_code >= 400:
            after = tuple(call(conn.fetchrow(COUNT_ROWS)))
            assert after == before, (kwargs, response.status_code, "wrote rows when refused")

    await asyncio.to_thread(one)
    return answers


async def test_fuzzed_requests_never_get_a_5xx_nor_write_when_refused(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    answers = await fuzz(await start_service(run_workers=False, **QUICK), conn, {})
    assert answers.count(200) > 10, answers  # valid requests were among them, and served
    assert answers.count(422) > 10, answers  # and invalid ones, refused


async def test_fuzzed_requests_with_a_valid_token_never_get_a_5xx(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False, api_tokens=TOKENS, **QUICK)
    answers = await fuzz(service, conn, {"Authorization": f"Bearer {ADMIN}"})
    # the token let the requests through to validation and the handlers
    assert 401 not in answers
    assert 403 not in answers
    assert answers.count(200) > 10, answers


async def test_fuzzed_tokens_are_refused_with_401(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """With authentication on, the schema's own (random) tokens must all be refused."""
    service = await start_service(run_workers=False, api_tokens=TOKENS)
    await fuzz(service, conn, {}, protected_answer=401)
