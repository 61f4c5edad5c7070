"""Advisory locks on one lock-holding connection per process.

The spec locks `pg_try_advisory_lock(hashtext(lock_key))` for a job's whole run. Session-level
advisory locks are re-entrant, so two jobs of one process with the same hash would both "get"
it: the holder tracks held hashes in-process and reports such a job busy. If the connection is
lost, every lock it held is gone: `on_lost` is called so the jobs can be stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Concatenate, ParamSpec, TypeVar

from dataloader.storage import repositories
from dataloader.storage.db import CONNECTION_ERRORS, AnyConnection, Connection, connect
from dataloader.workers.waiting import wait_any

log = logging.getLogger(__name__)

#: Longest wait for the lock connection's answer before it counts as lost.
OPERATION_TIMEOUT_SEC = 10.0

P = ParamSpec("P")
R = TypeVar("R")


class LockConnectionLost(Exception):
    """The lock-holding connection is gone (and with it every lock it held)."""


class LockHolder:
    """Holds the advisory locks of this process's running jobs."""

    def __init__(self, dsn: str, on_lost: Callable[[str], None]) -> None:
        self._dsn = dsn
        self._on_lost = on_lost
        self._conn: Connection | None = None
        self._mutex = asyncio.Lock()  # one statement at a time on the connection
        self._held: set[int] = set()
        self.ready = asyncio.Event()
        self._lost = asyncio.Event()

    def holds(self, lock_hash: int) -> bool:
        """Whether this process holds (or is acquiring) `lock_hash`."""
        return lock_hash in self._held

    @property
    def backend_pid(self) -> int | None:
        """Server pid of the lock connection (for operators and tests)."""
        return None if self._conn is None else self._conn.get_server_pid()

    async def connect(self) -> None:
        """Open the connection; raises on failure."""
        conn = await connect(self._dsn, "dataloader-locks")
        conn.add_termination_listener(self._terminated)
        self._conn = conn
        self._lost.clear()
        self.ready.set()

    async def close(self) -> None:
        """Close the connection: the server releases whatever it still held."""
        self.ready.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.remove_termination_listener(self._terminated)
            await conn.close(timeout=5)
        self._held.clear()

    async def try_lock(self, lock_hashes: Iterable[int]) -> set[int]:
        """Lock what can be locked; returns the hashes now held for the caller. A hash already
        held in this process, or listed twice, is busy."""
        wanted: list[int] = []
        for lock_hash in lock_hashes:
            if lock_hash not in self._held and lock_hash not in wanted:
                wanted.append(lock_hash)
        if not wanted:
            return set()
        self._held.update(wanted)  # reserve before the await: a concurrent caller sees them busy
        try:
            result = await self._run(repositories.try_advisory_locks, wanted)
        except BaseException:
            self._held.difference_update(wanted)
            raise
        got = {h for h, locked in result.items() if locked}
        self._held.difference_update(set(wanted) - got)
        return got

    async def unlock(self, lock_hashes: Iterable[int]) -> None:
        """Release hashes held by this process, in one round trip. A lost connection already
        released them."""
        held = [h for h in set(lock_hashes) if h in self._held]
        if not held:
            return
        self._held.difference_update(held)
        with contextlib.suppress(LockConnectionLost):
            await self._run(repositories.advisory_unlock, held)

    async def ping(self) -> None:
        """Check the connection end to end; a failure counts as losing it."""
        await self._run(repositories.ping)

    async def maintain(self, stopping: asyncio.Event) -> None:
        """Keep the connection open: reconnect with backoff after a loss, until `stopping`."""
        delay = 0.1
        while not stopping.is_set():
            if self.ready.is_set():
                await wait_any(self._lost, stopping)
                continue
            try:
                await self.connect()
                delay = 0.1
                log.info("lock connection open")
            except Exception as exc:  # never give up; back off instead
                log.warning("lock connection failed, retrying in %.1fs: %r", delay, exc)
                await wait_any(stopping, timeout=delay)
                delay = min(delay * 2, 5.0)

    async def _run(
        self,
        op: Callable[Concatenate[Connection, P], Awaitable[R]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        async with self._mutex:
            conn = self._conn
            if conn is None:
                raise LockConnectionLost("lock connection is not open")
            if conn.is_closed():
                self._lose("lock connection closed")
                raise LockConnectionLost("lock connection closed")
            try:
                return await asyncio.wait_for(op(conn, *args, **kwargs), OPERATION_TIMEOUT_SEC)
            except TimeoutError as exc:
                # a half-open socket: nothing comes back, and nothing says it is gone
                self._lose(f"lock connection did not answer within {OPERATION_TIMEOUT_SEC}s")
                raise LockConnectionLost("lock connection timed out") from exc
            except CONNECTION_ERRORS as exc:
                self._lose(f"lock connection failed: {exc!r}")
                raise LockConnectionLost(str(exc)) from exc

    def _terminated(self, conn: AnyConnection) -> None:
        if conn is self._conn:
            self._lose("lock connection closed by the server")

    def _lose(self, reason: str) -> None:
        if self._conn is None:
            return
        log.error("advisory locks lost: %s", reason)
        conn, self._conn = self._conn, None
        self.ready.clear()
        self._held.clear()
        self._lost.set()
        conn.terminate()
        self._on_lost(reason)
