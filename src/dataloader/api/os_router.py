"""Infrastructure routes: `/health` for probes (no database), `/status`, `/metrics`."""

from __future__ import annotations

import asyncio
from importlib.metadata import version
from typing import Any, Final

from fastapi import APIRouter, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response

from dataloader import metrics
from dataloader.api.auth import AUTH_ERRORS, AuthorizedRoute, requires
from dataloader.api.clusters import cluster_status
from dataloader.api.v1.exceptions import unavailable_response
from dataloader.config import Scope
from dataloader.exceptions import DatabaseUnavailable
from dataloader.storage.db import CONNECTION_ERRORS

router = APIRouter(tags=["infra"], route_class=AuthorizedRoute)

#: /status gives up on the database after this long (it is probed by humans and monitors).
STATUS_DB_TIMEOUT_SEC = 3.0


def package_version() -> str:
    return version("dataloader")


@router.get("/health", operation_id="health")
async def health() -> dict[str, str]:
    """Liveness/readiness: the process answers. Touches no database."""
    return {"status": "ok"}


#: What leaves the gauges of a scrape out: the database slow or unreachable.
UNREADABLE: Final[tuple[type[BaseException], ...]] = (TimeoutError, *CONNECTION_ERRORS)


@router.get(
    "/metrics",
    dependencies=[requires(Scope.read)],
    responses={**AUTH_ERRORS, 200: {"content": {"text/plain": {}}}},
    response_class=Response,
    operation_id="get_metrics",
)
async def get_metrics(request: Request) -> Response:
    """This process's Prometheus metrics, in the text exposition format. The queue gauges
    (ready jobs, oldest ready age) and the durable processes by status are read from the
    database at each scrape (a few
    milliseconds, from index ranges); if it does not answer in time they are left out."""
    client = request.app.state.client
    try:
        async with asyncio.timeout(STATUS_DB_TIMEOUT_SEC):
            stats = await client.stats()
            counts = await client.processes.counts()
        metrics.set_queue_gauges(stats.values())
        metrics.set_process_gauges(counts)
    except UNREADABLE:
        metrics.set_queue_gauges(())
        metrics.set_process_gauges({})
    body, content_type = metrics.exposition()
    return Response(content=body, media_type=content_type)


@router.get(
    "/status", operation_id="get_status", dependencies=[requires(Scope.read)], responses=AUTH_ERRORS
)
async def status(request: Request) -> JSONResponse:
    """Database reachability; per queue, its jobs queued, running, failed and lost, and
    whether it is paused (finished jobs are history: `GET /api/v1/jobs` lists them); this
    process's workers; the live processes (`live_workers`); maintenance (which process leads
    it, the last run of the reaper, pruner and cron scheduler, each schedule's last slot);
    and warnings (queues with ready jobs that no live process serves, a transaction keeping
    vacuum from the queue table, a maintenance task failing or not run lately). Every figure
    is read from an index range of unfinished jobs: as fast beside millions of finished jobs
    as beside none."""
    state = request.app.state
    body: dict[str, Any] = {
        "version": package_version(),
        "worker_id": state.manager.worker_id if state.manager else None,
        "workers": [
            {"queue": queue, "concurrency": w.concurrency, "busy": w.busy, "shared": w.shared}
            for queue, w in (state.manager.queues.items() if state.manager else [])
        ],
    }
    if getattr(state, "clusters", None) is not None:  # DL_CLUSTERS: each cluster apart
        return await cluster_status(state, body, STATUS_DB_TIMEOUT_SEC)
    try:
        async with asyncio.timeout(STATUS_DB_TIMEOUT_SEC):
            system = await state.client.status()
    except TimeoutError:
        # slow (a huge table, a lock) or unreachable: say which we know
        body.update(status="degraded", database=f"no answer within {STATUS_DB_TIMEOUT_SEC}s")
        return unavailable_response(body)
    except DatabaseUnavailable:  # the client's word for a connection refused or lost
        body.update(status="degraded", database="unavailable")
        return unavailable_response(body)
    document = system.document()
    document["maintenance"]["this_process_leads"] = (
        state.manager is not None and state.manager.maintenance.leadership.leading.is_set()
    )
    body.update(status="ok", **document)
    return JSONResponse(content=jsonable_encoder(body))
