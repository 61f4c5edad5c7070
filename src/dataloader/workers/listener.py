"""One LISTEN connection per process: wakes the queues named in `dl_jobs` notifications and
forwards cancel requests. Reconnects with backoff; after each (re)connect every queue polls
once, since notifications sent while disconnected are gone."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from dataloader import metrics
from dataloader.storage import connections, queries
from dataloader.storage.db import (
    CONNECTION_ERRORS,
    DEFAULT_TIMEOUT_SEC,
    AnyConnection,
    Connection,
    connect,
)
from dataloader.workers.waiting import wait_any

log = logging.getLogger(__name__)


class Listener:
    """LISTEN on `dl_jobs` and `dl_jobs_cancel`."""

    def __init__(
        self,
        dsn: str,
        *,
        on_queue_ready: Callable[[str], None],
        on_cancel: Callable[[uuid.UUID], None],
        on_connected: Callable[[], None],
        check_period_sec: float = 5.0,
        timeout: float = DEFAULT_TIMEOUT_SEC,
    ) -> None:
        self._dsn = dsn
        self._on_queue_ready = on_queue_ready
        self._on_cancel = on_cancel
        self._on_connected = on_connected
        self._check_period = check_period_sec
        self._timeout = timeout  # for the answer to the periodic ping
        self._conn: Connection | None = None
        self._closed = asyncio.Event()
        self.connected = asyncio.Event()
        self.reconnects = 0
        #: Sessions of connections that went silent: ended from the next connection.
        self._abandoned = connections.AbandonedSessions("listener")

    @property
    def backend_pid(self) -> int | None:
        """Server pid of the LISTEN connection (for operators and tests)."""
        return None if self._conn is None else self._conn.get_server_pid()

    async def run(self, stopping: asyncio.Event) -> None:
        """Listen until `stopping` is set."""
        delay = 0.1
        while not stopping.is_set():
            try:
                await self._listen_once(stopping)
                delay = 0.1
            except Exception as exc:  # never give up listening; back off instead
                log.warning("listener connection failed, retrying in %.1fs: %r", delay, exc)
                await wait_any(stopping, timeout=delay)
                delay = min(delay * 2, 5.0)

    async def _listen_once(self, stopping: asyncio.Event) -> None:
        conn = await connect(self._dsn, "dataloader-listener", self._timeout)
        self._closed.clear()
        conn.add_termination_listener(lambda _c: self._closed.set())
        try:
            session = await asyncio.wait_for(connections.own_session(conn), self._timeout)
            await self._abandoned.end(conn, self._timeout)
            await conn.add_listener(queries.JOBS_CHANNEL, self._notified)
            await conn.add_listener(queries.CANCEL_CHANNEL, self._notified)
            self._conn = conn
            self.connected.set()
            metrics.LISTENER_UP.set(1)
            log.info("listening for notifications")
            self._on_connected()  # catch up on whatever was sent while we were away
            while not stopping.is_set():
                if await wait_any(stopping, self._closed, timeout=self._check_period):
                    return
                try:
                    await asyncio.wait_for(connections.ping(conn), self._timeout)
                except TimeoutError:  # a silent, half-open socket: its session may live on
                    if session is not None:
                        self._abandoned.add(*session)
                    raise
        finally:
            self.connected.clear()
            metrics.LISTENER_UP.set(0)
            self._conn = None
            if self._closed.is_set():
                self.reconnects += 1
                log.warning("listener connection lost; reconnecting")
            if not conn.is_closed():
                await _close_quietly(conn)

    def _notified(self, _conn: AnyConnection, _pid: int, channel: str, payload: object) -> None:
        if channel == queries.JOBS_CHANNEL:
            self._on_queue_ready(str(payload))
        elif channel == queries.CANCEL_CHANNEL:
            try:
                self._on_cancel(uuid.UUID(str(payload)))
            except ValueError:
                log.warning("ignoring malformed cancel notification %r", payload)


async def _close_quietly(conn: Connection) -> None:
    try:
        await asyncio.wait_for(conn.close(), timeout=2)
    except CONNECTION_ERRORS:
        conn.terminate()
