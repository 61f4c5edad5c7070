"""Durable processes: what a process is, what a processor returns, and every decision about a
process's next state, without I/O.

A process (`namespace`, `process_id`) lives for as long as its users need (days, months):
it holds a status, an `aux_state`, a history of events numbered 1, 2, 3… and at most one
pending timer. It changes only by *tasks*, run one at a time: `init`, `call` and `repair`
come from outside (a caller waits for the processor's response), `timeout` and `remove` are
timers the processor set. Each task is a job of the namespace's queue, whose `lock_key` is the
process's own (`lock_key_of`): the queue's mutual exclusion runs one task of a process at a
time, in claim order, and external tasks are claimed before timers (`TIMER_PRIORITY_STEP`).

Storage applies what is decided here in one transaction with the task's end, fenced on the
claimed attempt (`storage/processes.py`); the worker runs the processor between the two
(`workers/processes.py`). So every rule of the model (what a call to a process in `error`
gets, what a zombie leaves, which timer is canceled when) is a function of this module, tested
without a database.

    start ──► init ──init saved──► running ◄──repair saved── error
                 │                   │  ▲                      ▲
                 │                   └──┘ call / timeout saved │
                 └─────── step failed for good, or a zombie ───┘ (from init or running)
    remove (a task, a timer, or a processor's action): the process is gone; its id is free
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum, StrEnum
from typing import Any, Final

from dataloader.core import limits
from dataloader.core.retry import RetryPolicy

#: Prefix of the task name of a namespace's processor (`process:orders`).
TASK_PREFIX: Final = "process:"
#: Timers are claimed after the external tasks of their queue: a due timer of a process waits
#: while a call to it waits, and fires after it.
TIMER_PRIORITY_STEP: Final = 1
#: A namespace is a name short enough that its processor's task name (TASK_PREFIX + it) is one.
NAMESPACE_MAX_CHARS: Final = limits.NAME_MAX_CHARS - len(TASK_PREFIX)  # 192
NAMESPACE_MAX_BYTES: Final = NAMESPACE_MAX_CHARS * limits.UTF8_MAX_BYTES_PER_CHAR
#: Byte budget of a process_id: the unique index of live processes holds it beside the
#: namespace (NAMESPACE_MAX_BYTES), within a btree entry's ~2,700 bytes.
PROCESS_ID_MAX_BYTES: Final = 1600
PROCESS_ID_MAX_CHARS: Final = PROCESS_ID_MAX_BYTES // limits.UTF8_MAX_BYTES_PER_CHAR  # 400
#: Events one step may append.
EVENTS_PER_STEP_MAX: Final = 10_000
#: Default of the events a processor is given (the last ones of the history).
DEFAULT_HISTORY: Final = 100
#: Longest history window a namespace may ask for.
HISTORY_MAX: Final = 100_000
#: A step's `detail` is cut to this many characters.
DETAIL_MAX_CHARS: Final = 2000
#: What a process in `error` after a zombie says.
ZOMBIE_DETAIL: Final = "zombie detected"


class ProcessStatus(StrEnum):
    """Where a process is. `init` until its init task is saved; `error` once a task failed for
    good or died half-way: only `repair` is accepted then."""

    INIT = "init"
    RUNNING = "running"
    ERROR = "error"


class TaskKind(StrEnum):
    """What a task of a process is: `init`, `call`, `repair` and `remove` come from callers
    (who wait for the end, and the response of the first three); `timeout` and `remove` are
    the timers a processor sets (`TaskArgs.timer`)."""

    INIT = "init"
    CALL = "call"
    REPAIR = "repair"
    TIMEOUT = "timeout"
    REMOVE = "remove"


class Keep(Enum):
    """A part of the process a result leaves as it is."""

    KEEP = "keep"


KEEP: Final = Keep.KEEP


# what the processor sees --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of a process's history."""

    event_id: int
    payload: Any
    metadata: Mapping[str, Any] | None
    #: The task (job) whose step appended it.
    task_id: uuid.UUID
    ts: datetime


