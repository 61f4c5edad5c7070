"""Limits of a queue across replicas: jobs running at once (in the queue, per partition_key) and
jobs started per second. Each test runs two services (two sets of workers, claiming apart)
and keeps a ledger of when each job ran; the ledger shows the limit held, and was reached."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from dataloader.config import Settings
from dataloader.core.queues import QueueLimits
from dataloader.runner import Runner
from dataloader.storage.protocol import WorkerProtocol
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext

from .conftest import Service, StartService
from .v1_api.test_security import ADMIN, TOKENS, TRIGGER, bearer


class Ledger:
    """When each job's handler started and ended (this process's clock), by partition_key."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float]] = []

    def most_at_once(self, partition: str | None = None) -> int:
        """The most handlers running at the same moment (of one partition_key if given)."""
        edges = sorted(
            edge
            for key, start, end in self.spans
            if partition is None or key == partition
            for edge in ((start, 1), (end, -1))
        )
        running = most = 0
        for _, change in edges:
            running += change
            most = max(most, running)
        return most

    def starts(self) -> list[float]:
        return sorted(start for _, start, _ in self.spans)


def ledgered(registry: TaskRegistry, name: str, ledger: Ledger, hold_sec: float) -> None:
    @registry.task(name, queue="limited")
    async def run(ctx: JobContext[dict[str, Any]]) -> None:
        start = time.monotonic()
        await asyncio.sleep(hold_sec)
        ledger.spans.append((ctx.job.partition_key, start, time.monotonic()))


async def two_replicas(start_service: StartService) -> list[Service]:
    return [await start_service(workers=[{"queue": "limited", "concurrency": 8}]) for _ in range(2)]


async def run_all(service: Service, jobs: int, partitions: int = 1) -> None:
    batch = [
        service.dl.job(
            "t.ledgered",
            queue="limited",
            lock_key=f"k{i}",
            partition_key=f"p{i % partitions}",
        )
        for i in range(jobs)
    ]
    results = await service.dl.enqueue_many(batch)
    for result in results:
        assert (await service.dl.wait(result.job_id, timeout=120)).status == "succeeded"


async def test_running_jobs_of_a_queue_stay_within_its_limit_across_replicas(
    start_service: StartService, registry: TaskRegistry
) -> None:
    ledger = Ledger()
    ledgered(registry, "t.ledgered", ledger, hold_sec=0.02)
    first, _ = await two_replicas(start_service)
    await first.dl.set_limits("limited", max_running=3)
    await run_all(first, 80)
    assert ledger.most_at_once() == 3  # never more, and reached: 16 slots wanted more


async def test_each_partition_key_stays_within_its_limit(
    start_service: StartService, registry: TaskRegistry
) -> None:
    ledger = Ledger()
    ledgered(registry, "t.ledgered", ledger, hold_sec=0.02)
    first, _ = await two_replicas(start_service)
    await first.dl.set_limits("limited", max_running_per_partition=1)
    await run_all(first, 60, partitions=4)
    assert [ledger.most_at_once(f"p{i}") for i in range(4)] == [1, 1, 1, 1]
    assert ledger.most_at_once() > 1  # partitions ran side by side


async def test_starts_per_second_stay_within_the_rate(
    start_service: StartService, registry: TaskRegistry
) -> None:
    """A bucket of one second's worth (20 jobs), refilled at 20 per second: the n-th start
    comes at least (n - 20) / 20 seconds after the first."""
    ledger = Ledger()
    ledgered(registry, "t.ledgered", ledger, hold_sec=0)
    first, _ = await two_replicas(start_service)
    rate = 20
    await first.dl.set_limits("limited", max_per_second=rate)
    await run_all(first, 60)
    starts = ledger.starts()
    # the bucket runs on the database's clock: a handler starts a little after its claim, the
    # first one later than the others (its statements planned for the first time); 60 starts
    # without a limit take well under the 1.6 s this still demands
    tolerance = 0.4
    for n, start in enumerate(starts, start=1):
        assert start - starts[0] >= (n - rate) / rate - tolerance, n


