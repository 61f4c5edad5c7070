"""Invariants of `dataloader.core.transitions` over random jobs and outcomes (hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataloader.base import JobStatus
from dataloader.core.retry import MAX_DELAY_SEC, Fixed, Linear, RetryPolicy
from dataloader.core.transitions import (
    FINAL_STATUSES,
    KEEP,
    NEVER_STARTED,
    RETRYABLE_STATUSES,
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


@st.composite
def running_jobs(draw: st.DrawFn) -> JobFacts:
    """A running job as a claim leaves it: attempt 1 … max_attempts."""
    max_attempts = draw(st.integers(1, 1000))
    return JobFacts(
        JobStatus.RUNNING,
        attempt=draw(st.integers(1, max_attempts)),
        max_attempts=max_attempts,
        handbacks=draw(st.integers(0, 10)),
        cancel_requested=draw(st.booleans()),
        rerun_requested=draw(st.booleans()),
    )


@st.composite
def any_jobs(draw: st.DrawFn) -> JobFacts:
    max_attempts = draw(st.integers(1, 1000))
    return JobFacts(
        draw(st.sampled_from(JobStatus)),
        attempt=draw(st.integers(0, max_attempts)),
        max_attempts=max_attempts,
        handbacks=draw(st.integers(0, 10)),
        cancel_requested=draw(st.booleans()),
        rerun_requested=draw(st.booleans()),
    )


delays = st.floats(0, MAX_DELAY_SEC)
outcomes = st.builds(
    Outcome,
    ended=st.sampled_from(Ended),
    error=st.none() | st.text(max_size=20),
    retryable=st.booleans(),
    retry_after_sec=st.none() | delays,
    refund=st.booleans(),
    holder=st.sampled_from([None, "none", "running job", "outside dataloader"]),
    backoff_sec=delays,
    result=st.none() | st.just('{"ok": true}'),
    duration_ms=st.none() | st.integers(0, 10**9),
)
#: Policies, well-behaved or not: the decision must hold either way.
policies: st.SearchStrategy[RetryPolicy] = st.sampled_from(
    [
        Linear(),
        Fixed(0),
        lambda attempt: math.nan,
        lambda attempt: -1.0,
        lambda attempt: 10.0**400 if attempt > 0 else 1.0,  # an int too big for a float
        lambda attempt: 1 / 0,
    ]
)


def rerun_left(t: Transition, job: JobFacts) -> bool:
    """Whether the job's rerun flag is still set once `t` is applied."""
    return job.rerun_requested if t.rerun_requested is KEEP else t.rerun_requested


def cancel_left(t: Transition, job: JobFacts) -> bool:
    return job.cancel_requested if t.cancel_requested is KEEP else t.cancel_requested


def check_common(t: Transition, job: JobFacts) -> None:
    """What every transition must satisfy."""
    assert 0 <= t.attempt <= job.max_attempts
    assert t.handbacks >= 0
    assert t.finished == (t.status in FINAL_STATUSES)
    assert t.status is not JobStatus.RUNNING  # only a claim starts a job
    assert 0 <= t.retry_in_sec <= MAX_DELAY_SEC
    if t.status is not JobStatus.QUEUED:
        assert t.retry_in_sec == 0
    if t.finished and t.status is not JobStatus.CANCELED:
        assert not rerun_left(t, job)
    if t.status is JobStatus.QUEUED:
        assert not cancel_left(t, job)  # a queued job asked to cancel would run anyway


@given(outcomes, running_jobs(), policies)
def test_every_attempt_outcome_makes_a_legal_transition(
    outcome: Outcome, job: JobFacts, policy: RetryPolicy
) -> None:
    check_common(after_attempt(outcome, job, policy, fallback=Linear()), job)