@dataclass(frozen=True, slots=True)
class Timer:
    """A process's pending timer: a `timeout` or `remove` task due at `due_at`."""

    kind: TaskKind
    due_at: datetime
    task_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Process:
    """A process as its processor and its readers see it. `history` holds the last events
    only (the namespace's `history` window), oldest first; `last_event_id` counts them all."""

    namespace: str
    process_id: str
    queue: str
    status: ProcessStatus
    detail: str | None
    aux_state: Any
    metadata: Mapping[str, Any]
    last_event_id: int
    created_at: datetime
    updated_at: datetime
    timer: Timer | None = None
    corrupted_by: uuid.UUID | None = None
    history: Sequence[Event] = ()


@dataclass(frozen=True, slots=True)
class ProcessTask:
    """The task a processor is called for: its kind, the caller's args (a JSON object, or
    None: always for timers) and the job that carries it."""

    kind: TaskKind
    args: Any
    task_id: uuid.UUID
    #: Which call of the processor this is for the task (1, then 2… on retries).
    attempt: int = 1


# what the processor returns -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SetTimer:
    """Run a `timeout` task of the process after `in_sec` seconds, or at `at` (one of them):
    replaces the pending timer, if any."""

    in_sec: float | None = None
    at: datetime | None = None

    def __post_init__(self) -> None:
        _one_time(self.in_sec, self.at, "SetTimer")


@dataclass(frozen=True, slots=True)
class UnsetTimer:
    """Cancel the pending timer, if any (it never fires)."""


@dataclass(frozen=True, slots=True)
class Remove:
    """Remove the process: now (neither `in_sec` nor `at`), or by a `remove` timer that
    replaces the pending one."""

    in_sec: float | None = None
    at: datetime | None = None

    def __post_init__(self) -> None:
        if self.in_sec is not None or self.at is not None:
            _one_time(self.in_sec, self.at, "Remove")

    @property
    def now(self) -> bool:
        return self.in_sec is None and self.at is None


Action = SetTimer | UnsetTimer | Remove


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event with metadata of its own (a plain value appended is an event without)."""

    payload: Any
    metadata: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ProcessResult:
    """What one step of a processor decided: events to append, the new `aux_state`, `detail`
    and `metadata` (KEEP: unchanged), the `response` its caller gets (init, call, repair), and
    what happens next (`action`: a timer set or unset, or the process removed; None keeps the
    pending timer, unless the step is that timer firing)."""

    events: Sequence[Any] = ()
    aux_state: Any = KEEP
    detail: str | Keep | None = KEEP
    metadata: Mapping[str, Any] | Keep = KEEP
    response: Any = None
    action: Action | None = None


def _one_time(in_sec: float | None, at: datetime | None, what: str) -> None:
    if (in_sec is None) == (at is None):
        raise ValueError(f"{what} takes one of in_sec and at")
    if in_sec is not None and not 0 <= in_sec <= limits.INT32_MAX:
        raise ValueError(f"{what}.in_sec must be between 0 and {limits.INT32_MAX} seconds")
    if at is not None:
        limits.check_instant(at)


# names and keys -----------------------------------------------------------------------------


#: Texts a URL cannot carry as a path segment: browsers and HTTP clients resolve them away
#: (`a/./b` is `a/b`), even percent-encoded. A process's namespace and id are each one segment
#: of its URLs (`api.segments`), so they are refused as either.
DOT_SEGMENTS: Final = frozenset({".", ".."})


def check_namespace(value: object) -> str:
    """A namespace: a name of NAMESPACE_MAX_CHARS characters at most (its task's name is a
    name too), not `.` or `..` (see DOT_SEGMENTS)."""
    return _addressable(limits.check_text(value, NAMESPACE_MAX_CHARS))


def check_process_id(value: object) -> str:
    """A process_id: text of 1 to PROCESS_ID_MAX_CHARS characters, any but `.` and `..` (see
    DOT_SEGMENTS)."""
    return _addressable(limits.check_text(value, PROCESS_ID_MAX_CHARS))


def _addressable(text: str) -> str:
    if text in DOT_SEGMENTS:
        raise ValueError(f"{text!r} cannot be a segment of a URL's path")
    return text


def task_name_of(namespace: str) -> str:
    """The name of the task (in `dl_jobs.task`) that runs a namespace's processor."""
    return TASK_PREFIX + namespace


