"""Request and response bodies of API v1 (spec §5)."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Annotated, Any, Final

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from dataloader.base import JobStatus
from dataloader.core import limits
from dataloader.storage.repositories import CURSOR_PATTERN


def _text_schema(min_chars: int, max_chars: int) -> WithJsonSchema:
    """The OpenAPI schema of a string field: the bounds its check (dataloader.core.limits)
    enforces, so that the schema says exactly what is accepted."""
    return WithJsonSchema(
        {
            "type": "string",
            "minLength": min_chars,
            "maxLength": max_chars,
            "pattern": limits.NO_NUL_PATTERN,
        }
    )


Name = Annotated[str, _text_schema(1, limits.NAME_MAX_CHARS), AfterValidator(limits.check_name)]
Key = Annotated[str, _text_schema(1, limits.KEY_MAX_CHARS), AfterValidator(limits.check_key)]
IdempotencyKey = Annotated[
    str,
    _text_schema(1, limits.IDEMPOTENCY_KEY_MAX_CHARS),
    AfterValidator(limits.check_idempotency_key),
]
PartitionKey = Annotated[
    str, _text_schema(0, limits.KEY_MAX_CHARS), AfterValidator(limits.check_partition_key)
]


def _whole_number(value: object) -> object:
    """A JSON integer, as JSON Schema counts them: 407.0 is one (JSON has one number type),
    1.5, true and "5" are not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


WholeNumber = BeforeValidator(_whole_number)
Priority = Annotated[
    int, Field(strict=True, ge=limits.PRIORITY_MIN, le=limits.PRIORITY_MAX), WholeNumber
]
MaxAttempts = Annotated[
    int, Field(strict=True, ge=limits.MAX_ATTEMPTS_MIN, le=limits.MAX_ATTEMPTS_MAX), WholeNumber
]
LeaseTtl = Annotated[
    int, Field(strict=True, ge=limits.LEASE_TTL_MIN, le=limits.LEASE_TTL_MAX), WholeNumber
]
RunningLimit = Annotated[int, Field(strict=True, ge=1, le=2**31 - 1), WholeNumber]
JsonObject = Annotated[dict[str, Any], AfterValidator(limits.check_args)]
#: What jobs' args must contain (JSON containment): an object naming at least one key.
ArgsFilter = Annotated[dict[str, Any], AfterValidator(limits.check_args_filter)]


def _args_filter_text(value: str) -> str:
    limits.check_args_filter(value)
    return value


