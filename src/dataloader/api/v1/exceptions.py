"""Map dataloader's errors to HTTP answers: a client mistake is a 4xx with a clear message,
an unavailable database a 503, never a traceback."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from dataloader.exceptions import (
    DatabaseUnavailable,
    IdempotencyConflict,
    InvalidJob,
    InvalidJobArgs,
    JobNotFound,
    NotRetryable,
    ProcessConflict,
    ProcessNotFound,
    ProcessTaskFailed,
    ProcessTimeout,
    UnknownTask,
)
from dataloader.storage.db import CONNECTION_ERRORS

log = logging.getLogger(__name__)


async def _not_found(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(status_code=404, content={"detail": str(exc)})


async def _conflict(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, IdempotencyConflict)
    body = {
        "detail": str(exc),
        "idempotency_key": exc.idempotency_key,
        "job_id": str(exc.job_id),
        "fields": list(exc.fields),
    }
    return JSONResponse(status_code=409, content=body)


async def _not_retryable(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(status_code=409, content={"detail": str(exc)})


async def _process_conflict(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProcessConflict)
    return JSONResponse(status_code=409, content={"detail": str(exc), "reason": exc.reason})


async def _process_task_failed(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProcessTaskFailed)
    body = {"detail": str(exc), "reason": "task_failed", "task_id": str(exc.task_id)}
    return JSONResponse(status_code=409, content=body)


async def _process_timeout(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProcessTimeout)
    return JSONResponse(status_code=504, content={"detail": str(exc), "task_id": str(exc.task_id)})


async def _invalid_args(_request: Request, exc: Exception) -> JSONResponse:
    # Same shape as FastAPI's own validation errors, so clients parse one format.
    detail = [{"type": "invalid_args", "loc": ["body", "args"], "msg": str(exc)}]
    return JSONResponse(status_code=422, content={"detail": detail})


async def _invalid_job(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidJob)
    detail = [{"type": "invalid_job", "loc": ["body", exc.field], "msg": str(exc)}]
    return JSONResponse(status_code=422, content={"detail": detail})


async def _unknown_task(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, UnknownTask)
    detail = [
        {
            "type": "unknown_task",
            "loc": ["body", "task"],
            "msg": str(exc),
            "input": exc.task,
        }
    ]
    return JSONResponse(status_code=422, content={"detail": detail})


#: Longest echoed `input` string in a 422 answer.
MAX_ECHO_CHARS = 200


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    # FastAPI's own answer, except for the echoed `input`: containers are not echoed (they can
    # be nested deeper than the encoder's recursion limit, or be megabytes long), strings are
    # cut short, and what Python's json module parses but a JSON response cannot carry is
    # made safe: NaN/Infinity (sent as strings), unpaired surrogates (sent as U+FFFD).
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    detail = []
    for error in errors:
        shown = {key: value for key, value in error.items() if key != "input"}
        echoed = error.get("input")
        if isinstance(echoed, str):
            shown["input"] = echoed[:MAX_ECHO_CHARS]
        elif isinstance(echoed, int | float | bool) or echoed is None:
            shown["input"] = echoed
        detail.append(shown)
    return JSONResponse(status_code=422, content={"detail": _json_safe(jsonable_encoder(detail))})


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_json_safe(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
    return value


#: What a 503 tells a client to wait before trying again: a restart or a failover to a
#: standby takes seconds, and a retry finds the database back as soon as it answers.
RETRY_AFTER_SEC = 2


def unavailable_response(content: dict[str, Any]) -> JSONResponse:
    """A 503 saying when to try again (`Retry-After`, as HTTP clients and proxies read it)."""
    return JSONResponse(
        status_code=503, content=content, headers={"Retry-After": str(RETRY_AFTER_SEC)}
    )


async def _unavailable(_request: Request, exc: Exception) -> JSONResponse:
    log.error("database unavailable: %r", exc)
    return unavailable_response({"detail": "database unavailable"})


async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error", exc_info=exc)
    return JSONResponse(status_code=500, content={"detail": "internal error"})


def install_exception_handlers(app: FastAPI) -> None:
    """Register the handlers on `app`."""
    app.add_exception_handler(JobNotFound, _not_found)
    app.add_exception_handler(ProcessNotFound, _not_found)
    app.add_exception_handler(ProcessConflict, _process_conflict)
    app.add_exception_handler(ProcessTaskFailed, _process_task_failed)
    app.add_exception_handler(ProcessTimeout, _process_timeout)
    app.add_exception_handler(NotRetryable, _not_retryable)
    app.add_exception_handler(InvalidJobArgs, _invalid_args)
    app.add_exception_handler(InvalidJob, _invalid_job)
    app.add_exception_handler(UnknownTask, _unknown_task)
    app.add_exception_handler(IdempotencyConflict, _conflict)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(DatabaseUnavailable, _unavailable)
    for error in CONNECTION_ERRORS:
        if issubclass(error, Exception):
            app.add_exception_handler(error, _unavailable)
    app.add_exception_handler(Exception, _unexpected)
