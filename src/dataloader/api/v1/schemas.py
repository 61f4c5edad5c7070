"""Request and response bodies of API v1 (spec §5)."""

from __future__ import annotations

import math
import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

from dataloader.base import JobStatus

INT32_MAX = 2_147_483_647
#: Deepest nesting accepted in `args` (PostgreSQL's jsonb accepts more; nobody needs it).
MAX_ARGS_DEPTH = 64
_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_nul(value: str) -> str:
    """Reject what PostgreSQL text/jsonb cannot store: NUL, and lone UTF-16 surrogates
    (JSON allows the escape "\\ud800"; it is not a character and UTF-8 cannot encode it)."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    if _SURROGATE.search(value):
        raise ValueError("must not contain unpaired surrogates (\\ud800-\\udfff)")
    return value


def _in_range(value: datetime) -> datetime:
    """Reject instants that have no UTC equivalent (e.g. 9999-12-31T23:59:59-14:00)."""
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise ValueError("out of range once converted to UTC") from None
    return value


def _storable_json(value: Any, depth: int = 0) -> Any:
    """Reject what jsonb cannot store: NUL in strings, NaN/Infinity; bound the nesting."""
    if depth > MAX_ARGS_DEPTH:
        raise ValueError(f"nested deeper than {MAX_ARGS_DEPTH} levels")
    if isinstance(value, str):
        _no_nul(value)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError("NaN and Infinity are not valid JSON numbers")
    elif isinstance(value, dict):
        for key, item in value.items():
            _no_nul(key)
            _storable_json(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _storable_json(item, depth + 1)
    return value


Text = Annotated[str, Field(min_length=1, max_length=1000), AfterValidator(_no_nul)]
Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_no_nul)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_storable_json)]


class TriggerRequest(BaseModel):
    """`POST /api/v1/jobs/trigger` input: the spec's fields, plus optional per-job limits."""

    model_config = ConfigDict(extra="forbid")

    queue: Name
    task: Name
    args: JsonObject = Field(default_factory=dict)
    idempotency_key: Text | None = None
    lock_key: Text
    partition_key: Annotated[str, Field(max_length=1000), AfterValidator(_no_nul)] = ""
    priority: Annotated[int, Field(strict=True, ge=0, le=INT32_MAX)] = 100
    available_at: Annotated[AwareDatetime, AfterValidator(_in_range)] | None = Field(
        default=None, description="RFC 3339 with an offset; the job does not start before it."
    )
    max_attempts: Annotated[int, Field(strict=True, ge=1, le=1000)] = 5
    lease_ttl_sec: Annotated[int, Field(strict=True, ge=1, le=INT32_MAX)] | None = Field(
        default=None, description="Lease length; DL_DEFAULT_LEASE_TTL_SEC when omitted."
    )
    producer: Name | None = None
    consumer_group: Name | None = None


class TriggerResponse(BaseModel):
    """`POST /api/v1/jobs/trigger` output."""

    job_id: uuid.UUID
    status: JobStatus


class JobStatusResponse(BaseModel):
    """`GET /api/v1/jobs/{job_id}/status` and cancel output: the spec's fields first."""

    job_id: uuid.UUID
    status: JobStatus
    attempt: int
    started_at: datetime | None = None
    finished_at: datetime | None = None
    heartbeat_at: datetime | None = None
    error: str | None = None
    progress: dict[str, Any] = Field(default_factory=dict)
    queue: str
    task: str
    max_attempts: int
    cancel_requested: bool
    created_at: datetime
    available_at: datetime


class ErrorResponse(BaseModel):
    """Body of 4xx/5xx answers that are not validation errors."""

    detail: str
