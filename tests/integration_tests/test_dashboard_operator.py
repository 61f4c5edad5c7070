"""What an operator meets on the dashboard: why a job waits when its queue's slots are busy,
buttons that follow the live state, destructive actions confirmed first, and the small things
(a favicon, bidi controls shown escaped, filters kept, newer pages). In-process over HTTP, and
in a real browser (Debian's chromium, driven by Playwright) against a service on 127.0.0.1."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from dataloader.dashboard.jobs import job_view_of
from dataloader.tasks import TaskRegistry
from dataloader.workers.job_context import JobContext

from .conftest import StartService
from .test_dashboard import signed_in

BUSY = "ui.busy"


async def test_a_job_behind_busy_slots_names_them_and_who_holds_them(
    start_service: StartService, registry: TaskRegistry
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @registry.task("ui.hold", queue=BUSY)
    async def hold(ctx: JobContext[dict[str, Any]]) -> None:
        started.set()
        await release.wait()

    service = await start_service(workers=[{"queue": BUSY, "concurrency": 1}], claim_ahead=False)
    running = await service.trigger(queue=BUSY, task="ui.hold")
    await asyncio.wait_for(started.wait(), 20)
    waiting = await service.trigger(queue=BUSY, task="ui.hold")
    try:
        view = await job_view_of(service.dl, uuid.UUID(waiting))
        assert view is not None
        [busy] = view.waiting
        assert busy.text == (
            "every slot serving its queue is busy: 1 of its jobs run in the 1 slot(s)"
            " of 1 live process(es)"
        )
        [worker] = await service.dl.workers()
        assert [(h.job_id, h.process) for h in busy.holders] == [
            (running, f"{worker.host} pid {worker.pid}")
        ]
        page = (await (await signed_in(service)).get(f"/ui/jobs/{waiting}")).text
        assert "every slot serving its queue is busy" in page
        assert f'href="/ui/jobs/{running}"' in page
        assert "nothing holds it back" not in page
    finally:
        release.set()
    await service.wait_status(waiting, "succeeded")