#: ArgsFilter as a query parameter: the object's JSON text.
ArgsFilterText = Annotated[
    str,
    _text_schema(2, limits.ARGS_FILTER_MAX_BYTES // limits.UTF8_MAX_BYTES_PER_CHAR),
    AfterValidator(_args_filter_text),
]
_ARGS_FILTER_DOC = (
    'Jobs whose args contain this JSON object (`{"day": "2026-01-01"}`: that key with that'
    " value, whatever else they hold), from an index."
)


#: The start of an RFC 3339 date-time: a date in the years 0002 to 9998, then its time. The
#: years 1 and 9999 hold instants with no UTC equivalent (0001-01-01T00:00:00+01:00) and the
#: two extremes the database driver writes as `-infinity` and `infinity`: the schema refuses
#: both years rather than a few of their instants it cannot express.
INSTANT_PATTERN: Final = r"^(?!0001-|9999-)\d{4}-\d{2}-\d{2}[Tt ]"
_INSTANT_START = re.compile(INSTANT_PATTERN)


def _a_string(value: object) -> object:
    """An instant arrives as an RFC 3339 string only, as the schema says: pydantic would also
    take a number, or a string of one (a query parameter's), as seconds since 1970."""
    if not isinstance(value, str) or not _INSTANT_START.match(value):
        raise ValueError("must be an RFC 3339 date-time string in the years 0002 to 9998")
    return value


Instant = Annotated[
    AwareDatetime,
    BeforeValidator(_a_string),
    AfterValidator(limits.check_instant),
    Field(json_schema_extra={"pattern": INSTANT_PATTERN}),
]


class TriggerRequest(BaseModel):
    """`POST /api/v1/jobs/trigger` input: the spec's fields, plus optional per-job limits."""

    model_config = ConfigDict(extra="forbid")

    queue: Name
    task: Name
    args: JsonObject = Field(default_factory=dict)
    idempotency_key: IdempotencyKey | None = None
    lock_key: Key
    partition_key: PartitionKey = ""
    priority: Priority | None = Field(
        default=None, description="Lower runs first; the task's priority or 100 when omitted."
    )
    available_at: Instant | None = Field(
        default=None, description="RFC 3339 with an offset; the job does not start before it."
    )
    max_attempts: MaxAttempts | None = Field(
        default=None,
        description="Attempts before the job fails; the task's or DL_DEFAULT_MAX_ATTEMPTS"
        " when omitted.",
    )
    lease_ttl_sec: LeaseTtl | None = Field(
        default=None,
        description="Lease length; the task's or DL_DEFAULT_LEASE_TTL_SEC when omitted.",
    )
    producer: Name | None = None
    consumer_group: Name | None = None


class TriggerResponse(BaseModel):
    """`POST /api/v1/jobs/trigger` output."""

    job_id: uuid.UUID
    status: JobStatus
    created: bool = Field(
        description="Whether this call created the job (false: its idempotency_key already"
        " named the same job, which is returned)."
    )


class JobStatusResponse(BaseModel):
    """`GET /api/v1/jobs/{job_id}/status` and cancel output: the spec's fields first."""

    job_id: uuid.UUID
    status: JobStatus
    attempt: int
    started_at: datetime | None = Field(
        default=None, description="When the first attempt started (a retry keeps it)."
    )
    finished_at: datetime | None = None
    heartbeat_at: datetime | None = None
    error: str | None = Field(
        default=None,
        description="Why the last attempt that ended did not succeed; cleared when a new"
        " attempt starts (the journal keeps every attempt's).",
    )
    progress: dict[str, Any] = Field(default_factory=dict)
    queue: str
    task: str
    max_attempts: int
    cancel_requested: bool
    created_at: datetime
    available_at: datetime
    lock_key: str | None = Field(
        description="Jobs sharing a lock_key never run at the same time; null for a job"
        " enqueued without one (from the library or the CLI), which excludes no other."
    )
    idempotency_key: str | None = None
    priority: int
    result: Any = Field(
        default=None, description="The task's return value when the job succeeded (JSON)."
    )
    duration_ms: int | None = Field(
        default=None,
        description="How long the last attempt that ended ran, from `attempted_at`, in"
        " milliseconds (null while an attempt runs).",
    )
    worker_id: str | None = Field(
        default=None, description="The worker process that made the last claim."
    )
    checkpoint: Any = Field(
        default=None, description="The cursor the task last saved; the next attempt resumes there."
    )
    rerun_requested: bool = False
    attempted_at: datetime | None = Field(
        default=None, description="When the current (or last) attempt started."
    )
    cluster: str | None = Field(
        default=None,
        description="The PostgreSQL cluster holding the job (DL_CLUSTERS); null with one.",
    )


class JobFilterFields(BaseModel):
    """Which jobs: those matching every filter given."""

    model_config = ConfigDict(extra="forbid")

    queue: Name | None = None
    status: JobStatus | None = None
    task: Name | None = None
    lock_key: Key | None = None
    partition_key: PartitionKey | None = None
    created_from: Instant | None = Field(None, description="Created at or after (RFC 3339).")
    created_until: Instant | None = Field(None, description="Created before (RFC 3339).")
    finished_from: Instant | None = Field(None, description="Finished at or after (RFC 3339).")
    finished_until: Instant | None = Field(None, description="Finished before (RFC 3339).")


class JobListQuery(JobFilterFields):
    """`GET /api/v1/jobs` filters: every one given must match."""

    args: ArgsFilterText | None = Field(None, description=_ARGS_FILTER_DOC + " JSON text.")

    limit: int = Field(100, ge=1, le=1000, description="Jobs per page.")
    cursor: str | None = Field(
        None,
        pattern=CURSOR_PATTERN,
        description="`next_cursor` of the page before: the next page.",
    )


class JobBulkRequest(JobFilterFields):
    """Which jobs a cancel or retry by filter takes: those matching every filter given (at
    least one), newest first, `limit` at most."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"queue": "etl", "status": "failed", "limit": 1000}],
            # at least one filter, as the schema says it
            "anyOf": [
                {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
                for name in [*JobFilterFields.model_fields, "args"]
            ],
        },
    )

    args: ArgsFilter | None = Field(None, description=_ARGS_FILTER_DOC)

    limit: int = Field(1000, ge=1, le=10_000, description="Jobs looked at, at most.")

    @model_validator(mode="after")
    def _some_filter(self) -> JobBulkRequest:
        if not self.model_dump(exclude_none=True, exclude={"limit"}):
            raise ValueError("give at least one filter (a change of every job is not offered)")
        return self


class JobBulkResponse(BaseModel):
    """What a cancel or retry by filter did."""

    matched: int = Field(description="Jobs looked at (matching the filters).")
    changed: list[uuid.UUID] = Field(
        description="The jobs canceled (or asked to stop), or retried."
    )
    more: bool = Field(description="More jobs match beyond `limit`: call again to go on.")


class JobListResponse(BaseModel):
    """A page of jobs, newest first."""

    jobs: list[JobStatusResponse]
    next_cursor: str | None = Field(
        description="Pass it as `cursor` for the next page; null: this is the last page. Pages"
        " follow each other by keyset: jobs enqueued meanwhile never shift them."
    )


class JobEventResponse(BaseModel):
    """One entry of a job's journal."""

    event_id: int = Field(description="Increasing: pass the last one seen as `after`.")
    kind: str = Field(description="queued, picked, heartbeat, requeue, done, failed, canceled…")
    ts: datetime
    payload: dict[str, Any] | None = None


class JobEventsResponse(BaseModel):
    """A job's journal, oldest first."""

    events: list[JobEventResponse]


class ThroughputResponse(BaseModel):
    """The attempts a queue's workers ended within a window (the last 1, 5 or 60 minutes).
    Processes add their counts every DL_PRESENCE_PERIOD_SEC: the latest show up that late."""

    window_sec: int = Field(description="The window: 60, 300 or 3600 seconds.")
    succeeded: int
    failed: int
    retried: int = Field(description="Attempts that failed and were queued again.")
    canceled: int
    lost: int
    per_minute: float = Field(
        description="Jobs ended (succeeded, failed, canceled or lost) per minute."
    )


class QueueStatsResponse(BaseModel):
    """What a queue holds now (`GET /api/v1/queues/{queue}`, and each of `GET /api/v1/queues`),
    whether it is paused, who serves it, and how fast its jobs ended lately."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "queue": "etl",
                    "total": 1250,
                    "ready": 1000,
                    "waiting": 200,
                    "delayed": 40,
                    "running": 10,
                    "failed": 3,
                    "lost": 0,
                    "oldest_ready_age_sec": 12.5,
                    "paused": False,
                    "limits": {
                        "max_running": 10,
                        "max_running_per_partition": None,
                        "max_per_second": None,
                    },
                    "paused_by": None,
                    "paused_at": None,
                    "workers": 2,
                    "slots": 8,
                    "throughput": [
                        {
                            "window_sec": 60,
                            "succeeded": 1200,
                            "failed": 1,
                            "retried": 4,
                            "canceled": 0,
                            "lost": 0,
                            "per_minute": 1201.0,
                        }
                    ],
                }
            ]
        }
    )

    queue: str
    total: int = Field(description="Jobs in the queue: ready + waiting + delayed + running.")
    ready: int = Field(description="Due and claimable now.")
    waiting: int = Field(description="Due, behind a running job of their lock_key.")
    delayed: int = Field(description="Not due yet (available_at, a retry's delay).")
    running: int
    failed: int = Field(description="Jobs that ended failed (kept until pruned).")
    lost: int = Field(description="Jobs whose lease expired on their last attempt.")
    oldest_ready_age_sec: float | None = Field(
        description="Seconds since the longest-waiting due job (ready or waiting) became due;"
        " null when none is due."
    )
    paused: bool = Field(description="No worker claims its jobs (running ones finish).")
    limits: QueueLimitsBody = Field(description="Its limits across every replica.")
    paused_by: str | None = Field(description="Who paused it (`token:<name>`, `api`, `cli` …).")
    paused_at: datetime | None
    workers: int = Field(description="Live processes that serve it.")
    slots: int = Field(description="Their slots for it (shared slots count for each queue).")
    throughput: list[ThroughputResponse] = Field(
        description="Attempts ended in the last 1, 5 and 60 minutes."
    )


class QueueLimitsBody(BaseModel):
    """A queue's limits across every replica; null (or left out): no such limit."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"max_running": 10, "max_running_per_partition": 1, "max_per_second": 5}]
        },
    )

    max_running: RunningLimit | None = Field(
        default=None, description="Jobs of the queue running at once."
    )
    max_running_per_partition: RunningLimit | None = Field(
        default=None, description="Jobs of one partition_key of the queue running at once."
    )
    max_per_second: Annotated[float, Field(strict=True, ge=0.001, le=1_000_000)] | None = Field(
        default=None,
        description="Jobs started per second (bursts up to one second's worth).",
    )


