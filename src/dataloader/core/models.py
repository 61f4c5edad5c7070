"""The job as producers and readers see it: a new job with its checks and defaults, its state,
its journal. No I/O.

The same rules apply whoever enqueues (HTTP, library, CLI): every field is checked against
`dataloader.core.limits` when a `NewJob` is built, and options left out are filled, in this
order, from the task's definition (`@dataloader.task(queue=…, max_attempts=…)`) and from the
settings (`DL_DEFAULT_LEASE_TTL_SEC`, `DL_DEFAULT_MAX_ATTEMPTS`), by `JobOptions`.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel

from dataloader.base import JobStatus
from dataloader.core import limits
from dataloader.core.queues import QueueLimits, Throughput
from dataloader.core.retry import MAX_DELAY_SEC
from dataloader.exceptions import InvalidJob

if TYPE_CHECKING:
    from dataloader.tasks import Task

#: The spec's defaults (its DDL's), used when neither the task nor the settings say otherwise.
DEFAULT_PRIORITY: Final = 100
DEFAULT_MAX_ATTEMPTS: Final = 5
DEFAULT_LEASE_TTL_SEC: Final = 60


class _JobIds:
    """Version 7 UUIDs (RFC 9562) that increase within the process: the time in milliseconds
    ahead of 74 random bits, and within one millisecond (or if the clock steps back) the last
    id's bits plus one (the RFC's monotonic random method)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._millis = 0
        self._random = 0

    def __call__(self) -> uuid.UUID:
        millis = time.time_ns() // 1_000_000
        with self._lock:
            if millis > self._millis:
                self._millis, self._random = millis, int.from_bytes(os.urandom(10), "big") >> 6
            else:
                self._random += 1
                if self._random >> 74:  # 2**74 ids in a millisecond: borrow the next one
                    self._millis, self._random = self._millis + 1, 0
            millis, random = self._millis, self._random
        rand_a, rand_b = random >> 62, random & ((1 << 62) - 1)  # 12 and 62 bits
        return uuid.UUID(
            int=(millis & (1 << 48) - 1) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
        )


#: A new job's id: a version 7 UUID, increasing within the process. Ids made close in time sort
#: close: a job's index entries, and its journal's by job, go to the few newest pages of each
#: index rather than anywhere in it, which keeps those pages full and in memory, and lets the
#: primary key append at its right edge. The jobs of one call, which share their created_at,
#: are claimed in the order of their ids: the order they were given.
new_job_id: Final = _JobIds()


@dataclass(frozen=True, slots=True)
class JobDefaults:
    """Values of the options a job and its task leave out (from the settings)."""

    priority: int = DEFAULT_PRIORITY
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    lease_ttl_sec: int = DEFAULT_LEASE_TTL_SEC


@dataclass(frozen=True, slots=True)
class JobOptions:
    """What fills the options a job leaves out: its task's, else the settings' defaults
    (`queue` stays None when the task names none: the job must then name its own)."""

    queue: str | None
    priority: int
    max_attempts: int
    lease_ttl_sec: int

    @classmethod
    def of(cls, task: Task | None, defaults: JobDefaults) -> JobOptions:
        def pick(name: str) -> Any:
            of_task = getattr(task, name) if task is not None else None
            return of_task if of_task is not None else getattr(defaults, name)

        return cls(
            queue=task.queue if task is not None else None,
            priority=pick("priority"),
            max_attempts=pick("max_attempts"),
            lease_ttl_sec=pick("lease_ttl_sec"),
        )

    def fill(self, job: NewJob, name: str) -> Any:
        """`job`'s option `name`, or this default of it."""
        own = getattr(job, name)
        return own if own is not None else getattr(self, name)


#: The options a job may leave out, to be filled by `JobOptions`.
FILLED_OPTIONS: Final = ("queue", "priority", "max_attempts", "lease_ttl_sec")