async def test_limits_are_set_audited_shown_and_removed(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False, api_tokens=json.dumps(TOKENS))
    body = {"max_running": 10, "max_running_per_partition": 2, "max_per_second": 2.5}
    url = "/api/v1/queues/etl/limits"
    assert (await service.client.put(url, json=body, headers=bearer(TRIGGER))).status_code == 403
    answer = await service.client.put(url, json=body, headers=bearer(ADMIN))
    assert answer.status_code == 200
    assert (answer.json()["limits"], answer.json()["changed_by"]) == (body, "token:ops")
    shown = (await service.client.get("/api/v1/queues/etl", headers=bearer(ADMIN))).json()
    assert shown["limits"] == body
    assert (await service.dl.stats())["etl"].limits == QueueLimits(10, 2, 2.5)

    await service.client.put(url, json=body, headers=bearer(ADMIN))  # no change: not audited
    cleared = await service.client.put(url, json={}, headers=bearer(ADMIN))
    assert cleared.json()["limits"] == dict.fromkeys(body)
    log = await service.dl.queue_events("etl")
    assert [(e.kind, e.actor) for e in log] == [("limits", "token:ops"), ("limits", "token:ops")]
    assert log[0].payload == body


@pytest.mark.parametrize(
    "body",
    [
        {"max_running": 0},
        {"max_running": 1.5},
        {"max_running_per_partition": -1},
        {"max_per_second": 0},
        {"max_per_second": "fast"},
        {"max_running": 2**31},
        {"speed": 3},
    ],
)
async def test_bad_limits_are_refused_and_write_nothing(
    start_service: StartService, conn: asyncpg.Connection, body: dict[str, Any]
) -> None:
    service = await start_service(run_workers=False)
    response = await service.client.put("/api/v1/queues/etl/limits", json=body)
    assert response.status_code == 422, response.text
    assert await conn.fetchval("SELECT count(*) FROM dl_queues") == 0


async def test_the_library_refuses_bad_limits() -> None:
    for bad in ({"max_running": 0}, {"max_per_second": float("nan")}, {"max_running": True}):
        with pytest.raises(ValueError, match="must be"):
            QueueLimits(**bad)


async def test_a_queue_whose_limits_are_removed_is_claimed_freely_again(
    start_service: StartService, registry: TaskRegistry
) -> None:
    ledger = Ledger()
    ledgered(registry, "t.ledgered", ledger, hold_sec=0.05)
    service = await start_service(workers=[{"queue": "limited", "concurrency": 6}])
    await service.dl.set_limits("limited", max_running=1)
    await run_all(service, 4)
    assert ledger.most_at_once() == 1
    await service.dl.set_limits("limited")
    ledger.spans.clear()
    await run_all(service, 24)
    assert ledger.most_at_once() > 1


# --- claims made by hand, on a service without workers: each round seen as it happens ---------


async def hand_claims(
    start_service: StartService, partitions: list[str], **limits: Any
) -> WorkerProtocol:
    """A queue with `limits` holding a job of each of `partitions`, enqueued in that order, on
    a service without workers; the protocol to claim them by hand."""
    service = await start_service(run_workers=False)
    for i, partition in enumerate(partitions):
        await service.dl.enqueue(
            "demo.noop", queue="limited", lock_key=f"k{i}", partition_key=partition
        )
    await service.dl.set_limits("limited", **limits)
    return WorkerProtocol(service.context.pool)


async def test_a_limit_on_running_jobs_alone_claims_up_to_it_in_one_round(
    start_service: StartService,
) -> None:
    """Without a rate there is no token bucket to spend: a round claims all the room it has."""
    protocol = await hand_claims(start_service, [""] * 10, max_running=6)
    first = await protocol.claim_round("limited", 8, "hand", walk=8)
    assert len(first.jobs) == 6
    assert first.held == 2  # two more could run but for the limit
    second = await protocol.claim_round("limited", 8, "hand", walk=8)
    assert (second.jobs, second.held) == ([], 4)


