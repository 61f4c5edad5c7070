"""Unit tests of `dataloader.core.transitions`: every rule of a job's next state, no database."""

from __future__ import annotations

import math

import pytest

from dataloader.base import JobStatus
from dataloader.core.retry import Fixed, Linear, RetryPolicy
from dataloader.core.transitions import (
    KEEP,
    MAX_REFUNDED_HANDBACKS,
    Ended,
    JobFacts,
    Outcome,
    Request,
    Transition,
    after_attempt,
    on_cancel,
    on_expired,
    on_rerun,
    on_retry,
)
from dataloader.exceptions import NotRetryable

#: A policy whose delays are easy to tell apart from the fallback's (Linear(7): 7 × attempt).
POLICY = Fixed(42)
FALLBACK = Linear(7)


def running(
    attempt: int = 1,
    max_attempts: int = 3,
    *,
    handbacks: int = 0,
    cancel: bool = False,
    rerun: bool = False,
) -> JobFacts:
    """A running job's facts."""
    return JobFacts(JobStatus.RUNNING, attempt, max_attempts, handbacks, cancel, rerun)


def decide(outcome: Outcome, job: JobFacts, retry: RetryPolicy = POLICY) -> Transition:
    return after_attempt(outcome, job, retry, fallback=FALLBACK)


def failure(error: str = "ValueError: boom", **options: object) -> Outcome:
    return Outcome(Ended.FAILED, error, duration_ms=12, **options)  # type: ignore[arg-type]


SUCCESS = Outcome(Ended.SUCCEEDED, result='{"rows": 3}', duration_ms=25)


def raising_policy(attempt: int) -> float:
    raise RuntimeError("no delay today")


# --- success ----------------------------------------------------------------------------------


def test_success_ends_the_job_with_its_result_and_duration() -> None:
    t = decide(SUCCESS, running(attempt=2, handbacks=1))
    assert t.status is JobStatus.SUCCEEDED
    assert t.finished
    assert t.journal == "done"
    assert (t.attempt, t.handbacks) == (2, 1)
    assert t.result == '{"rows": 3}'
    assert t.duration_ms == 25
    assert t.error is None  # an error of an earlier attempt is cleared


def test_success_of_a_task_that_returned_none_stores_no_result() -> None:
    t = decide(Outcome(Ended.SUCCEEDED, duration_ms=1), running())
    assert t.status is JobStatus.SUCCEEDED
    assert t.result is None


def test_success_with_a_cancel_requested_still_succeeds() -> None:
    t = decide(SUCCESS, running(cancel=True))
    assert t.status is JobStatus.SUCCEEDED


def test_success_with_a_rerun_requested_queues_a_fresh_run_keeping_the_result() -> None:
    t = decide(SUCCESS, running(attempt=2, handbacks=2, rerun=True))
    assert t.status is JobStatus.QUEUED
    assert not t.finished
    assert t.journal == "rerun"
    assert (t.attempt, t.handbacks) == (0, 0)
    assert t.retry_in_sec == 0
    assert t.result == '{"rows": 3}'
    assert t.duration_ms == 25
    assert t.error is None
    assert t.rerun_requested is False
    assert t.clear_checkpoint
    assert t.detail["ended"] == "done"


def test_success_with_a_rerun_and_a_cancel_requested_succeeds_without_rerunning() -> None:
    t = decide(SUCCESS, running(cancel=True, rerun=True))
    assert t.status is JobStatus.SUCCEEDED
    assert t.result == '{"rows": 3}'
    assert t.rerun_requested is False  # the re-run is dropped, not left pending


# --- failure ----------------------------------------------------------------------------------


def test_failure_with_attempts_left_is_queued_after_the_policy_delay() -> None:
    t = decide(failure(), running(attempt=1, max_attempts=3))
    assert t.status is JobStatus.QUEUED
    assert t.journal == "requeue"
    assert t.attempt == 1  # the failed attempt counts
    assert t.retry_in_sec == 42
    assert t.error == "ValueError: boom"
    assert t.duration_ms == 12
    assert t.result is None
    assert t.detail == {"reason": "error", "error": "ValueError: boom"}


def test_a_failures_traceback_is_kept_in_its_journal_entry() -> None:
    with_traceback = Outcome(Ended.FAILED, "ValueError: boom", traceback="Traceback (…)")
    for attempt in (1, 3):  # retried, and failed for good
        t = decide(with_traceback, running(attempt=attempt, max_attempts=3))
        assert t.detail["traceback"] == "Traceback (…)"
    assert "traceback" not in decide(failure(), running()).detail


