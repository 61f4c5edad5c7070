"""The dashboard's live job views: every viewer of every watched job is fed by one reader,
which reads all the watched jobs in one call, and stops once nobody watches."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from dataloader.base import JobStatus
from dataloader.core.models import JobState
from dataloader.dashboard import live
from dataloader.dashboard.live import JobWatch, SystemWatch, event_of, sse

NOW = datetime(2026, 11, 26, tzinfo=UTC)


def state(job_id: uuid.UUID, status: JobStatus = JobStatus.RUNNING, done: int = 0) -> JobState:
    return JobState(
        job_id=job_id, status=status, attempt=1, started_at=NOW, finished_at=None,
        heartbeat_at=NOW, error=None, progress={"done": done, "total": 10}, queue="q",
        task="t", max_attempts=3, cancel_requested=False, created_at=NOW, available_at=NOW,
        lock_key="k", idempotency_key=None, priority=100, result=None, duration_ms=None,
        worker_id="w", checkpoint=None, rerun_requested=False,
    )  # fmt: skip


class Jobs:
    """A client's `get_many` over states a test sets, recording each call."""

    def __init__(self) -> None:
        self.states: dict[uuid.UUID, JobState] = {}
        self.calls: list[set[uuid.UUID]] = []
        self.read = asyncio.Event()

        #: The end signals of each watched job (`Client.ends_of`), one per viewer.
        self.ends: dict[uuid.UUID, list[asyncio.Event]] = {}

    async def get_many(self, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, JobState]:
        self.calls.append(set(job_ids))
        self.read.set()
        return {i: self.states[i] for i in job_ids if i in self.states}

    @contextlib.asynccontextmanager
    async def ends_of(self, job_id: uuid.UUID) -> AsyncIterator[asyncio.Event]:
        ended = asyncio.Event()
        self.ends.setdefault(job_id, []).append(ended)
        try:
            yield ended
        finally:
            self.ends[job_id].remove(ended)
            if not self.ends[job_id]:
                del self.ends[job_id]


async def test_viewers_of_several_jobs_are_fed_by_one_read_of_them_all() -> None:
    jobs = Jobs()
    a, b = uuid.uuid4(), uuid.uuid4()
    jobs.states = {a: state(a), b: state(b)}
    watch = JobWatch(lambda: jobs)  # type: ignore[arg-type,return-value]
    async with watch.watch(a) as first, watch.watch(a) as second, watch.watch(b) as third:
        assert (await first.get()).job_id == a
        assert (await second.get()).job_id == a
        assert (await third.get()).job_id == b
        assert {a, b} in jobs.calls  # one read for every watched job
        assert all(len(call) <= 2 for call in jobs.calls)
        jobs.states[a] = replace(jobs.states[a], progress={"done": 5, "total": 10})
        watch._wake.set()
        assert (await asyncio.wait_for(first.get(), 5)).progress == {"done": 5, "total": 10}
        assert (await asyncio.wait_for(second.get(), 5)).progress["done"] == 5
        assert third.empty()  # b did not change: its viewer hears nothing
    reader = watch._reader
    assert reader is not None
    await asyncio.wait_for(reader, 5)  # nobody watches: the reader stops


async def test_a_jobs_end_heard_is_read_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "READ_EVERY_SEC", 3600)  # no read but those woken
    jobs = Jobs()
    a = uuid.uuid4()
    jobs.states = {a: state(a)}
    watch = JobWatch(lambda: jobs)  # type: ignore[arg-type,return-value]
    async with watch.watch(a) as viewer:
        assert (await asyncio.wait_for(viewer.get(), 5)).status is JobStatus.RUNNING
        jobs.states[a] = replace(jobs.states[a], status=JobStatus.SUCCEEDED)
        jobs.ends[a][0].set()  # the client's LISTEN heard it end
        assert (await asyncio.wait_for(viewer.get(), 5)).status is JobStatus.SUCCEEDED
    assert jobs.ends == {}  # nobody watches: the client stops listening for it


def test_an_event_carries_what_the_page_shows_live() -> None:
    job_id = uuid.uuid4()
    event = event_of(state(job_id, done=3))
    assert event.startswith("event: state\ndata: ")
    assert event.endswith("\n\n")
    assert '"done": 3' in event
    assert '"total": 10' in event
    assert '"status": "running"' in event
    assert '"finished": false' in event


async def test_overview_viewers_share_one_read_and_one_rendering() -> None:
    reads: list[int] = []

    class Status:
        async def status(self) -> str:
            reads.append(1)
            return f"status {len(reads)}"

    rendered: list[str] = []

    def render(status: object) -> str:
        rendered.append(str(status))
        return f"<p>{status}</p>"

    def render_queue(status: object) -> str:
        rendered.append(f"queue {status}")
        return f"<dl>{status}</dl>"

    watch = SystemWatch(lambda: Status())  # type: ignore[arg-type,return-value]
    async with (
        watch.watch("overview", render) as first,
        watch.watch("overview", render) as second,
        watch.watch("queue:q", render_queue) as third,
    ):
        a, b, c = await first.get(), await second.get(), await third.get()
        assert a == b == "<p>status 1</p>"
        assert c == "<dl>status 1</dl>"
        assert reads == [1]  # three viewers of two views, one read, one rendering of each
        assert rendered == ["status 1", "queue status 1"]
    reader = watch._reader
    assert reader is not None
    await asyncio.wait_for(reader, 5)  # nobody watches: the reader stops


def test_an_event_of_several_lines_keeps_each_line() -> None:
    assert sse("system", "<p>a</p>\n<p>b</p>") == (
        "event: system\ndata: <p>a</p>\ndata: <p>b</p>\n\n"
    )
