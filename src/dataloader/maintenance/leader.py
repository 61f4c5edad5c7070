"""Which process leads maintenance: the holder of the `maintenance` lease (`dl_leases`).

Each process running workers bids every third of `DL_LEADER_LEASE_SEC`: the holder renews the
lease, the others take it once it has expired. A clean stop releases it, so another process
takes over at its next bid. A leader that cannot reach the database steps down before its
lease can have expired, so that by its own clock it never leads past the lease another may
take.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from dataloader.storage.db import CONNECTION_ERRORS
from dataloader.storage.maintenance import MAINTENANCE_LEASE, MaintenanceStore
from dataloader.workers.waiting import jittered, wait_any

log = logging.getLogger(__name__)

#: A leader whose renewals fail steps down this far into its lease (by its own clock, from
#: before the last renewal that got through was sent).
STEP_DOWN_AT: Final = 0.8


class Leadership:
    """This process's bid for the maintenance lease; `leading` is set while it holds it."""

    def __init__(self, store: MaintenanceStore, holder: str, ttl_sec: float) -> None:
        self._store = store
        self.holder = holder
        self._ttl = ttl_sec
        self.leading = asyncio.Event()
        #: Set while this process does not lead (maintenance loops wait for `leading`).
        self.following = asyncio.Event()
        self.following.set()
        self._valid_until = 0.0  # monotonic: when leading must stop without a renewal

    async def run(self, stopping: asyncio.Event) -> None:
        """Bid until `stopping` is set; then release the lease if held. Should the loop
        itself fail, this process steps down first: nobody renews its lease any more."""
        try:
            while True:
                await self.bid()
                if await wait_any(stopping, timeout=jittered(self._ttl / 3, 0.1)):
                    break
        except BaseException:
            self._follow("its bidding loop stopped")
            raise
        await self.release()

    async def bid(self) -> bool:
        """Take or renew the lease once; whether this process leads now."""
        sent = time.monotonic()
        try:
            lease = await self._store.acquire(MAINTENANCE_LEASE, self.holder, self._ttl)
        except Exception as exc:
            log.warning(
                "could not bid for the maintenance lease: %r",
                exc,
                exc_info=not isinstance(exc, CONNECTION_ERRORS),
            )
            if self.leading.is_set() and time.monotonic() >= self._valid_until:
                self._follow("its lease may have expired")
            return self.leading.is_set()
        if lease is None:
            self._follow("another process holds the lease")
            return False
        self._valid_until = sent + self._ttl * STEP_DOWN_AT
        if not self.leading.is_set():
            log.info("this process leads maintenance (reaper, pruner, cron)")
            self.following.clear()
            self.leading.set()
        return True

    async def release(self) -> None:
        """Stop leading and give the lease up (a clean stop): another process takes it now."""
        was_leading = self.leading.is_set()
        self._follow("it stops")
        if not was_leading:
            return
        try:
            await self._store.release(MAINTENANCE_LEASE, self.holder)
        except Exception as exc:
            log.warning("could not release the maintenance lease (it expires): %r", exc)

    def _follow(self, why: str) -> None:
        if self.leading.is_set():
            log.info("this process no longer leads maintenance: %s", why)
        self.leading.clear()
        self.following.set()
