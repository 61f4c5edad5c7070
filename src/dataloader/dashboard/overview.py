"""The overview: every queue in one table, the warnings, who leads maintenance, the live
worker processes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from dataloader.api.parameters import CheckedRoute
from dataloader.client import Client
from dataloader.dashboard.charts import summary, throughput_svg
from dataloader.dashboard.common import PREFIX, PageClient, PageViewer, render
from dataloader.health import SystemStatus

router = APIRouter(prefix=PREFIX, route_class=CheckedRoute)


#: The throughput charts: (title, span, step).
CHARTS: Final = (
    ("the last hour, per minute", timedelta(hours=1), timedelta(minutes=1)),
    ("the last day, per 30 minutes", timedelta(days=1), timedelta(minutes=30)),
)


@dataclass(frozen=True, slots=True)
class Chart:
    title: str
    svg: Markup
    totals: dict[str, int]


@dataclass(frozen=True, slots=True)
class Overview:
    """What the overview shows."""

    status: SystemStatus
    charts: list[Chart]

    @property
    def queues(self) -> list[str]:
        return sorted(self.status.queues)


async def overview_of(client: Client) -> Overview:
    charts = []
    now = datetime.now(UTC)
    for title, span, step in CHARTS:
        points = await client.throughput(
            span_sec=int(span.total_seconds()), step_sec=int(step.total_seconds())
        )
        start = _floor(now - span, step) + step
        svg = throughput_svg(points, start=start, span=span, step=step, title=f"Jobs ended {title}")
        charts.append(Chart(title, svg, summary(points)))
    return Overview(await client.status(), charts)


def _floor(moment: datetime, step: timedelta) -> datetime:
    """`moment` down to a multiple of `step` since the epoch (as the buckets are cut)."""
    seconds = step.total_seconds()
    return datetime.fromtimestamp(moment.timestamp() // seconds * seconds, UTC)


@router.get("", response_class=HTMLResponse, include_in_schema=False)
async def overview(request: Request, client: PageClient, viewer: PageViewer) -> HTMLResponse:
    return render(request, viewer, "overview.html", page=await overview_of(client))