def test_failure_asks_the_policy_with_the_number_of_the_failed_attempt() -> None:
    t = decide(failure(), running(attempt=2, max_attempts=5), retry=Linear(10))
    assert t.retry_in_sec == 20


def test_failure_without_an_error_text_says_error() -> None:
    t = decide(Outcome(Ended.FAILED), running())
    assert t.error == "error"


def test_failure_on_the_last_attempt_fails_the_job() -> None:
    t = decide(failure(), running(attempt=3, max_attempts=3))
    assert t.status is JobStatus.FAILED
    assert t.finished
    assert t.journal == "failed"
    assert t.attempt == 3
    assert t.error == "ValueError: boom"
    assert t.duration_ms == 12
    assert t.detail == {"reason": "error", "error": "ValueError: boom"}


def test_a_non_retryable_failure_fails_the_job_with_attempts_left() -> None:
    t = decide(failure(retryable=False), running(attempt=1, max_attempts=5))
    assert t.status is JobStatus.FAILED
    assert t.attempt == 1


def test_a_failure_with_a_rerun_requested_reruns_at_once_keeping_the_error() -> None:
    t = decide(failure(), running(attempt=3, max_attempts=3, rerun=True))
    assert t.status is JobStatus.QUEUED
    assert t.journal == "rerun"
    assert (t.attempt, t.handbacks) == (0, 0)
    assert t.retry_in_sec == 0
    assert t.error == "ValueError: boom"
    assert t.clear_checkpoint
    assert t.detail["ended"] == "failed"


def test_retry_after_overrides_the_policy_delay() -> None:
    t = decide(failure(retry_after_sec=3.5), running())
    assert t.status is JobStatus.QUEUED
    assert t.retry_in_sec == 3.5
    assert "retry_policy" not in t.detail


def test_retry_after_of_zero_queues_at_once() -> None:
    t = decide(failure(retry_after_sec=0.0), running())
    assert t.retry_in_sec == 0


def test_retry_after_on_the_last_attempt_still_fails_the_job() -> None:
    t = decide(failure(retry_after_sec=1.0), running(attempt=3, max_attempts=3))
    assert t.status is JobStatus.FAILED


def test_retry_after_does_not_call_the_policy() -> None:
    t = decide(failure(retry_after_sec=5.0), running(), retry=raising_policy)
    assert t.retry_in_sec == 5.0
    assert "retry_policy" not in t.detail


def test_a_policy_that_raises_gets_the_fallback_delay_and_is_noted() -> None:
    t = decide(failure(), running(attempt=2, max_attempts=5), retry=raising_policy)
    assert t.status is JobStatus.QUEUED
    assert t.retry_in_sec == 14  # Linear(7) × 2
    assert t.detail["retry_policy"] == "retry policy raised RuntimeError: no delay today"


@pytest.mark.parametrize("bad", [math.nan, -1.0, math.inf, 1e12])
def test_a_policy_returning_no_delay_gets_the_fallback_delay_and_is_noted(bad: float) -> None:
    t = decide(failure(), running(attempt=1), retry=lambda attempt: bad)
    assert t.retry_in_sec == 7
    assert t.detail["retry_policy"] == f"retry policy returned {bad!r}, not a delay in seconds"


def test_a_policy_returning_no_number_gets_the_fallback_delay() -> None:
    t = decide(failure(), running(attempt=1), retry=lambda attempt: None)  # type: ignore[arg-type,return-value]
    assert t.retry_in_sec == 7
    assert t.detail["retry_policy"].startswith("retry policy raised TypeError")


def test_without_a_fallback_a_misbehaving_policy_gets_the_default_linear_delay() -> None:
    t = after_attempt(failure(), running(attempt=2), raising_policy)
    assert t.status is JobStatus.QUEUED
    assert t.retry_in_sec == Linear()(2)
    assert "retry_policy" in t.detail


def test_a_well_behaved_policy_leaves_no_note() -> None:
    t = decide(failure(), running())
    assert "retry_policy" not in t.detail


# --- cancel requested -------------------------------------------------------------------------


