"""The completer releases a flush's advisory locks while it writes their outcomes: the write
does not wait for the lock connection's round trip (nor the unlock for the write)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from types import SimpleNamespace
from typing import Any

from dataloader.core.transitions import Ended, Outcome
from dataloader.storage.protocol import ClaimedJob
from dataloader.storage.transitions import Applied
from dataloader.workers.completer import Completer
from dataloader.workers.runtime import RunningJob


def _job(lock_hash: int) -> ClaimedJob:
    return ClaimedJob(
        job_id=uuid.uuid4(),
        queue="q",
        task="t",
        args={},
        lock_key=f"key-{lock_hash}",
        lock_hash=lock_hash,
        partition_key="",
        priority=0,
        attempt=1,
        max_attempts=3,
        lease_ttl_sec=60,
        cancel_requested=False,
        claim_seq=1,
        claim_token=uuid.uuid4(),
    )


class _Locks:
    """An unlock whose answer comes only once the outcomes' write has been sent."""

    def __init__(self, write_sent: asyncio.Event) -> None:
        self.write_sent = write_sent
        self.unlocked: list[int] = []

    async def unlock(self, lock_hashes: Any) -> None:
        hashes = list(lock_hashes)
        await self.write_sent.wait()
        self.unlocked += hashes


class _Protocol:
    """A write whose answer comes only once the locks' release has been sent."""

    def __init__(self, write_sent: asyncio.Event, locks: _Locks) -> None:
        self.write_sent = write_sent
        self.locks = locks
        self.unlocked_when_written: list[int] | None = None

    async def finish(self, outcomes: Any, worker_id: str, **_: Any) -> dict[uuid.UUID, Applied]:
        self.write_sent.set()
        await asyncio.sleep(0)  # the unlock's answer lands meanwhile
        self.unlocked_when_written = list(self.locks.unlocked)
        return {job.job_id: Applied("written") for job, _, _ in outcomes}

    def handed_job(self, applied: Applied) -> None:
        return None


async def test_a_flush_writes_its_outcomes_while_their_locks_are_released() -> None:
    write_sent = asyncio.Event()
    locks = _Locks(write_sent)
    protocol = _Protocol(write_sent, locks)
    runtime: Any = SimpleNamespace(
        settings=SimpleNamespace(retry_base_sec=1.0),
        locks=locks,
        protocol=protocol,
        registry={},
        worker_id="w",
        summary=SimpleNamespace(count=lambda *_: None),
        ended=Counter(),
        running={},
    )
    completer = Completer(runtime, on_written=lambda queue: None)
    jobs = [RunningJob(_job(h), locked=True) for h in (11, 12)]
    for running in jobs:
        runtime.running[running.job.job_id] = running
        completer.enqueue(running, Outcome(Ended.SUCCEEDED, duration_ms=1))

    # done at all only if the unlock and the write are in flight together: one after the
    # other, each would wait for the other for ever
    await asyncio.wait_for(completer.wait_flushed(), timeout=10)

    assert sorted(locks.unlocked) == [11, 12]
    assert protocol.unlocked_when_written == [11, 12]
    assert runtime.running == {}  # both written
