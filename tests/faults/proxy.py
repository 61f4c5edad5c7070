"""A loopback TCP proxy in front of PostgreSQL's Unix socket, which can go silent.

`freeze()` makes every connection open at that moment half-open: nothing is forwarded any more
in either direction, yet no side sees the connection close (as with a stuck middlebox or a
peer that vanished without a FIN). Connections opened afterwards are forwarded normally.
`partition()` cuts the client side off altogether until `heal()`: open connections freeze, new
ones are accepted and then stay silent too.
"""

from __future__ import annotations

import asyncio
import contextlib

CHUNK = 65536


class FreezingProxy:
    def __init__(self, upstream_socket: str) -> None:
        self._upstream = upstream_socket
        self._server: asyncio.Server | None = None
        self._live: set[asyncio.Event] = set()  # one "frozen" flag per connection
        self._writers: list[asyncio.StreamWriter] = []
        self._healed = asyncio.Event()
        self._healed.set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def dsn(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def freeze(self) -> int:
        """Stop forwarding on every open connection; returns how many were frozen."""
        frozen = len(self._live)
        for flag in self._live:
            flag.set()
        self._live = set()
        return frozen

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

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if not self._healed.is_set():  # partitioned: accepted, never answered
            self._writers.append(client_w)
            return
        try:
            server_r, server_w = await asyncio.open_unix_connection(self._upstream)
        except OSError:
            client_w.close()
            return
        self._writers += [client_w, server_w]
        frozen = asyncio.Event()
        self._live.add(frozen)
        await asyncio.gather(
            self._pump(client_r, server_w, frozen),
            self._pump(server_r, client_w, frozen),
        )
        self._live.discard(frozen)

    @staticmethod
    async def _pump(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frozen: asyncio.Event
    ) -> None:
        with contextlib.suppress(OSError):
            while not frozen.is_set():
                data = await reader.read(CHUNK)
                if frozen.is_set():
                    break  # swallowed: the connection went silent
                if not data:
                    writer.close()
                    return
                writer.write(data)
                await writer.drain()
        await frozen.wait()  # silent for good: neither forward nor close
