"""Where a job goes next: every change of a job's state is decided here, without I/O.

A decision reads a snapshot of the job (`JobFacts`) and what happened (an `Outcome` of an
attempt, a lease that expired, a client's cancel or retry) and returns a `Transition`: the
job's next status and counters, when it may run again, what its error, result and duration
become, and the journal entry that records it. Storage applies a transition with one fenced
statement (`storage/protocol.py`, `storage/repositories.py`) that writes only if the row still
matches the snapshot; when it does not (a cancel was requested meanwhile, say), the caller
reads the row again and decides again. So a new state, a new policy or a new flag is a change
here, and its rules are tested without a database.

Facts, outcomes and transitions are values: nothing changes one once built (`replace` makes
another). They are not frozen dataclasses only because the worker builds each of them once per
job, and a frozen one costs three times as much to build.

    queued ──claim──► running ──success──────────────────────► succeeded
      ▲                  │ ├─failure, attempts left──► queued (after the retry policy's delay)
      │                  │ ├─failure, none left / not retryable──► failed
      │                  │ ├─cancel requested, honoured──► canceled
      │                  │ ├─handed back (shutdown, lock or lease lost)─► queued (refunded)
      │                  │ └─lease expired (reaper)──► queued, or lost on the last attempt
      └──client retry── failed / lost / canceled;   rerun requested ──► queued, fresh budget
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Final

from dataloader.base import JobStatus
from dataloader.core.retry import Linear, RetryPolicy, delay_of
from dataloader.exceptions import NotRetryable

#: The statuses a job never leaves by itself.
FINAL_STATUSES: Final = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.LOST}
)
#: Final statuses a client may send back to the queue (a success is re-run, not retried).
RETRYABLE_STATUSES: Final = frozenset({JobStatus.FAILED, JobStatus.CANCELED, JobStatus.LOST})
#: Hand-backs whose attempt is refunded, per job; later ones consume an attempt, so that a job
#: that keeps bringing its process down still ends.
MAX_REFUNDED_HANDBACKS: Final = 3


class Keep(Enum):
    """A column the transition leaves as it is."""

    KEEP = "keep"


KEEP: Final = Keep.KEEP


@dataclass(slots=True)
class JobFacts:
    """What a decision needs to know of a job: its row as last read (or as claimed)."""

    status: JobStatus
    attempt: int
    max_attempts: int
    handbacks: int = 0
    cancel_requested: bool = False
    rerun_requested: bool = False


class Ended(Enum):
    """How an attempt ended."""

    SUCCEEDED = "succeeded"
    #: The task raised (or timed out): retried while attempts remain and the error allows it.
    FAILED = "failed"
    #: The task honoured a cancel request.
    CANCELED = "canceled"
    #: Our side cut the run short (shutdown, lost lock or lease): back to the queue.
    HANDED_BACK = "handed_back"
    #: Claimed but never started: its lock_key was busy. Back to the queue, attempt refunded.
    BACKED_OFF = "backed_off"
    #: Claimed but never started, given back by its worker (claimed ahead with no slot free in
    #: time, or the worker stopping first): back to the queue as a backoff, attempt refunded,
    #: no hand-back counted.
    UNSTARTED = "unstarted"


#: How an attempt that never started ends: its job goes back as a backoff.
NEVER_STARTED: Final = frozenset({Ended.BACKED_OFF, Ended.UNSTARTED})


@dataclass(slots=True)
class Outcome:
    """What happened to one attempt."""

    ended: Ended
    error: str | None = None
    #: FAILED: False for an error retrying cannot help (the job fails at once).
    retryable: bool = True
    #: FAILED: the delay the task chose (`Retry(after=…)`), instead of the retry policy's.
    retry_after_sec: float | None = None
    #: HANDED_BACK: refund the attempt (bounded by MAX_REFUNDED_HANDBACKS).
    refund: bool = False
    #: BACKED_OFF: who holds the lock_key (`none`, `running job`, `outside dataloader`) and
    #: the delay applied when it is someone outside dataloader.
    holder: str | None = None
    backoff_sec: float = 0.0
    #: SUCCEEDED: the task's return value as JSON text (None: it returned None).
    result: str | None = None
    #: How long the task ran (None when it never started).
    duration_ms: int | None = None
    #: The tasks of the next stages: enqueued with a success (journaled `then`); named as
    #: `stopped_before` when the job ends failed or canceled.
    stages: tuple[str, ...] = ()
    #: FAILED: what the task raised, whose traceback the log shows if the job fails for good
    #: (a failure that will be retried is one line: it is expected).
    raised: BaseException | None = field(default=None, compare=False, repr=False)
    #: FAILED: the traceback of what the task raised, as text (secrets masked, bounded), kept
    #: in the journal entry of the attempt's end.
    traceback: str | None = field(default=None, compare=False, repr=False)
    #: More to write in the transaction of the job's outcome, only if that write passes the
    #: job's fence (a durable process's save: `storage.processes.StepSave`): storage calls its
    #: `apply(conn)` there.
    effects: Any = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class Transition:
    """A decided change of one job, with absolute new values (applied only if the row still
    matches the facts it was decided on)."""

    status: JobStatus
    #: Kind of the journal entry written with it.
    journal: str
    attempt: int
    handbacks: int
    #: When the job is queued: seconds until it may be claimed.
    retry_in_sec: float = 0.0
    error: str | Keep | None = KEEP
    result: str | Keep | None = KEEP
    duration_ms: int | Keep | None = KEEP
    #: The attempt never started (a backoff of a first claim): no start or heartbeat time.
    clear_start: bool = False
    #: New values of the request flags.
    cancel_requested: bool | Keep = KEEP
    rerun_requested: bool | Keep = KEEP
    clear_checkpoint: bool = False
    #: New args (JSON text) for a re-run of a newer version (None: unchanged).
    args_json: str | None = None
    #: More of the journal entry (reason, error, holder …).
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES


@dataclass(frozen=True, slots=True)
class Request:
    """A flag set on a job without changing its status (a running job's cancel or re-run)."""

    journal: str
    cancel: bool = False
    rerun: bool = False
    #: New args (JSON text) for a re-run of a newer version (None: unchanged).
    args_json: str | None = None


def after_attempt(
    outcome: Outcome,
    job: JobFacts,
    retry: RetryPolicy,
    *,
    fallback: RetryPolicy | None = None,
) -> Transition:
    """The transition of a running job whose attempt ended with `outcome`. `retry` decides
    the delay before the next attempt of a failure (`fallback`, by default `Linear()`, when
    it misbehaves)."""
    ended = outcome.ended
    ran = {} if ended in NEVER_STARTED else _attempt_columns(outcome)
    if ended is Ended.SUCCEEDED:
        then = {"then": list(outcome.stages)} if outcome.stages else {}
        return _rerun_or(
            job,
            Transition(
                JobStatus.SUCCEEDED,
                "done",
                job.attempt,
                job.handbacks,
                error=None,
                detail=then,
                **ran,
            ),
        )
    if ended in NEVER_STARTED:
        return _backed_off(outcome, job)
    if ended is Ended.HANDED_BACK and not job.cancel_requested:
        return _handed_back(outcome, job)
    if job.cancel_requested or ended is Ended.CANCELED:
        # a failure, a hand-back or a cancel: the cancel request wins (with no request, only
        # a worker bug gets here)
        transition = Transition(JobStatus.CANCELED, "canceled", job.attempt, job.handbacks, **ran)
        if ended is Ended.CANCELED and outcome.error is not None:
            # a worker that ends its job canceled says why (a process's task whose process is
            # gone: its caller reads it back)
            transition.error = outcome.error
    else:
        # not `retry` itself: a policy that misbehaved would be asked again and misbehave
        transition = _failed(outcome, job, retry, fallback or Linear(), ran)
    if outcome.stages and transition.finished:  # the chain stops here, visibly
        transition.detail = {**transition.detail, "stopped_before": list(outcome.stages)}
    return transition


def on_expired(job: JobFacts) -> Transition:
    """The reaper found the running job's lease expired: its worker is gone or cut off. The
    attempt did not succeed: it leaves no result (a result of an earlier run, kept by a re-run
    until the next attempt ends, would otherwise outlive it)."""
    reason = "lease expired"
    if job.cancel_requested:
        return Transition(
            JobStatus.CANCELED,
            "canceled",
            job.attempt,
            job.handbacks,
            result=None,
            detail={"reason": reason},
        )
    if job.attempt < job.max_attempts:
        return _rerun_or(
            job,
            Transition(
                JobStatus.QUEUED,
                "requeue",
                job.attempt,
                job.handbacks,
                result=None,
                detail={"reason": reason},
            ),
        )
    return _rerun_or(
        job,
        Transition(
            JobStatus.LOST,
            "lost",
            job.attempt,
            job.handbacks,
            error="lease expired on the last attempt",
            result=None,
            detail={"reason": reason},
        ),
    )


def on_cancel(job: JobFacts) -> Transition | Request | None:
    """A client asked to cancel: a queued job ends at once, a running one is asked to stop
    (it ends `canceled` when it honours the request, or at its next outcome); a finished job,
    or one already asked, is left alone (None)."""
    if job.status is JobStatus.QUEUED:
        return Transition(
            JobStatus.CANCELED, "canceled", job.attempt, job.handbacks, cancel_requested=True
        )
    if job.status is JobStatus.RUNNING and not job.cancel_requested:
        return Request("cancel_requested", cancel=True)
    return None


def on_retry(job: JobFacts) -> Transition:
    """A client sends a failed, lost or canceled job back to the queue, with a fresh budget of
    attempts (its error stays until the next attempt ends; a checkpoint stays too, so the next
    attempt resumes where the last one stopped)."""
    if job.status not in RETRYABLE_STATUSES:
        why = {
            JobStatus.SUCCEEDED: "it succeeded (enqueue it again, or re-run it on update)",
            JobStatus.QUEUED: "it is queued already",
            JobStatus.RUNNING: "it is running",
        }[job.status]
        raise NotRetryable(f"job cannot be retried: {why}")
    return Transition(
        JobStatus.QUEUED,
        "retried",
        0,
        0,
        cancel_requested=False,
        # a re-run left requested when the job was canceled is served by this run
        rerun_requested=False,
        detail={"was": job.status.value},  # the journal adds who asked (`by`)
    )


def on_rerun(job: JobFacts, args_json: str) -> Transition | Request:
    """A job was enqueued again under its idempotency key with the re-run policy, with
    `args_json` as its newest version: a finished job runs again (a fresh budget, from the
    start); a running one runs once more after it ends; a queued one runs the newest version
    when its turn comes."""
    if job.status in FINAL_STATUSES:
        return Transition(
            JobStatus.QUEUED,
            "rerun",
            0,
            0,
            cancel_requested=False,
            rerun_requested=False,
            clear_checkpoint=True,
            args_json=args_json,
            detail={"was": job.status.value},
        )
    if job.status is JobStatus.RUNNING:
        return Request("rerun_requested", rerun=True, args_json=args_json)
    return Request("updated", args_json=args_json)


def _attempt_columns(outcome: Outcome) -> dict[str, Any]:
    """What an attempt that ran leaves behind: its result (None but on success) and duration."""
    return {"result": outcome.result, "duration_ms": outcome.duration_ms}


def _rerun_or(job: JobFacts, transition: Transition) -> Transition:
    """`transition`, unless a re-run was requested meanwhile: then the job goes back to the
    queue for its newest version, with a fresh budget and from the start. A cancel request
    wins over a re-run as it wins over a failure's next attempt: the job ends as it ended."""
    if not job.rerun_requested or transition.status is JobStatus.CANCELED:
        return transition
    if job.cancel_requested:  # only a success gets here with a cancel requested
        return replace(transition, rerun_requested=False)
    return Transition(
        JobStatus.QUEUED,
        "rerun",
        0,
        0,
        error=transition.error,
        result=transition.result,
        duration_ms=transition.duration_ms,
        rerun_requested=False,
        clear_checkpoint=True,
        # a success's stages are not enqueued: the newest version runs, and its success will
        detail={
            **{k: v for k, v in transition.detail.items() if k != "then"},
            "ended": transition.journal,
        },
    )


def _backed_off(outcome: Outcome, job: JobFacts) -> Transition:
    """The job never started (its lock_key was busy, or its worker gave it back unstarted):
    the attempt is refunded, and journalled `backoff` with who held the key, or why it was
    given back. It may be claimed again at once unless the key is held outside dataloader
    (then after the backoff delay): claims skip jobs whose key a running job holds, and that
    job's end wakes them."""
    detail: dict[str, Any] = (
        {"holder": outcome.holder}
        if outcome.ended is Ended.BACKED_OFF
        else {"reason": outcome.error}
    )
    if job.cancel_requested:
        return Transition(
            JobStatus.CANCELED,
            "canceled",
            job.attempt - 1,
            job.handbacks,
            clear_start=job.attempt == 1,
            detail=detail,
        )
    delay = outcome.backoff_sec if outcome.holder == "outside dataloader" else 0.0
    if job.rerun_requested:
        # A re-run asked for while the job was claimed: it never ran, so its next run, of the
        # newest version, is that re-run (keeping the request would run that version twice).
        return Transition(
            JobStatus.QUEUED,
            "rerun",
            0,
            0,
            retry_in_sec=delay,
            clear_start=job.attempt == 1,
            rerun_requested=False,
            clear_checkpoint=True,
            detail={**detail, "ended": "backoff"},
        )
    return Transition(
        JobStatus.QUEUED,
        "backoff",
        job.attempt - 1,
        job.handbacks,
        retry_in_sec=delay,
        clear_start=job.attempt == 1,
        detail=detail,
    )


def _handed_back(outcome: Outcome, job: JobFacts) -> Transition:
    """Our side cut the run short: refunded while the job has had fewer than
    MAX_REFUNDED_HANDBACKS refunds; without a refund, a job on its last attempt is lost. Like
    an expired lease, it leaves no result."""
    refund = outcome.refund and job.handbacks < MAX_REFUNDED_HANDBACKS
    reason = outcome.error or "handed back"
    detail = {"reason": reason, "refunded": refund}
    if refund:
        return _rerun_or(
            job,
            Transition(
                JobStatus.QUEUED,
                "requeue",
                job.attempt - 1,
                job.handbacks + 1,
                result=None,
                detail=detail,
            ),
        )
    if job.attempt < job.max_attempts:
        return _rerun_or(
            job,
            Transition(
                JobStatus.QUEUED, "requeue", job.attempt, job.handbacks, result=None, detail=detail
            ),
        )
    return _rerun_or(
        job,
        Transition(
            JobStatus.LOST,
            "lost",
            job.attempt,
            job.handbacks,
            error=reason,
            result=None,
            detail=detail,
        ),
    )


def _failed(
    outcome: Outcome,
    job: JobFacts,
    retry: RetryPolicy,
    fallback: RetryPolicy,
    ran: dict[str, Any],
) -> Transition:
    error = outcome.error or "error"
    detail: dict[str, Any] = {"reason": "error", "error": error}
    if outcome.traceback:
        detail["traceback"] = outcome.traceback
    if not outcome.retryable or job.attempt >= job.max_attempts:
        return _rerun_or(
            job,
            Transition(
                JobStatus.FAILED,
                "failed",
                job.attempt,
                job.handbacks,
                error=error,
                detail=detail,
                **ran,
            ),
        )
    if outcome.retry_after_sec is not None:
        delay = outcome.retry_after_sec
    else:
        delay, problem = delay_of(retry, job.attempt, fallback)
        if problem is not None:
            detail["retry_policy"] = problem
    return _rerun_or(
        job,
        Transition(
            JobStatus.QUEUED,
            "requeue",
            job.attempt,
            job.handbacks,
            retry_in_sec=delay,
            error=error,
            detail=detail,
            **ran,
        ),
    )