@dataclass(frozen=True, slots=True, kw_only=True)
class NewJob:
    """What a producer asks for (the spec's trigger input, plus optional per-job limits).

    Checked when built: a field out of bounds raises `InvalidJob` naming it, before anything
    is sent. `queue`, `priority`, `max_attempts` and `lease_ttl_sec` may be left None: they
    come from the task's definition or the settings (`JobOptions`), filled when it is
    inserted. A job without a `lock_key` needs no mutual exclusion: it takes no lock and
    waits for no other job (it is stored `lock_free`).
    """

    task: str
    #: Jobs sharing a lock_key never run at the same time (an advisory lock on its hash, as
    #: the spec's protocol takes); None: this job excludes no other.
    lock_key: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None
    idempotency_key: str | None = None
    partition_key: str = ""
    priority: int | None = None
    #: When the job may start (None: now); `delay` counts from the database's clock instead.
    available_at: datetime | None = None
    delay: timedelta | None = None
    max_attempts: int | None = None
    lease_ttl_sec: int | None = None
    producer: str | None = None
    consumer_group: str | None = None
    #: When `idempotency_key` already names a job: run it again (a finished job is queued with
    #: a fresh budget; a running one runs once more after it ends) instead of returning it.
    rerun: bool = False
    #: `args` as JSON text, as checked and as sent (PostgreSQL casts it to jsonb).
    args_json: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.args, BaseModel):
            object.__setattr__(self, "args", self.args.model_dump(mode="json"))
        for name, check in limits.JOB_FIELD_CHECKS.items():
            value = getattr(self, name)
            if value is None and name in limits.OPTIONAL_JOB_FIELDS:
                continue
            try:
                checked = check(value)
            except ValueError as exc:
                raise InvalidJob(name, str(exc)) from None
            if name == "args":
                object.__setattr__(self, "args_json", checked)
        if self.delay is not None:
            if self.available_at is not None:
                raise InvalidJob("delay", "give available_at or delay, not both")
            if not isinstance(self.delay, timedelta) or not (
                timedelta(0) <= self.delay <= timedelta(seconds=MAX_DELAY_SEC)
            ):
                raise InvalidJob(
                    "delay", f"must be a timedelta from 0 to {MAX_DELAY_SEC / 86_400:.0f} days"
                )
        if self.rerun and self.idempotency_key is None:
            raise InvalidJob("rerun", "re-running on update needs an idempotency_key")

    def check_queue(self, options: JobOptions) -> None:
        """InvalidJob unless the job, or its task, names a queue."""
        if self.queue is None and options.queue is None:
            raise InvalidJob("queue", f"required: task {self.task!r} does not name its queue")

    @property
    def is_resolved(self) -> bool:
        """Whether every option the table needs is filled."""
        return None not in (self.queue, self.priority, self.max_attempts, self.lease_ttl_sec)

    @property
    def delay_sec(self) -> float | None:
        return None if self.delay is None else self.delay.total_seconds()


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """The job an enqueue created, or found by its idempotency key."""

    job_id: uuid.UUID
    status: JobStatus
    #: Whether this call created the job (False: its idempotency_key already named it).
    created: bool
    #: Whether this call asked an existing job to run again (`rerun`).
    rerun: bool = False