async def test_a_full_partition_key_does_not_hide_the_jobs_of_others_behind_it(
    start_service: StartService,
) -> None:
    protocol = await hand_claims(start_service, ["a"] * 10 + ["b"] * 3, max_running_per_partition=1)
    first = await protocol.claim_round("limited", 4, "hand", walk=4)
    assert [job.partition_key for job in first.jobs] == ["a"]
    # a's jobs fill the next walk no more: b's first job is reached
    second = await protocol.claim_round("limited", 4, "hand", walk=4)
    assert [job.partition_key for job in second.jobs] == ["b"]


async def test_workers_held_back_by_a_limit_wait_for_room_instead_of_claiming_again(
    start_service: StartService, registry: TaskRegistry
) -> None:
    """Rounds that claim nothing because the limit is reached are not repeated at once: the
    worker waits until a job leaves `running` (a notification, from any replica). A backlog
    longer than a claim's walk: the claim cannot tell the queue is empty."""
    ledger = Ledger()
    ledgered(registry, "t.ledgered", ledger, hold_sec=0.05)
    first, second = await two_replicas(start_service)
    await first.dl.set_limits("limited", max_running=1)
    rounds_before = sum(s.manager.queues["limited"].claims_started for s in (first, second))
    await run_all(first, 40)
    rounds = (
        sum(s.manager.queues["limited"].claims_started for s in (first, second)) - rounds_before
    )
    assert ledger.most_at_once() == 1
    # each of the 40 ends wakes both replicas for a round or two; rounds repeated at once as
    # long as the limit held made thousands
    assert rounds < 400, rounds


#: A queue's own slots, and slots it shares with another queue.
SLOTS = {
    "own": {"queue": "limited", "concurrency": 8},
    "shared": {"queues": ["limited", "other"], "concurrency": 8},
}


@pytest.mark.parametrize("slots", SLOTS.values(), ids=SLOTS.keys())
@pytest.mark.parametrize(
    ("limits", "jobs"),
    [
        ({"max_running": 2}, 30),
        ({"max_running": 2, "max_per_second": 100}, 30),
        ({"max_running_per_partition": 1}, 30),
        # one start a second: the bucket holds one job, the 4 others wait their turn
        ({"max_per_second": 1}, 5),
    ],
    ids=["running", "running-and-rate", "per-partition", "rate"],
)
async def test_run_until_empty_waits_for_the_jobs_a_limit_holds_back(
    make_settings: Callable[..., Settings],
    registry: TaskRegistry,
    limits: dict[str, Any],
    jobs: int,
    slots: dict[str, Any],
) -> None:
    """A round that claims nothing because the limit is reached is not an empty queue."""
    ledger = Ledger()
    ledgered(registry, "t.ledgered", ledger, hold_sec=0.01)
    settings = make_settings(workers=[slots])
    async with Runner(settings, registry) as dl:
        await dl.client.set_limits("limited", **limits)
        await dl.client.enqueue_many(
            [
                dl.client.job("t.ledgered", lock_key=f"k{i}", partition_key=f"p{i % 3}")
                for i in range(jobs)
            ]
        )
        await dl.run_until_empty()
        stats = (await dl.client.stats("limited"))["limited"]
    assert len(ledger.spans) == jobs
    assert (stats.ready, stats.running) == (0, 0)


async def test_jobs_without_a_partition_key_are_held_by_no_partition_limit(
    start_service: StartService,
) -> None:
    protocol = await hand_claims(start_service, [""] * 5 + ["a"] * 3, max_running_per_partition=1)
    claimed = await protocol.claim_round("limited", 8, "hand", walk=8)
    assert sorted(job.partition_key for job in claimed.jobs) == [""] * 5 + ["a"]