class QueueSettingsResponse(BaseModel):
    """Whether a queue is paused, its limits, and who changed them last (`pause_queue`,
    `resume_queue`, `set_queue_limits`)."""

    queue: str
    paused: bool
    changed_at: datetime | None = Field(description="null: never changed.")
    changed_by: str | None = Field(description="`token:<name>`, `api`, `cli` …")
    limits: QueueLimitsBody


class QueueEventResponse(BaseModel):
    """One entry of a queue's audit log."""

    event_id: int = Field(description="Increasing: pass the last one seen as `after`.")
    queue: str
    ts: datetime
    kind: str = Field(description="paused, resumed or limits.")
    actor: str = Field(description="Who: `token:<name>`, `api`, `cli`, or a library's client.")
    payload: dict[str, Any]


class QueueEventsResponse(BaseModel):
    """A queue's audit log, oldest first."""

    events: list[QueueEventResponse]


class QueueListResponse(BaseModel):
    """`GET /api/v1/queues` output."""

    queues: list[QueueStatsResponse] = Field(
        description="Every queue holding jobs that are queued, running, failed or lost, paused,"
        " served by a live process, or with jobs ended in the last hour; by name."
    )


class TaskContractResponse(BaseModel):
    """A task as live workers publish it: what producers must send, and what it returns.
    (Fields a worker of another version does not publish take their defaults.)"""

    name: str
    queue: str | None = Field(None, description="The task's queue (null: the trigger names one).")
    priority: int | None = Field(None, description="Default priority (null: the settings').")
    max_attempts: int | None = Field(None, description="Default attempts (null: the settings').")
    lease_ttl_sec: int | None = Field(None, description="Default lease (null: the settings').")
    timeout_sec: float | None = Field(None, description="Longest an attempt may run (null: none).")
    retry: str | None = Field(
        None, description="The retry policy (null: the settings' linear one)."
    )
    non_retryable: list[str] = Field(
        default_factory=list, description="Exceptions that fail the job at once."
    )
    batch_size: int | None = Field(
        None, description="Jobs one call of its handler takes (null: one at a time)."
    )
    args_schema: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object"},
        description="JSON Schema of the trigger's `args`.",
    )
    result_schema: dict[str, Any] = Field(
        default_factory=dict, description="JSON Schema of the job's `result` ({}: any JSON value)."
    )
    workers: list[str] = Field(description="The live processes that publish this contract.")


