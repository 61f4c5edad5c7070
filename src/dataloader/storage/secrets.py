"""Secrets every process of a deployment shares (`dl_secrets`, migration 0032): made by the
first process that asks for one, the same for all after it. Never logged."""

from __future__ import annotations

import secrets
from typing import Final

from dataloader.storage.connections import Queries
from dataloader.storage.statement import Statement

#: Bytes of a secret made here.
SECRET_BYTES: Final = 32

#: The secret `name`, stored as `candidate` if there is none yet. One statement, so that
#: processes starting together agree: the unique index makes the later ones wait for the
#: first, and their update (a no-op of the row) returns the secret the first one stored.
SHARED_SECRET: Final = Statement("""
INSERT INTO dl_secrets (name, secret) VALUES (:name, :candidate)
ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
RETURNING secret
""")


class SecretStore:
    """The shared secrets, over `db`."""

    def __init__(self, db: Queries) -> None:
        self._db = db

    async def shared(self, name: str) -> bytes:
        """The secret `name`: made now (random, SECRET_BYTES) if no process made it before."""
        stored: bytes = await self._db.fetchval(
            *SHARED_SECRET.bind(name=name, candidate=secrets.token_bytes(SECRET_BYTES))
        )
        return stored