def namespace_of(task: str) -> str | None:
    """The namespace whose processor `task` runs, or None for an ordinary task."""
    return task[len(TASK_PREFIX) :] if task.startswith(TASK_PREFIX) else None


def lock_key_of(namespace: str, process_id: str) -> str:
    """The lock_key every task of a process shares (JSON, so that no pair of names spells
    another pair's key)."""
    return TASK_PREFIX + json.dumps([namespace, process_id], ensure_ascii=False)


def idempotency_key_of(process_ref: int, kind: TaskKind, key: str) -> str:
    """The idempotency_key of an external task of one incarnation of a process, bounded
    whatever the caller's key: a repeated call with the same key is the same job, and a
    process started anew under the same id does not answer with its predecessor's tasks."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{TASK_PREFIX}{process_ref}:{kind.value}:{digest}"


# the job that carries a task -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskArgs:
    """A task's job args: which incarnation of which process, what kind, the caller's args."""

    process_ref: int
    process_id: str
    kind: TaskKind
    args: Any = None
    #: A timer the processor set (a `timeout`, or a `remove` at a time), not a caller's task.
    timer: bool = False

    def as_job_args(self) -> dict[str, Any]:
        return {
            "process_ref": self.process_ref,
            "process_id": self.process_id,
            "kind": self.kind.value,
            "args": self.args,
            "timer": self.timer,
        }

    @classmethod
    def of_job(cls, args: Mapping[str, Any]) -> TaskArgs:
        """The task a job's args carry; ValueError if they are not a process task's."""
        try:
            return cls(
                int(args["process_ref"]),
                str(args["process_id"]),
                TaskKind(args["kind"]),
                args.get("args"),
                bool(args.get("timer", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not the args of a process task: {exc}") from None


def priority_of(timer: bool, priority: int) -> int:
    """The job priority of a task (a timer, or a caller's) of a namespace whose tasks have
    `priority`."""
    return priority + TIMER_PRIORITY_STEP if timer else priority


# admission: what a caller's request gets ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessFacts:
    """A process's row as last read: what the decisions need."""

    process_ref: int
    status: ProcessStatus
    #: The queue its tasks are jobs of.
    queue: str = ""
    timer_task: uuid.UUID | None = None
    #: The init task's args as JSON text (a repeated start is compared with them).
    init_args_json: str | None = None


class Refusal(StrEnum):
    """Why a request to a process is refused (HTTP 404 or 409)."""

    NOT_FOUND = "not_found"
    IN_ERROR = "in_error"
    NOT_IN_ERROR = "not_in_error"
    STARTED_WITH_OTHER_ARGS = "started_with_other_args"
    #: A caller's idempotency_key already names a task of the process with other args.
    KEY_REUSED = "idempotency_key_reused"

    @property
    def conflict(self) -> bool:
        return self is not Refusal.NOT_FOUND


#: How the job of a task that did not run says why (its `error`, `refused_error`): a caller
#: who waits for the task, or asks for it again later, gets the refusal it would have had at
#: submit, whatever the process became since.
_REFUSED: Final = "refused ({reason}): "


def refused_error(refusal: Refusal, why: str) -> str:
    """The `error` of the job of a task refused when it came to run (`refusal_of` reads it
    back): no exception's `Type: message` starts so."""
    return _REFUSED.format(reason=refusal.value) + why


def refusal_of(error: str | None) -> Refusal | None:
    """The refusal the job of a task ended with (see `refused_error`), or None."""
    head = _REFUSED.split("{", 1)[0]
    if error is None or not error.startswith(head):
        return None
    reason, sep, _ = error[len(head) :].partition("): ")
    if not sep or reason not in Refusal._value2member_map_:
        return None
    return Refusal(reason)


def admit(kind: TaskKind, process: ProcessFacts | None) -> Refusal | None:
    """Whether an external task (or a removal) of `kind` is accepted for `process` (None: no
    such process). A call goes to a process that is not in `error`; a repair only to one in
    `error`; a removal to any process."""
    if process is None:
        return Refusal.NOT_FOUND
    if kind is TaskKind.REPAIR:
        return None if process.status is ProcessStatus.ERROR else Refusal.NOT_IN_ERROR
    if kind is TaskKind.REMOVE:
        return None
    return Refusal.IN_ERROR if process.status is ProcessStatus.ERROR else None


def admit_start(existing: ProcessFacts | None, args_json: str) -> Refusal | None:
    """A start of an id that is taken returns that process when it was started with the same
    args, and is refused otherwise; a free id is started."""
    if existing is None or existing.init_args_json is None:
        return None
    same = json.loads(existing.init_args_json) == json.loads(args_json)
    return None if same else Refusal.STARTED_WITH_OTHER_ARGS


# what a claimed task does -----------------------------------------------------------------------


#: The tasks a process in `error` runs: a repair, and a caller's removal.
RUN_IN_ERROR: Final = frozenset({TaskKind.REPAIR, TaskKind.REMOVE})


class Before(Enum):
    """What a claimed task does before its processor is called."""

    #: Call the processor.
    RUN = "run"
    #: A timer that is no longer the pending one: it ends canceled, nothing else changes.
    STALE_TIMER = "stale_timer"
    #: The process is gone (removed), or is another incarnation: the task ends canceled.
    GONE = "gone"
    #: The process is in `error` and the task is not a repair: the task fails.
    IN_ERROR = "in_error"
    #: A repair of a process that is not in `error` (another repair, admitted beside it, ran
    #: first): the task fails, as a later repair is refused.
    NOT_IN_ERROR = "not_in_error"
    #: An earlier attempt of this task started and never saved: a zombie.
    ZOMBIE = "zombie"


def before_step(
    process: ProcessFacts | None,
    task: TaskArgs,
    task_id: uuid.UUID,
    attempt: int,
    *,
    idempotent: bool,
) -> Before:
    """What a claimed task of a process does. `attempt` is the job's: above 1, an earlier
    attempt ran and ended without saving (its worker died, was cut off, or the step outran its
    timeout): unless the processor is idempotent, the process may be half-way through a side
    effect, and goes to `error` rather than run the step twice.

    The state a caller's task was admitted on (`admit`) is checked again here, where it
    holds until the step is saved (a process's tasks run one at a time, and nothing else
    writes its row): tasks admitted together, or before a step that changed the state, are
    refused as a later one would be."""
    if process is None or process.process_ref != task.process_ref:
        return Before.GONE
    if task.timer and process.timer_task != task_id:
        return Before.STALE_TIMER
    if process.status is ProcessStatus.ERROR and task.kind not in RUN_IN_ERROR:
        return Before.IN_ERROR
    if task.kind is TaskKind.REPAIR and process.status is not ProcessStatus.ERROR:
        return Before.NOT_IN_ERROR
    if attempt > 1 and not idempotent:
        return Before.ZOMBIE
    return Before.RUN


# what a step writes ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewTimer:
    """A timer task to insert: its kind and when it is due (`in_sec` from the database's
    clock, or `at`)."""

    kind: TaskKind
    in_sec: float | None = None
    at: datetime | None = None


@dataclass(frozen=True, slots=True)
class StepWrite:
    """What saving a step (or a failure) changes, beside the task's own end. Applied in one
    transaction with it, only if the task's fence holds."""

    #: The new status (None with `removed`).
    status: ProcessStatus | None
    detail: str | Keep | None = KEEP
    aux_state_json: str | Keep = KEEP
    metadata_json: str | Keep = KEEP
    corrupted_by: uuid.UUID | Keep | None = KEEP
    #: (payload JSON, metadata JSON or None) of each event appended, in order.
    events: tuple[tuple[str, str | None], ...] = ()
    #: The pending timer's task, canceled (it is queued: it never fires).
    cancel_timer: uuid.UUID | None = None
    #: The pending timer is gone (fired, canceled or replaced): the row forgets it.
    clear_timer: bool = False
    new_timer: NewTimer | None = None
    #: Every queued task of the process ends canceled (it went to `error`, or is removed).
    cancel_queued: bool = False
    removed: bool = False
    #: The response of an external task, as JSON text (None: null).
    response_json: str | None = None


def after_step(
    process: ProcessFacts,
    task: TaskArgs,
    task_id: uuid.UUID,
    result: ProcessResult,
    max_bytes: int,
) -> StepWrite:
    """What a step whose processor returned `result` writes. ValueError (with the part named)
    if a part of the result cannot be stored: the step then fails as if the processor had
    raised it."""
    if not isinstance(result, ProcessResult):
        raise ValueError(f"a processor returns a ProcessResult, not {type(result).__name__}")
    events = _events_json(result.events, max_bytes)
    aux: str | Keep = KEEP
    if result.aux_state is not KEEP:
        aux = _json(result.aux_state, max_bytes, "aux_state") or "null"
    metadata: str | Keep = KEEP
    if result.metadata is not KEEP:
        metadata = _metadata_json(result.metadata, max_bytes)
    detail = result.detail if isinstance(result.detail, Keep) else _detail(result.detail)
    response = None if task.timer else _json(result.response, max_bytes, "response")
    pending = process.timer_task
    # a timer that fires is no longer pending; the step may set the next one
    fired = task.timer and pending == task_id
    still_pending = None if fired else pending
    action = result.action
    status = ProcessStatus.RUNNING
    common: dict[str, Any] = {
        "detail": detail,
        "aux_state_json": aux,
        "metadata_json": metadata,
        "events": events,
        "response_json": response,
    }
    if task.kind is TaskKind.REPAIR:
        common["corrupted_by"] = None
        if isinstance(result.detail, Keep):
            common["detail"] = None  # the error it repaired is over
    if isinstance(action, Remove) and action.now:
        return StepWrite(
            None,
            **common,
            cancel_timer=still_pending,
            clear_timer=True,
            cancel_queued=True,
            removed=True,
        )
    if isinstance(action, SetTimer | Remove):
        kind = TaskKind.TIMEOUT if isinstance(action, SetTimer) else TaskKind.REMOVE
        return StepWrite(
            status,
            **common,
            cancel_timer=still_pending,
            clear_timer=True,
            new_timer=NewTimer(kind, action.in_sec, action.at),
        )
    if isinstance(action, UnsetTimer):
        return StepWrite(status, **common, cancel_timer=still_pending, clear_timer=True)
    return StepWrite(status, **common, clear_timer=fired)


def on_removal(process: ProcessFacts, task_id: uuid.UUID) -> StepWrite:
    """A `remove` task (a caller's, or a timer the processor set) removes the process without
    calling the processor."""
    pending = process.timer_task
    return StepWrite(
        None,
        cancel_timer=None if pending == task_id else pending,
        clear_timer=True,
        cancel_queued=True,
        removed=True,
    )


def on_failure(process: ProcessFacts, task_id: uuid.UUID, error: str) -> StepWrite:
    """A step failed for good (its processor raised on every attempt, or returned what cannot
    be stored): the process goes to `error` with the error as its detail, corrupted by the
    task; its pending timer and queued tasks are canceled (only a repair brings it back)."""
    return _broken(process, task_id, _detail(error))


def on_zombie(process: ProcessFacts, task_id: uuid.UUID) -> StepWrite:
    """An attempt of the task started and never saved: the process goes to `error`, as after
    a failure, with ZOMBIE_DETAIL."""
    return _broken(process, task_id, ZOMBIE_DETAIL)


def _broken(process: ProcessFacts, task_id: uuid.UUID, detail: str | None) -> StepWrite:
    pending = process.timer_task
    return StepWrite(
        ProcessStatus.ERROR,
        detail=detail,
        corrupted_by=task_id,
        cancel_timer=None if pending == task_id else pending,
        clear_timer=True,
        cancel_queued=True,
    )


def _events_json(events: Sequence[Any], max_bytes: int) -> tuple[tuple[str, str | None], ...]:
    if isinstance(events, str | bytes | Mapping) or not isinstance(events, Sequence):
        raise ValueError(f"events must be a list, not {type(events).__name__}")
    if len(events) > EVENTS_PER_STEP_MAX:
        raise ValueError(f"a step appends at most {EVENTS_PER_STEP_MAX} events, not {len(events)}")
    written = []
    for n, event in enumerate(events, 1):
        if isinstance(event, NewEvent):
            payload = _json(event.payload, max_bytes, f"event {n}") or "null"
            meta = None if event.metadata is None else _metadata_json(event.metadata, max_bytes)
            written.append((payload, meta))
        else:
            written.append((_json(event, max_bytes, f"event {n}") or "null", None))
    return tuple(written)


def _json(value: Any, max_bytes: int, what: str) -> str | None:
    return limits.result_json(value, max_bytes, what)


def _metadata_json(value: Any, max_bytes: int) -> str:
    if not isinstance(value, Mapping):
        raise ValueError(f"metadata must be a JSON object, not {type(value).__name__}")
    return _json(dict(value), max_bytes, "metadata") or "{}"


def _detail(value: object) -> str | None:
    if value is None:
        return None
    text = str(value).replace("\x00", "")
    return text[:DETAIL_MAX_CHARS]


@dataclass(frozen=True, slots=True)
class Namespace:
    """How a namespace's tasks run: its queue and priority, how many events its processor is
    given, how long a step may take, how often a raising processor is called (`attempts`,
    after the delays of `retry`), and whether its processor may be called twice for one task
    (after a crash half-way: `idempotent`)."""

    name: str
    queue: str
    priority: int = 100
    history: int = DEFAULT_HISTORY
    step_timeout_sec: float = 60.0
    attempts: int = 3
    retry: RetryPolicy | None = None
    idempotent: bool = False

    def __post_init__(self) -> None:
        check_namespace(self.name)
        limits.check_name(self.queue)
        if not 0 <= self.priority < limits.INT32_MAX:
            raise ValueError(f"priority must be between 0 and {limits.INT32_MAX - 1}")
        if not 0 <= self.history <= HISTORY_MAX:
            raise ValueError(f"history must be between 0 and {HISTORY_MAX} events")
        if not 0 < self.step_timeout_sec <= limits.INT32_MAX:
            raise ValueError("step_timeout_sec must be positive")
        limits.check_max_attempts(self.attempts)

    @property
    def task(self) -> str:
        return task_name_of(self.name)

    @property
    def max_attempts(self) -> int:
        """Attempts of a task's job (claims that started it): an idempotent processor's task
        runs again after a crash, `attempts` times in all; any other's second attempt is a
        zombie (`before_step`)."""
        return self.attempts if self.idempotent else ZOMBIE_ATTEMPT


#: The attempt of a task of a processor that is not idempotent that finds it a zombie.
ZOMBIE_ATTEMPT: Final = 2
