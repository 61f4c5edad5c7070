"""A loopback TCP proxy in front of PostgreSQL, which can go silent or cut answers.

`freeze()` makes every connection open at that moment half-open: nothing is forwarded any more
in either direction, yet no side sees the connection close (as with a stuck middlebox or a
peer that vanished without a FIN). Connections opened afterwards are forwarded normally.

`cut_answers()` makes every connection with a request in flight lose its answer: the server's
next bytes on it are swallowed and both sides closed, so a statement that commits is never
heard of (the connection cut after COMMIT). `refuse()` closes every connection and every new
one at once (the database unreachable).

`partition()` cuts the client side off altogether until `heal()`: open connections freeze, new
ones are accepted and then stay silent too.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

CHUNK = 65536

#: Where the server listens: its Unix socket's path, or (host, port).
Upstream = str | tuple[str, int]


def upstream_of(dsn: str) -> Upstream:
    """Where the server of `dsn` (a TCP or Unix-socket DSN) listens."""
    parts = urlsplit(dsn)
    socket_dir = parse_qs(parts.query).get("host", [""])[0]
    if socket_dir.startswith("/"):
        return f"{socket_dir}/.s.PGSQL.{parts.port or 5432}"
    return parts.hostname or "127.0.0.1", parts.port or 5432


@dataclass(eq=False)
class _Link:
    """One proxied connection."""

    frozen: asyncio.Event = field(default_factory=asyncio.Event)
    #: The client sent bytes the server has not answered yet.
    awaiting: bool = False
    #: The server's next bytes are swallowed and the connection closed.
    cut: bool = False
    writers: list[asyncio.StreamWriter] = field(default_factory=list)


class FreezingProxy:
    def __init__(self, upstream: Upstream) -> None:
        self._upstream = upstream
        self._server: asyncio.Server | None = None
        self._live: set[_Link] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self._healed = asyncio.Event()
        self._healed.set()
        self.port = 0
        self._refusing = False

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def dsn(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def freeze(self) -> int:
        """Stop forwarding on every open connection; returns how many were frozen."""
        frozen = len(self._live)
        for link in self._live:
            link.frozen.set()
        self._live = set()
        return frozen

    def cut_answers(self) -> int:
        """Close every connection with a request in flight when its answer comes, the answer
        swallowed; returns how many."""
        waiting = [link for link in self._live if link.awaiting]
        for link in waiting:
            link.cut = True
        return len(waiting)

    def refuse(self) -> None:
        """Close every connection, and from now on every new one at once."""
        self._refusing = True
        for link in self._live:
            for writer in link.writers:
                writer.close()

    def partition(self) -> None:
        """Nothing gets through, on open connections or new ones, until `heal()`."""
        self._healed.clear()
        self.freeze()

    def heal(self) -> None:
        """New connections are forwarded again (those frozen stay silent)."""
        self._healed.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if isinstance(self._upstream, str):
            return await asyncio.open_unix_connection(self._upstream)
        return await asyncio.open_connection(*self._upstream)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self._refusing:
            client_w.close()
            return
        if not self._healed.is_set():  # partitioned: accepted, never answered
            self._writers.append(client_w)
            return
        try:
            server_r, server_w = await self._open_upstream()
        except OSError:
            client_w.close()
            return
        self._writers += [client_w, server_w]
        link = _Link(writers=[client_w, server_w])
        self._live.add(link)
        await asyncio.gather(
            self._pump(client_r, server_w, link, request=True),
            self._pump(server_r, client_w, link, request=False),
        )
        self._live.discard(link)

    @staticmethod
    async def _pump(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link, *, request: bool
    ) -> None:
        with contextlib.suppress(OSError):
            while not link.frozen.is_set():
                data = await reader.read(CHUNK)
                if link.frozen.is_set():
                    break  # swallowed: the connection went silent
                if not data:
                    writer.close()
                    return
                if not request and link.cut:  # swallowed: the answer is lost
                    for each in link.writers:
                        each.close()
                    return
                writer.write(data)
                await writer.drain()
                link.awaiting = request
        await link.frozen.wait()  # silent for good: neither forward nor close
