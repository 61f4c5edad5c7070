"""State shared by the worker components of one process."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dataloader.core.models import NewJob
from dataloader.logger.summary import Summary
from dataloader.storage.protocol import ClaimedJob, WorkerProtocol
from dataloader.tasks import TaskRegistry
from dataloader.workers.fencing import PresenceFence, beat_period_for
from dataloader.workers.job_context import RunState
from dataloader.workers.locks import LockHolder
from dataloader.workers.threaded import task_threads

if TYPE_CHECKING:
    from dataloader.config import Settings
    from dataloader.context import AppContext


def new_worker_id() -> str:
    """host-pid-random: unique per process start, readable in the journal."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(eq=False)
class RunningJob:
    """A job this process is executing."""

    job: ClaimedJob
    state: RunState = field(default_factory=RunState)
    #: It holds its lock_key's advisory lock (released as its outcome is written).
    locked: bool = False

    def __post_init__(self) -> None:
        # a cancel requested between the claim and now is already in the claimed row
        self.state.cancel_requested = self.job.cancel_requested

    task: asyncio.Task[object] | None = None
    #: Stops the run when the job has no task of its own: a batch's jobs share their
    #: handler's (see `workers.batches`).
    on_stop: Callable[[], None] | None = None
    handback: bool = False
    #: The run is over and its outcome queued for writing (the lease is still kept alive).
    finished: bool = False
    #: The heartbeat found the job no longer ours (reaped): nothing of ours may be written.
    gone: bool = False
    last_journaled: float = float("-inf")  # the first heartbeat of a run is journaled
    #: When (monotonic) the lease was last extended: the claim, then each heartbeat.
    lease_extended_at: float = field(default_factory=time.monotonic)
    #: The jobs its success enqueues, in the transaction of the success (`workers.stages`).
    stages: tuple[NewJob, ...] = ()

    def attach(self, task: asyncio.Task[object]) -> None:
        """The pipeline's task; stopped at once if the job was lost or handed back already."""
        self.task = task
        if self.state.lost_reason is not None or self.handback:
            task.cancel()

    def request_cancel(self) -> None:
        """Cooperative: the pipeline sees it at its next check."""
        self.state.cancel_requested = True

    def lose(self, reason: str) -> None:
        """The job is no longer ours: stop the pipeline now (once: a second cancel would cut
        short the pipeline's own clean-up of the first)."""
        if self.state.lost_reason is not None or self.finished:
            return
        self.state.lost_reason = reason
        self._stop()

    def hand_back(self) -> None:
        """Shutdown: stop the pipeline and return the job to the queue."""
        if self.finished:
            return
        self.handback = True
        self._stop()

    def _stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        elif self.on_stop is not None:
            self.on_stop()


@dataclass(eq=False)
class WorkerRuntime:
    """What the queue workers, heartbeat and reaper of one process share."""

    settings: Settings
    app: AppContext
    protocol: WorkerProtocol
    locks: LockHolder
    registry: TaskRegistry
    worker_id: str
    #: What the process's jobs ended as, per queue, logged every DL_LOG_SUMMARY_SEC.
    summary: Summary
    #: Attempts ended since the last presence refresh wrote them (`dl_queue_throughput`),
    #: by (queue, journal kind).
    ended: Counter[tuple[str, str]] = field(default_factory=Counter)
    running: dict[uuid.UUID, RunningJob] = field(default_factory=dict)
    #: Set when a job starts whose lease needs beats more often than `beat_period`.
    job_started: asyncio.Event = field(default_factory=asyncio.Event)
    #: The period of the heartbeat's current sleep (a job whose lease needs a shorter one
    #: wakes it; the others, most jobs, need not: a wake-up per job costs the worker's loop).
    beat_period: float = float("inf")
    #: Until when the process's presence vouches for its jobs (kept by `workers.presence`,
    #: enforced by the heartbeat).
    presence: PresenceFence = field(init=False)
    #: The threads the process's plain `def` handlers run in (`workers.threaded`).
    threads: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.presence = PresenceFence(self.settings.presence_period_sec)
        self.threads = task_threads(self.settings.task_threads)

    def wakes_heartbeat(self, jobs: Iterable[ClaimedJob]) -> bool:
        """Whether starting `jobs` must wake the heartbeat: a lease that needs sooner beats
        than its current sleep, or a presence that lapsed already (they are stopped at once)."""
        return self.presence.lapsed() or any(
            beat_period_for(job.lease_ttl_sec) < self.beat_period for job in jobs
        )

    def lose_all(self, reason: str) -> None:
        """Every lock is gone (lock connection lost): stop every running pipeline that needs
        one (a lock_free job runs on)."""
        for running in list(self.running.values()):
            if running.job.lock_hash is not None:
                running.lose(reason)