def test_a_failure_with_a_cancel_requested_is_canceled() -> None:
    t = decide(failure(), running(attempt=1, max_attempts=3, cancel=True))
    assert t.status is JobStatus.CANCELED
    assert t.finished
    assert t.journal == "canceled"
    assert t.attempt == 1
    assert t.duration_ms == 12
    assert t.error is KEEP


def test_a_non_retryable_failure_with_a_cancel_requested_is_canceled() -> None:
    t = decide(failure(retryable=False), running(cancel=True))
    assert t.status is JobStatus.CANCELED


def test_a_hand_back_with_a_cancel_requested_is_canceled_without_refund() -> None:
    outcome = Outcome(Ended.HANDED_BACK, "worker shutting down", refund=True, duration_ms=3)
    t = decide(outcome, running(attempt=2, handbacks=1, cancel=True))
    assert t.status is JobStatus.CANCELED
    assert (t.attempt, t.handbacks) == (2, 1)


def test_a_job_its_worker_ends_canceled_keeps_the_reason_it_gives() -> None:
    t = decide(Outcome(Ended.CANCELED, "the process was removed"), running(attempt=1))
    assert (t.status, t.error) == (JobStatus.CANCELED, "the process was removed")


def test_an_honoured_cancel_ends_canceled() -> None:
    t = decide(Outcome(Ended.CANCELED, duration_ms=8), running(attempt=1, cancel=True))
    assert t.status is JobStatus.CANCELED
    assert t.attempt == 1
    assert t.duration_ms == 8
    assert t.result is None


def test_a_cancel_without_a_request_still_ends_canceled() -> None:
    t = decide(Outcome(Ended.CANCELED), running())
    assert t.status is JobStatus.CANCELED


def test_a_cancel_request_wins_over_a_rerun_request_on_failure() -> None:
    t = decide(failure(), running(cancel=True, rerun=True))
    assert t.status is JobStatus.CANCELED


# --- backed off (lock_key busy; the attempt never started) ------------------------------------


def test_a_backoff_refunds_the_attempt() -> None:
    outcome = Outcome(Ended.BACKED_OFF, holder="running job", backoff_sec=30.0)
    t = decide(outcome, running(attempt=2, handbacks=1))
    assert t.status is JobStatus.QUEUED
    assert t.journal == "backoff"
    assert (t.attempt, t.handbacks) == (1, 1)
    assert t.detail == {"holder": "running job"}


def test_a_backoff_with_a_rerun_requested_queues_the_newest_version_fresh() -> None:
    outcome = Outcome(Ended.BACKED_OFF, holder="outside dataloader", backoff_sec=30.0)
    t = decide(outcome, running(attempt=2, handbacks=1, rerun=True))
    assert (t.status, t.journal, t.attempt, t.handbacks) == (JobStatus.QUEUED, "rerun", 0, 0)
    assert (t.rerun_requested, t.clear_checkpoint) == (False, True)
    assert t.retry_in_sec == 30.0  # the key is still held elsewhere
    assert t.detail == {"holder": "outside dataloader", "ended": "backoff"}


def test_a_backoff_of_a_first_claim_clears_the_start() -> None:
    t = decide(Outcome(Ended.BACKED_OFF, holder="none"), running(attempt=1))
    assert t.attempt == 0
    assert t.clear_start


def test_a_backoff_of_a_later_claim_keeps_the_start_of_the_first() -> None:
    t = decide(Outcome(Ended.BACKED_OFF, holder="none"), running(attempt=2))
    assert not t.clear_start


def test_a_backoff_behind_a_running_job_is_claimable_at_once() -> None:
    outcome = Outcome(Ended.BACKED_OFF, holder="running job", backoff_sec=30.0)
    assert decide(outcome, running()).retry_in_sec == 0


def test_a_backoff_behind_no_holder_is_claimable_at_once() -> None:
    outcome = Outcome(Ended.BACKED_OFF, holder="none", backoff_sec=30.0)
    assert decide(outcome, running()).retry_in_sec == 0


def test_a_job_given_back_unstarted_is_a_backoff_saying_why() -> None:
    outcome = Outcome(Ended.UNSTARTED, "claimed ahead, no slot was free within 1s")
    t = decide(outcome, running(attempt=2, handbacks=1))
    assert (t.status, t.journal, t.attempt, t.handbacks) == (JobStatus.QUEUED, "backoff", 1, 1)
    assert t.retry_in_sec == 0
    assert t.detail == {"reason": "claimed ahead, no slot was free within 1s"}
    assert t.duration_ms is KEEP  # it never ran: nothing of an attempt is written


