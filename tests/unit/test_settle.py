"""`settle`: read facts, decide, write fenced, decide again what changed, in bounded rounds."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import replace

from dataloader.base import JobStatus
from dataloader.core.transitions import JobFacts, Transition, on_cancel, on_expired
from dataloader.storage.transitions import Applied, Fence, settle

RUNNING = JobFacts(JobStatus.RUNNING, attempt=1, max_attempts=3)
CANCEL_ASKED = replace(RUNNING, cancel_requested=True)


class FakeRows:
    """Rows that answer each write with a scripted state per job, one script entry a round."""

    def __init__(self, script: dict[uuid.UUID, list[Applied | None]]) -> None:
        self.script = script
        self.rounds: list[list[tuple[Fence, Transition]]] = []

    async def write(self, items: list[tuple[Fence, Transition]]) -> Mapping[uuid.UUID, Applied]:
        self.rounds.append(items)
        answer = {}
        for fence, _ in items:
            found = self.script[fence.job_id].pop(0)
            if found is not None:
                answer[fence.job_id] = found
        return answer


def fence() -> Fence:
    return Fence(uuid.uuid4(), RUNNING, uuid.uuid4(), expired=True)


async def test_each_row_ends_written_gone_busy_or_changing() -> None:
    written, gone, busy, changing = fence(), fence(), fence(), fence()
    rows = FakeRows(
        {
            written.job_id: [Applied("written")],
            gone.job_id: [None],
            busy.job_id: [Applied("busy")],
            changing.job_id: [Applied("changed", facts=CANCEL_ASKED)] * 2,
        }
    )
    settled = await settle(
        [written, gone, busy, changing],
        lambda f: on_expired(f.facts),
        rows.write,
        rounds=2,
    )
    assert settled.written[written.job_id].decision == on_expired(RUNNING)
    assert settled.written[written.job_id].fence == written
    assert settled.gone == [gone.job_id]
    assert settled.busy == {busy.job_id: busy}
    assert settled.changing == {changing.job_id: replace(changing, facts=CANCEL_ASKED)}
    # the second round decided only the changed row again, on its facts now
    assert [[(f.job_id, t) for f, t in r] for r in rows.rounds[1:]] == [
        [(changing.job_id, on_expired(CANCEL_ASKED))]
    ]


async def test_a_changed_row_is_written_as_decided_on_its_facts_now() -> None:
    f = fence()
    rows = FakeRows({f.job_id: [Applied("changed", facts=CANCEL_ASKED), Applied("written")]})
    settled = await settle([f], lambda x: on_expired(x.facts), rows.write, rounds=3)
    assert settled.written[f.job_id].decision.journal == on_expired(CANCEL_ASKED).journal
    assert settled.written[f.job_id].fence.facts == CANCEL_ASKED
    assert len(rows.rounds) == 2


async def test_with_a_reread_every_row_not_written_is_read_again() -> None:
    # a client's cancel of a queued job that a claim took, and handed back, meanwhile
    f = Fence(uuid.uuid4(), JobFacts(JobStatus.QUEUED, attempt=0, max_attempts=3))
    queued = JobFacts(JobStatus.QUEUED, attempt=0, max_attempts=3, handbacks=1)
    rows = FakeRows({f.job_id: [None, Applied("written")]})
    reads: list[list[uuid.UUID]] = []

    async def reread(job_ids: list[uuid.UUID]) -> dict[uuid.UUID, JobFacts]:
        reads.append(job_ids)
        return {f.job_id: queued}

    def rule(x: Fence) -> Transition | None:
        decided = on_cancel(x.facts)
        return decided if isinstance(decided, Transition) else None

    settled = await settle([f], rule, rows.write, rounds=5, reread=reread)
    assert reads == [[f.job_id]]
    assert settled.written[f.job_id].fence.facts == queued


async def test_a_reread_that_finds_no_row_says_gone_and_a_rule_may_decide_nothing() -> None:
    f, g = fence(), fence()
    rows = FakeRows({f.job_id: [Applied("busy")]})

    async def reread(job_ids: list[uuid.UUID]) -> dict[uuid.UUID, JobFacts]:
        return {}

    settled = await settle(
        [f, g],
        lambda x: None if x.job_id == g.job_id else on_expired(x.facts),
        rows.write,
        rounds=5,
        reread=reread,
    )
    assert settled.gone == [f.job_id]
    assert settled.undecided == {g.job_id: g}
    assert not settled.written
