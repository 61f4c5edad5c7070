"""SET_JOB_STATES's parameters: what jobs of a batch share is sent once."""

from __future__ import annotations

import uuid

from dataloader.base import JobStatus
from dataloader.core.retry import Linear
from dataloader.core.transitions import Ended, JobFacts, Outcome, Transition, after_attempt
from dataloader.storage import queries
from dataloader.storage.transitions import SHAPE_COLUMNS, Fence, parameters_of

FACTS = JobFacts(JobStatus.RUNNING, attempt=1, max_attempts=3)


def fenced(outcome: Outcome) -> tuple[Fence, Transition]:
    return Fence(uuid.uuid4(), FACTS, uuid.uuid4()), after_attempt(outcome, FACTS, Linear(5))


def test_jobs_of_one_shape_share_it_and_keep_their_own_values() -> None:
    items = [
        fenced(Outcome(Ended.SUCCEEDED, result="1", duration_ms=10)),
        fenced(Outcome(Ended.FAILED, "boom", duration_ms=20)),
        fenced(Outcome(Ended.SUCCEEDED, result=None, duration_ms=30)),
    ]
    params = parameters_of(items)
    assert params["kinds"] == [1, 2, 1]
    assert params["job_ids"] == [fence.job_id for fence, _ in items]
    assert params["expect_tokens"] == [fence.claim_token for fence, _ in items]
    assert (params["results"], params["durations"]) == (["1", None, None], [10, 20, 30])
    assert params["status"] == ["succeeded", "queued"]
    assert params["error"] == [None, "boom"]
    assert params["retry_in"] == [None, 5.0]
    assert all(len(params[column]) == 2 for column in SHAPE_COLUMNS)


def test_the_parameters_are_the_statements() -> None:
    params = parameters_of([fenced(Outcome(Ended.SUCCEEDED))])
    extra = {"actor_role", "actor"}
    assert set(params) | extra == set(queries.SET_JOB_STATES.names)
    # the statement that also wakes and hands off takes the same, and what those parts need
    extra |= {"wakes_own_queue", "hand_off", "claim_seed"}
    assert set(params) | extra == set(queries.FINISH_JOBS.names)