@dataclass(frozen=True, slots=True)
class JobState:
    """A job as readers see it (the spec's status fields first)."""

    job_id: uuid.UUID
    status: JobStatus
    attempt: int
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    error: str | None
    progress: dict[str, Any]
    queue: str
    task: str
    max_attempts: int
    cancel_requested: bool
    created_at: datetime
    available_at: datetime
    #: None: the job runs without mutual exclusion (it was enqueued without a lock_key).
    lock_key: str | None
    idempotency_key: str | None
    priority: int
    #: The task's return value when the last attempt succeeded (JSON), else None.
    result: Any
    #: How long the last attempt that ended ran, in milliseconds (None while one runs): it
    #: started at `attempted_at`, and ran until `finished_at` when it ended the job.
    duration_ms: int | None
    #: The worker process that made the last claim.
    worker_id: str | None
    #: The cursor the task last saved with `ctx.checkpoint` (None: none).
    checkpoint: Any
    rerun_requested: bool
    #: When the current (or last) attempt started; `started_at` is the first attempt's.
    attempted_at: datetime | None = None
    #: The cluster whose database holds it (`DL_CLUSTERS`), when read through several.
    cluster: str | None = None

    @property
    def finished(self) -> bool:
        """Whether the job is in a final state (succeeded, failed, canceled, lost)."""
        return self.status in {
            JobStatus.SUCCEEDED,
            JobStatus.FAILED,
            JobStatus.CANCELED,
            JobStatus.LOST,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFilter:
    """Which jobs a list (or a bulk cancel or retry) takes: those matching every field given
    (None: any). Times are ranges, `from` inclusive, `until` exclusive. `args` is a JSON
    object (or its text) the job's args contain, as PostgreSQL's `@>` says: `{"day":
    "2026-01-01"}` matches every job whose args have that key with that value, whatever else
    they hold; `{"ids": [3]}` those whose `ids` list holds 3."""

    queue: str | None = None
    status: JobStatus | None = None
    task: str | None = None
    lock_key: str | None = None
    partition_key: str | None = None
    created_from: datetime | None = None
    created_until: datetime | None = None
    finished_from: datetime | None = None
    finished_until: datetime | None = None
    #: Given as text, it is parsed (a dict once built).
    args: dict[str, Any] | str | None = None

    def __post_init__(self) -> None:
        if self.args is not None:
            try:
                object.__setattr__(self, "args", limits.check_args_filter(self.args))
            except ValueError as exc:
                raise InvalidJob("args", str(exc)) from None
        if self.status is not None:
            try:
                object.__setattr__(self, "status", JobStatus(self.status))
            except ValueError:
                known = ", ".join(s.value for s in JobStatus)
                raise InvalidJob("status", f"must be one of {known}") from None
        for name in ("created_from", "created_until", "finished_from", "finished_until"):
            value = getattr(self, name)
            if value is not None:
                try:
                    limits.check_instant(value)
                except ValueError as exc:
                    raise InvalidJob(name, str(exc)) from None

    def given(self) -> dict[str, Any]:
        """The fields given, by name."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: value for name, value in values.items() if value is not None}


@dataclass(frozen=True, slots=True)
class Stage:
    """A job to enqueue when the running one succeeds, in the same transaction as its success
    (`ctx.then`, a task's `then=`): nothing of it is written if the job fails."""

    task: str
    args: dict[str, Any] = field(default_factory=dict)
    #: None: the running job's lock_key (the stages of one entity run one after another).
    lock_key: str | None = None
    #: None: the stage task's own queue, else the running job's.
    queue: str | None = None
    priority: int | None = None
    #: Wait this long after the success before it may start.
    delay: timedelta | None = None
    #: None: the running job's partition_key (the entity's stages keep its partition).
    partition_key: str | None = None

    def __post_init__(self) -> None:
        for name, check in (("task", limits.check_name), ("args", limits.check_args)):
            try:
                check(getattr(self, name))
            except ValueError as exc:
                raise InvalidJob(name, str(exc)) from None


#: A stage job's idempotency_key starts with this, then its parent's job id
#: (`stage:<job_id>:<claim_token>:<n>`, see `stage_key`).
STAGE_KEY_PREFIX: Final = "stage:"


def stage_key(parent_id: uuid.UUID, claim_token: uuid.UUID | None, n: int) -> str:
    """The idempotency_key of the `n`th stage enqueued by the success of `parent_id`'s claim
    `claim_token`: a write of that success tried again enqueues its stages once, and the job's
    next run (a re-run, a retry by hand) enqueues them again. It names the parent: the stage
    is found from it, and its parent's stages by it."""
    return f"{STAGE_KEY_PREFIX}{parent_id}:{claim_token}:{n}"


def stage_parent(idempotency_key: str | None) -> uuid.UUID | None:
    """The job whose success enqueued the job of `idempotency_key`, if it is a stage's."""
    if idempotency_key is None or not idempotency_key.startswith(STAGE_KEY_PREFIX):
        return None
    try:
        return uuid.UUID(idempotency_key[len(STAGE_KEY_PREFIX) :].split(":", 1)[0])
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class QueueStats:
    """What one queue holds now. The jobs in it are `ready` (due, claimable), `waiting` (due,
    behind a running job of their lock_key), `delayed` (not due yet) or `running`; `failed`
    and `lost` count ended jobs that may want a look (finished jobs are history: not counted,
    so the figures cost the same with millions of them in the table)."""

    queue: str
    ready: int
    waiting: int
    delayed: int
    running: int
    failed: int
    lost: int
    #: Seconds since the longest-waiting due job (ready or waiting) became due; None: none is.
    oldest_ready_age_sec: float | None
    #: Paused: no worker claims its jobs (see `Client.pause`); by whom, and since when.
    paused: bool = False
    paused_by: str | None = None
    paused_at: datetime | None = None
    #: Its limits across every replica (`Client.set_limits`).
    limits: QueueLimits = field(default_factory=QueueLimits)
    #: Live processes serving it, and their slots for it (slots shared by several queues
    #: count for each).
    workers: int = 0
    slots: int = 0
    #: Attempts its workers ended in the last 1, 5 and 60 minutes.
    throughput: tuple[Throughput, ...] = ()

    @property
    def total(self) -> int:
        """The jobs in the queue: ready, waiting, delayed and running."""
        return self.ready + self.waiting + self.delayed + self.running


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One entry of a job's journal."""

    event_id: int
    kind: str
    ts: datetime
    payload: dict[str, Any] | None