def test_a_job_given_back_unstarted_again_and_again_keeps_its_attempt_and_budget() -> None:
    """Not a hand-back: however often its worker gives it back before it starts, a job on its
    last attempt is queued with that attempt, never lost."""
    outcome = Outcome(Ended.UNSTARTED, "worker shutting down")
    job = running(attempt=1, max_attempts=1, handbacks=MAX_REFUNDED_HANDBACKS)
    t = decide(outcome, job)
    assert (t.status, t.attempt, t.handbacks) == (JobStatus.QUEUED, 0, MAX_REFUNDED_HANDBACKS)
    assert t.clear_start


def test_a_job_given_back_unstarted_with_a_cancel_requested_is_canceled() -> None:
    t = decide(Outcome(Ended.UNSTARTED, "worker shutting down"), running(attempt=1, cancel=True))
    assert (t.status, t.attempt) == (JobStatus.CANCELED, 0)


def test_a_backoff_behind_a_holder_outside_dataloader_waits_the_backoff_delay() -> None:
    outcome = Outcome(Ended.BACKED_OFF, holder="outside dataloader", backoff_sec=30.0)
    t = decide(outcome, running())
    assert t.retry_in_sec == 30.0
    assert t.detail == {"holder": "outside dataloader"}


def test_a_backoff_leaves_result_error_and_duration_alone() -> None:
    t = decide(Outcome(Ended.BACKED_OFF, holder="none"), running())
    assert (t.result, t.error, t.duration_ms) == (KEEP, KEEP, KEEP)


def test_a_backoff_with_a_cancel_requested_is_canceled_with_the_attempt_refunded() -> None:
    outcome = Outcome(Ended.BACKED_OFF, holder="outside dataloader", backoff_sec=30.0)
    t = decide(outcome, running(attempt=1, cancel=True))
    assert t.status is JobStatus.CANCELED
    assert t.attempt == 0
    assert t.clear_start
    assert t.detail == {"holder": "outside dataloader"}


def test_a_backoff_on_the_last_attempt_is_queued_not_lost() -> None:
    t = decide(Outcome(Ended.BACKED_OFF, holder="none"), running(attempt=3, max_attempts=3))
    assert t.status is JobStatus.QUEUED
    assert t.attempt == 2


# --- handed back (shutdown, lost lock or lease) -----------------------------------------------


def handed_back(refund: bool = True, reason: str | None = "worker shutting down") -> Outcome:
    return Outcome(Ended.HANDED_BACK, reason, refund=refund, duration_ms=5)


def test_a_refunded_hand_back_is_queued_with_the_attempt_given_back() -> None:
    t = decide(handed_back(), running(attempt=2, max_attempts=2, handbacks=0))
    assert t.status is JobStatus.QUEUED
    assert t.journal == "requeue"
    assert (t.attempt, t.handbacks) == (1, 1)
    assert t.retry_in_sec == 0
    assert t.detail == {"reason": "worker shutting down", "refunded": True}


def test_a_refunded_hand_back_with_a_rerun_requested_queues_the_newest_version_fresh() -> None:
    t = decide(handed_back(), running(attempt=2, handbacks=1, rerun=True))
    assert (t.status, t.journal, t.attempt, t.handbacks) == (JobStatus.QUEUED, "rerun", 0, 0)
    assert (t.rerun_requested, t.clear_checkpoint) == (False, True)  # no old cursor for new args


def test_hand_backs_are_refunded_up_to_the_bound() -> None:
    t = decide(handed_back(), running(attempt=1, handbacks=MAX_REFUNDED_HANDBACKS - 1))
    assert t.detail["refunded"] is True
    assert t.handbacks == MAX_REFUNDED_HANDBACKS


def test_a_hand_back_beyond_the_bound_consumes_the_attempt() -> None:
    t = decide(handed_back(), running(attempt=1, handbacks=MAX_REFUNDED_HANDBACKS))
    assert t.status is JobStatus.QUEUED
    assert (t.attempt, t.handbacks) == (1, MAX_REFUNDED_HANDBACKS)
    assert t.detail == {"reason": "worker shutting down", "refunded": False}


def test_an_unrefunded_hand_back_with_attempts_left_is_queued() -> None:
    t = decide(handed_back(refund=False), running(attempt=1, max_attempts=3))
    assert t.status is JobStatus.QUEUED
    assert t.attempt == 1
    assert t.error is KEEP


