"""The overview: every queue in one table, the warnings, who leads maintenance, the live
worker processes."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from dataloader.client import Client
from dataloader.dashboard.common import PREFIX, PageClient, PageViewer, render
from dataloader.health import SystemStatus

router = APIRouter(prefix=PREFIX)


@dataclass(frozen=True, slots=True)
class Overview:
    """What the overview shows."""

    status: SystemStatus

    @property
    def queues(self) -> list[str]:
        return sorted(self.status.queues)


async def overview_of(client: Client) -> Overview:
    return Overview(await client.status())


@router.get("", response_class=HTMLResponse, include_in_schema=False)
async def overview(request: Request, client: PageClient, viewer: PageViewer) -> HTMLResponse:
    return render(request, viewer, "overview.html", page=await overview_of(client))
