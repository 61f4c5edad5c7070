"""`/status` with queues on several clusters (`DL_CLUSTERS`): every cluster read apart, each
within the status's time bound, so that one cluster down shows as down beside the others.

The body keeps the shape of one cluster's (additions only): `queues`, `live_workers` and
`workers` gather every cluster's, each entry naming its `cluster`; `maintenance` and the
table's health are the default cluster's; `clusters` gives each cluster's own status (or
why it gave none). One cluster down answers 503 (with Retry-After) and `status: degraded`:
what a monitor should see, while the others' figures are still there.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from dataloader.api.v1.exceptions import unavailable_response
from dataloader.clusters import where
from dataloader.core.clusters import DEFAULT
from dataloader.exceptions import DatabaseUnavailable
from dataloader.health import SystemStatus

if TYPE_CHECKING:
    from starlette.datastructures import State

    from dataloader.clusters import ClusterRuntime


async def _read(runtime: ClusterRuntime, name: str, timeout: float) -> SystemStatus | str:
    """One cluster's status, or why there is none."""
    try:
        async with asyncio.timeout(timeout):
            return await runtime.client.on(name).status()
    except TimeoutError:
        return f"no answer within {timeout}s"
    except DatabaseUnavailable:
        return "unavailable"


async def cluster_status(state: State, body: dict[str, Any], timeout: float) -> JSONResponse:
    """The body of /status over every cluster of `state.clusters` (see the module)."""
    runtime: ClusterRuntime = state.clusters
    names = runtime.client.clusters.names  # those not reached since the start too
    read = await asyncio.gather(*(_read(runtime, name, timeout) for name in names))
    body.update(queues={}, live_workers=[], warnings=[], clusters={})
    body["workers"] = [
        {
            "cluster": name,
            "queue": queue,
            "concurrency": w.concurrency,
            "busy": w.busy,
            "shared": w.shared,
        }
        for name, manager in runtime.managers.items()
        for queue, w in manager.queues.items()
    ]
    down = []
    for name, found in zip(names, read, strict=True):
        manager = runtime.managers.get(name)
        leads = manager is not None and manager.maintenance.leadership.leading.is_set()
        entry: dict[str, Any] = {"where": where(runtime.settings, name)}
        if isinstance(found, str):
            down.append(name)
            entry.update(status="degraded", database=found)
            body["warnings"].append(f"cluster {name!r}: {found}")
        else:
            document = found.document()
            document["maintenance"]["this_process_leads"] = leads
            entry.update(status="ok", **document)
            for queue, figures in document["queues"].items():
                if queue not in body["queues"] or runtime.client.clusters.of_queue(queue) == name:
                    body["queues"][queue] = {**figures, "cluster": name}
            body["live_workers"] += [{**w, "cluster": name} for w in document["live_workers"]]
            body["warnings"] += [
                w if name == DEFAULT else f"cluster {name!r}: {w}" for w in document["warnings"]
            ]
            if name == DEFAULT:
                rest = {k: v for k, v in document.items() if k not in body}
                body.update(rest)
        body["clusters"][name] = entry
    body["queues"] = dict(sorted(body["queues"].items()))
    if down:
        body.update(status="degraded", database=f"unavailable in cluster {down[0]!r}")
        return unavailable_response(jsonable_encoder(body))
    body.update(status="ok", database="ok")
    return JSONResponse(content=jsonable_encoder(body))