def test_an_unrefunded_hand_back_on_the_last_attempt_is_lost_with_its_reason() -> None:
    t = decide(handed_back(refund=False, reason="lease lost"), running(attempt=3, max_attempts=3))
    assert t.status is JobStatus.LOST
    assert t.finished
    assert t.journal == "lost"
    assert t.error == "lease lost"
    assert t.detail == {"reason": "lease lost", "refunded": False}


def test_a_hand_back_beyond_the_bound_on_the_last_attempt_is_lost() -> None:
    job = running(attempt=3, max_attempts=3, handbacks=MAX_REFUNDED_HANDBACKS)
    assert decide(handed_back(), job).status is JobStatus.LOST


def test_a_hand_back_without_a_reason_says_handed_back() -> None:
    t = decide(handed_back(refund=False, reason=None), running(attempt=1, max_attempts=1))
    assert t.error == "handed back"


def test_a_lost_hand_back_with_a_rerun_requested_reruns() -> None:
    job = running(attempt=3, max_attempts=3, rerun=True)
    t = decide(handed_back(refund=False), job)
    assert t.status is JobStatus.QUEUED
    assert t.journal == "rerun"
    assert (t.attempt, t.handbacks) == (0, 0)
    assert t.detail["ended"] == "lost"


# --- lease expired (reaper) -------------------------------------------------------------------


def test_an_expired_lease_with_attempts_left_is_requeued() -> None:
    t = on_expired(running(attempt=1, max_attempts=2, handbacks=1))
    assert t.status is JobStatus.QUEUED
    assert t.journal == "requeue"
    assert (t.attempt, t.handbacks) == (1, 1)
    assert t.retry_in_sec == 0
    assert t.detail == {"reason": "lease expired"}


def test_an_expired_lease_on_the_last_attempt_is_lost() -> None:
    t = on_expired(running(attempt=2, max_attempts=2))
    assert t.status is JobStatus.LOST
    assert t.journal == "lost"
    assert t.error == "lease expired on the last attempt"
    assert t.detail == {"reason": "lease expired"}


def test_an_expired_lease_with_a_cancel_requested_is_canceled() -> None:
    t = on_expired(running(attempt=1, max_attempts=2, cancel=True))
    assert t.status is JobStatus.CANCELED
    assert t.journal == "canceled"
    assert t.attempt == 1
    assert t.detail == {"reason": "lease expired"}


def test_an_expired_lease_with_a_rerun_requested_reruns() -> None:
    t = on_expired(running(attempt=2, max_attempts=2, handbacks=1, rerun=True))
    assert t.status is JobStatus.QUEUED
    assert t.journal == "rerun"
    assert (t.attempt, t.handbacks) == (0, 0)
    assert t.rerun_requested is False
    assert t.clear_checkpoint
    assert t.error == "lease expired on the last attempt"
    assert t.detail == {"reason": "lease expired", "ended": "lost"}


def test_an_expired_lease_with_cancel_and_rerun_requested_is_canceled() -> None:
    assert on_expired(running(cancel=True, rerun=True)).status is JobStatus.CANCELED


# --- a client's cancel ------------------------------------------------------------------------


def test_cancel_of_a_queued_job_ends_it_at_once() -> None:
    t = on_cancel(JobFacts(JobStatus.QUEUED, 1, 3, handbacks=2))
    assert isinstance(t, Transition)
    assert t.status is JobStatus.CANCELED
    assert t.journal == "canceled"
    assert (t.attempt, t.handbacks) == (1, 2)
    assert t.cancel_requested is True


def test_cancel_of_a_running_job_requests_it() -> None:
    r = on_cancel(running())
    assert r == Request("cancel_requested", cancel=True)


def test_cancel_of_a_running_job_already_asked_does_nothing() -> None:
    assert on_cancel(running(cancel=True)) is None


@pytest.mark.parametrize(
    "status", [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.LOST]
)
def test_cancel_of_a_finished_job_does_nothing(status: JobStatus) -> None:
    assert on_cancel(JobFacts(status, 1, 3)) is None


# --- a client's retry -------------------------------------------------------------------------