class AwaitedTaskResponse(BaseModel):
    """A task with queued jobs that no live process knows."""

    name: str
    queues: list[str] = Field(description="The queues holding its queued jobs.")


class TaskListResponse(BaseModel):
    """`GET /api/v1/tasks` output."""

    tasks: list[TaskContractResponse] = Field(
        description="By name; a task whose live processes publish different contracts (a"
        " rolling upgrade) appears once per contract."
    )
    awaited: list[AwaitedTaskResponse] = Field(
        default_factory=list,
        description="By name, tasks with queued jobs that no live process knows: accepted"
        " while their workers are away, their jobs wait for a process that knows them.",
    )


class ErrorResponse(BaseModel):
    """Body of 4xx/5xx answers that are not validation errors."""

    detail: str


#: The answer of a route whose JSON body cannot be parsed, as its OpenAPI responses say it.
UNPARSABLE_BODY: Final[dict[int | str, dict[str, Any]]] = {
    400: {"model": ErrorResponse, "description": "The body could not be parsed"}
}


class IdempotencyConflictResponse(BaseModel):
    """409: the idempotency_key already names a job whose fields differ from the request."""

    detail: str
    idempotency_key: str
    job_id: uuid.UUID = Field(description="The job that holds the key.")
    fields: list[str] = Field(description="The fields that differ.")
