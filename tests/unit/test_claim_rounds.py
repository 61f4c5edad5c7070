"""A claim round is in flight (`started` ahead of `answered`) from the moment it begins, its
put-back of due jobs included, until its claim is answered or fails: what tests and operators
read to know that no round decided earlier is still under way."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from dataloader.core.due import PutBack
from dataloader.storage.protocol import ClaimRound

from .test_due import ScriptedProtocol, claims_of


class HeldPutBack(ScriptedProtocol):
    """A put-back that waits for `release`; a claim that fails when `fail` is set."""

    def __init__(self) -> None:
        super().__init__(PutBack(0, None), due_in=None)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.fail = False

    async def put_back_due(self, queue: str, limit: int) -> PutBack:
        self.entered.set()
        await self.release.wait()
        return await super().put_back_due(queue, limit)

    async def claim_round(self, *args: Any, **kwargs: Any) -> ClaimRound:
        if self.fail:
            raise ConnectionResetError("connection lost")
        return await super().claim_round(*args, **kwargs)


async def test_a_round_is_in_flight_while_it_puts_back_due_jobs() -> None:
    protocol = HeldPutBack()
    claims = claims_of(protocol)
    round_ = asyncio.create_task(claims.claim(10, now=time.monotonic()))
    await protocol.entered.wait()  # the round has begun: it waits in its put-back
    assert (claims.started, claims.answered) == (1, 0)
    protocol.release.set()
    await round_
    assert (claims.started, claims.answered) == (1, 1)


async def test_a_failed_round_is_no_longer_in_flight() -> None:
    protocol = HeldPutBack()
    protocol.release.set()
    protocol.fail = True
    claims = claims_of(protocol)
    with pytest.raises(ConnectionResetError):
        await claims.claim(10, now=time.monotonic())
    assert (claims.started, claims.answered) == (1, 1)
