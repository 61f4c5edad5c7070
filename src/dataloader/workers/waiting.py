"""Small asyncio helpers for loops that wait on several things at once."""

from __future__ import annotations

import asyncio
import random


async def wait_any(*events: asyncio.Event, timeout: float | None = None) -> bool:
    """Wait until any of `events` is set or `timeout` seconds pass; True if an event fired."""
    if any(event.is_set() for event in events):
        return True
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        return bool(done)
    finally:
        for waiter in waiters:
            waiter.cancel()


def jittered(seconds: float, spread: float = 0.2) -> float:
    """`seconds` ± `spread` (a fraction), so replicas' periodic work does not align."""
    return seconds * random.uniform(1 - spread, 1 + spread)