@pytest.mark.parametrize("status", [JobStatus.FAILED, JobStatus.LOST, JobStatus.CANCELED])
def test_retry_queues_a_failed_lost_or_canceled_job_with_a_fresh_budget(
    status: JobStatus,
) -> None:
    t = on_retry(JobFacts(status, 3, 3, handbacks=2, cancel_requested=True))
    assert t.status is JobStatus.QUEUED
    assert t.journal == "retried"
    assert (t.attempt, t.handbacks) == (0, 0)
    assert t.retry_in_sec == 0
    assert t.cancel_requested is False
    assert t.detail == {"was": status.value}


def test_retry_keeps_the_error_and_the_checkpoint() -> None:
    t = on_retry(JobFacts(JobStatus.FAILED, 3, 3))
    assert t.error is KEEP
    assert not t.clear_checkpoint


def test_retry_clears_a_rerun_left_requested_by_a_cancel() -> None:
    # the job was canceled while a re-run was pending: the retried run serves it
    t = on_retry(JobFacts(JobStatus.CANCELED, 1, 3, cancel_requested=True, rerun_requested=True))
    assert t.rerun_requested is False


@pytest.mark.parametrize(
    ("status", "why"),
    [
        (JobStatus.SUCCEEDED, "job cannot be retried: it succeeded"),
        (JobStatus.QUEUED, "job cannot be retried: it is queued already"),
        (JobStatus.RUNNING, "job cannot be retried: it is running"),
    ],
)
def test_retry_of_a_succeeded_queued_or_running_job_is_refused(status: JobStatus, why: str) -> None:
    with pytest.raises(NotRetryable, match=rf"^{why}"):
        on_retry(JobFacts(status, 1, 3))


def test_not_retryable_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="cannot be retried"):
        on_retry(JobFacts(JobStatus.QUEUED, 0, 3))


# --- a re-run on update -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "status", [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.LOST]
)
def test_rerun_of_a_finished_job_queues_it_fresh_with_the_new_args(status: JobStatus) -> None:
    job = JobFacts(status, 2, 3, handbacks=1, cancel_requested=True, rerun_requested=True)
    t = on_rerun(job, '{"day": "2024-01-02"}')
    assert isinstance(t, Transition)
    assert t.status is JobStatus.QUEUED
    assert t.journal == "rerun"
    assert (t.attempt, t.handbacks) == (0, 0)
    assert t.cancel_requested is False
    assert t.rerun_requested is False
    assert t.clear_checkpoint
    assert t.args_json == '{"day": "2024-01-02"}'
    assert t.detail == {"was": status.value}


def test_rerun_of_a_running_job_requests_one_more_run() -> None:
    r = on_rerun(running(), '{"v": 2}')
    assert r == Request("rerun_requested", rerun=True, args_json='{"v": 2}')


def test_rerun_of_a_queued_job_updates_its_args() -> None:
    r = on_rerun(JobFacts(JobStatus.QUEUED, 0, 3), '{"v": 2}')
    assert r == Request("updated", args_json='{"v": 2}')
    assert not r.rerun
    assert not r.cancel


# --- stages ------------------------------------------------------------------------------------


def test_a_success_journals_the_stages_it_enqueues() -> None:
    t = decide(Outcome(Ended.SUCCEEDED, stages=("etl.transform", "etl.report")), running())
    assert t.status is JobStatus.SUCCEEDED
    assert t.detail == {"then": ["etl.transform", "etl.report"]}
    assert decide(SUCCESS, running()).detail == {}


def test_a_job_that_ends_failed_or_canceled_names_the_stages_it_stopped_before() -> None:
    last = decide(failure(stages=("etl.transform",)), running(attempt=3, max_attempts=3))
    assert last.status is JobStatus.FAILED
    assert last.detail["stopped_before"] == ["etl.transform"]
    canceled = decide(failure(stages=("etl.transform",)), running(cancel=True))
    assert canceled.status is JobStatus.CANCELED
    assert canceled.detail == {"stopped_before": ["etl.transform"]}


def test_a_failure_that_is_retried_stops_no_chain_yet() -> None:
    t = decide(failure(stages=("etl.transform",)), running(attempt=1, max_attempts=3))
    assert t.status is JobStatus.QUEUED
    assert "stopped_before" not in t.detail


def test_a_success_that_runs_again_for_a_rerun_names_no_stage_it_did_not_enqueue() -> None:
    t = decide(Outcome(Ended.SUCCEEDED, stages=("etl.transform",)), running(rerun=True))
    assert t.journal == "rerun"
    assert t.detail == {"ended": "done"}  # its stages wait for the newest version's success