@given(outcomes, running_jobs(), policies)
def test_an_attempt_is_counted_refunded_as_a_hand_back_or_given_back(
    outcome: Outcome, job: JobFacts, policy: RetryPolicy
) -> None:
    t = after_attempt(outcome, job, policy, fallback=Linear())
    if t.journal == "rerun":  # only a re-run starts a fresh budget
        return
    if outcome.ended in NEVER_STARTED:  # never started: given back, not counted
        assert (t.attempt, t.handbacks) == (job.attempt - 1, job.handbacks)
    else:  # the attempt counts, or its refund counts as a hand-back
        assert t.attempt in (job.attempt, job.attempt - 1)
        assert t.attempt + (t.handbacks - job.handbacks) == job.attempt


@given(outcomes, running_jobs(), policies)
def test_a_cancel_request_ends_every_outcome_but_a_success_canceled(
    outcome: Outcome, job: JobFacts, policy: RetryPolicy
) -> None:
    t = after_attempt(outcome, job, policy, fallback=Linear())
    if job.cancel_requested and outcome.ended is not Ended.SUCCEEDED:
        assert t.status is JobStatus.CANCELED
    if t.status is JobStatus.CANCELED:
        assert job.cancel_requested or outcome.ended is Ended.CANCELED


@given(outcomes, running_jobs(), policies)
def test_a_success_is_never_retried_and_a_failure_never_succeeds(
    outcome: Outcome, job: JobFacts, policy: RetryPolicy
) -> None:
    t = after_attempt(outcome, job, policy, fallback=Linear())
    assert (t.status is JobStatus.SUCCEEDED) == (
        outcome.ended is Ended.SUCCEEDED and not (job.rerun_requested and not job.cancel_requested)
    )


@given(outcomes, running_jobs(), policies)
def test_a_rerun_always_starts_from_a_fresh_budget_and_clears_its_request(
    outcome: Outcome, job: JobFacts, policy: RetryPolicy
) -> None:
    t = after_attempt(outcome, job, policy, fallback=Linear())
    if t.journal == "rerun":
        assert job.rerun_requested
        assert (t.status, t.attempt, t.handbacks) == (JobStatus.QUEUED, 0, 0)
        assert t.rerun_requested is False
        assert t.clear_checkpoint
        # at once, unless its lock_key is held outside dataloader (a backoff keeps that wait)
        assert t.retry_in_sec == 0 or outcome.ended is Ended.BACKED_OFF


@given(running_jobs())
def test_every_expiry_makes_a_legal_transition(job: JobFacts) -> None:
    t = on_expired(job)
    check_common(t, job)
    assert t.status in {JobStatus.QUEUED, JobStatus.LOST, JobStatus.CANCELED}


@given(any_jobs())
def test_a_cancel_ends_only_queued_jobs_and_asks_only_running_ones(job: JobFacts) -> None:
    decision = on_cancel(job)
    if isinstance(decision, Transition):
        assert job.status is JobStatus.QUEUED
        assert decision.status is JobStatus.CANCELED
        assert decision.attempt == job.attempt
    elif isinstance(decision, Request):
        assert job.status is JobStatus.RUNNING
        assert not job.cancel_requested
        assert decision.cancel
    else:
        assert job.status in FINAL_STATUSES or job.cancel_requested


@given(any_jobs())
def test_a_retry_is_a_fresh_queued_job_or_refused(job: JobFacts) -> None:
    if job.status not in RETRYABLE_STATUSES:
        with pytest.raises(NotRetryable, match=r"^job cannot be retried: "):
            on_retry(job)
        return
    t = on_retry(job)
    check_common(t, job)
    assert (t.status, t.attempt, t.handbacks) == (JobStatus.QUEUED, 0, 0)
    assert not rerun_left(t, job)


@given(any_jobs())
def test_a_rerun_queues_a_finished_job_and_always_carries_the_new_args(job: JobFacts) -> None:
    decision = on_rerun(job, '{"v": 2}')
    assert decision.args_json == '{"v": 2}'
    if isinstance(decision, Transition):
        check_common(decision, job)
        assert job.status in FINAL_STATUSES
        assert (decision.status, decision.attempt) == (JobStatus.QUEUED, 0)
        assert not rerun_left(decision, job)
    else:
        assert decision.rerun == (job.status is JobStatus.RUNNING)
        assert not decision.cancel
