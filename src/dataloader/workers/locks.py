"""Advisory locks on one lock-holding connection per process.

The spec locks `pg_try_advisory_lock(hashtext(lock_key))` for a job's whole run. Session-level
advisory locks are re-entrant, so two jobs of one process with the same hash would both "get"
it: the holder tracks held hashes in-process and reports such a job busy. A hash stays reserved
in-process until its job unlocks it, even after the connection that locked it was lost: the
job's pipeline may still be winding down, and no other job of this process may take its key
meanwhile. Each reservation remembers which connection locked it, so an unlock reaches the
server only for locks of the live connection (a later connection never held the old ones).

A statement that fails part way (a server error: out of shared memory, a role's
statement_timeout) leaves the session-level locks it already took: they survive the rollback.
They are released at once, every level of them (they are re-entrant), and the connection is
given up if even that fails; a periodic audit also releases any lock the session holds that no
job of this process reserved. So no lock outlives its job on the server.

If the connection is lost, every lock it held is gone: `on_lost` is called so the jobs can be
stopped. A connection given up on while its server session may live on (no answer in time: a
half-open socket) has that session ended by the next connection, so that its locks cannot
outlive it on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Concatenate, ParamSpec, TypeVar

from dataloader.storage import connections, protocol
from dataloader.storage.db import (
    CONNECTION_ERRORS,
    DEFAULT_TIMEOUT_SEC,
    AnyConnection,
    Connection,
    connect,
)
from dataloader.workers.waiting import wait_any

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


class LockConnectionLost(Exception):
    """The lock-holding connection is gone (and with it every lock it held)."""


class LockHolder:
    """Holds the advisory locks of this process's running jobs."""

    def __init__(
        self, dsn: str, on_lost: Callable[[str], None], timeout: float = DEFAULT_TIMEOUT_SEC
    ) -> None:
        self._dsn = dsn
        self._on_lost = on_lost
        self._timeout = timeout  # for each answer; beyond it the connection counts as lost
        self._conn: Connection | None = None
        #: Sessions of lost connections that may still hold locks on the server.
        self._abandoned = connections.AbandonedSessions("lock")
        self._session: tuple[int, datetime] | None = None
        self._mutex = asyncio.Lock()  # one statement at a time on the connection
        #: Reserved hashes → the connection generation that locked them.
        self._held: dict[int, int] = {}
        #: Hashes released by this process whose unlock statement has not run yet.
        self._unlocking: Counter[int] = Counter()
        self._generation = 0
        self.ready = asyncio.Event()
        self._lost = asyncio.Event()

    def holds(self, lock_hash: int) -> bool:
        """Whether this process holds (or is acquiring) `lock_hash` on its live connection."""
        return self._conn is not None and self._held.get(lock_hash) == self._generation

    def covers(self, lock_hash: int | None) -> bool:
        """Whether a job of `lock_hash` may run: it needs no lock (None), or its lock is held."""
        return lock_hash is None or self.holds(lock_hash)

    @property
    def backend_pid(self) -> int | None:
        """Server pid of the lock connection (for operators and tests)."""
        return None if self._conn is None else self._conn.get_server_pid()

    async def connect(self) -> None:
        """Open the connection (ending the session of a connection given up on); raises on
        failure."""
        conn = await connect(self._dsn, "dataloader-locks", self._timeout)
        try:
            session = await asyncio.wait_for(connections.own_session(conn), self._timeout)
            await self._abandoned.end(conn, self._timeout)
        except BaseException:
            conn.terminate()
            raise
        conn.add_termination_listener(self._terminated)
        self._session = session
        self._generation += 1
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

    async def try_lock(self, lock_hashes: Iterable[int | None]) -> set[int]:
        """Lock what can be locked; returns the hashes now held for the caller. A hash already
        held in this process, or listed twice, is busy; None (a job that needs no lock) is
        left out, and a call with nothing else runs no statement."""
        # in order, each once (a dict keeps order and tests membership at once)
        wanted = list(
            dict.fromkeys(h for h in lock_hashes if h is not None and h not in self._held)
        )
        if not wanted:
            return set()
        generation = self._generation
        for lock_hash in wanted:  # reserve before the await: a concurrent caller sees them busy
            self._held[lock_hash] = generation
        got: set[int] = set()
        try:
            # the generation of the connection the statement ran on, read under the mutex: if
            # the connection was replaced while we waited for it, these locks are the new one's
            generation, result = await self._run_on(protocol.try_advisory_locks, wanted)
            got = {h for h, locked in result.items() if locked}
            for lock_hash in got:
                self._held[lock_hash] = generation
        except LockConnectionLost:
            raise
        except Exception:
            await self._release_fully(wanted, "a batched lock failed part way")
            raise
        finally:
            for lock_hash in wanted:
                if lock_hash not in got:
                    del self._held[lock_hash]
        return got

    async def unlock(self, lock_hashes: Iterable[int | None]) -> None:
        """Release hashes reserved by this process (None: a job that needed no lock); those
        locked on the live connection in one round trip (a lost connection's locks went with
        it)."""
        live: list[int] = []
        for lock_hash in {h for h in lock_hashes if h is not None}:
            generation = self._held.pop(lock_hash, None)
            if generation == self._generation and self._conn is not None:
                live.append(lock_hash)
        if live:
            self._unlocking.update(live)  # until the statement has run: see `audit`
            try:
                with contextlib.suppress(LockConnectionLost):
                    await self._run(protocol.advisory_unlock, live)
            finally:
                self._unlocking.subtract(live)
                self._unlocking += Counter()  # drop the zeros

    async def audit(self) -> None:
        """Check the connection end to end (a failure counts as losing it), and release every
        lock the session holds that no job of this process reserved."""
        try:
            leaked = await self._run(self._release_leaked)
        except LockConnectionLost:
            raise
        except Exception as exc:
            self._lose(f"could not release advisory locks held for no job: {exc!r}")
            return
        if leaked:
            log.error("released %d advisory lock(s) held for no job of this process", len(leaked))

    async def _release_leaked(self, conn: Connection) -> list[int]:
        """Release every level of the locks `conn` holds for no job; which they were. Run under
        the connection's mutex, so that no statement of ours runs meanwhile: every lock it
        holds is then either reserved for a job, or on its way to release (the unlock's
        statement waits for the mutex), or held for no one. Reading the locks, then releasing
        in another statement, would let a lock be released and taken again for a new job in
        between, and that job's lock be released as if it were leaked."""
        held = await protocol.held_advisory_locks(conn)
        leaked = sorted(held - self._held.keys() - self._unlocking.keys())
        if leaked:
            await protocol.advisory_unlock_fully(conn, leaked)
        return leaked

    async def _release_fully(self, lock_hashes: list[int], why: str) -> None:
        """Release every level of locks this process must not hold; if that fails too, give
        the connection up (the server then frees all of its locks, and our jobs are stopped)."""
        log.error("releasing %d advisory lock(s) %s", len(lock_hashes), why)
        try:
            await self._run(protocol.advisory_unlock_fully, lock_hashes)
        except LockConnectionLost:
            pass
        except Exception as exc:
            self._lose(f"could not release advisory locks ({why}): {exc!r}")

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
        _, value = await self._run_on(op, *args, **kwargs)
        return value

    async def _run_on(
        self,
        op: Callable[Concatenate[Connection, P], Awaitable[R]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> tuple[int, R]:
        """Run `op` on the live connection; (that connection's generation, the result)."""
        async with self._mutex:
            conn = self._conn
            if conn is None:
                raise LockConnectionLost("lock connection is not open")
            if conn.is_closed():
                self._lose("lock connection closed")
                raise LockConnectionLost("lock connection closed")
            generation = self._generation
            try:
                value = await asyncio.wait_for(op(conn, *args, **kwargs), self._timeout)
                return generation, value
            except TimeoutError as exc:
                # a half-open socket: nothing comes back, and nothing says it is gone; its
                # session may live on, holding the locks, until the next connection ends it
                if self._session is not None:
                    self._abandoned.add(*self._session)
                self._lose(f"lock connection did not answer within {self._timeout}s")
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
        self.ready.clear()  # reservations stay until their jobs, stopped now, unlock them
        self._lost.set()
        conn.terminate()
        self._on_lost(reason)
