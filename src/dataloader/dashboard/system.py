"""The live worker processes, and the schedules with maintenance's runs."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from dataloader.dashboard.common import PREFIX, PageClient, PageViewer, render

router = APIRouter(prefix=PREFIX)


@router.get("/workers", response_class=HTMLResponse, include_in_schema=False)
async def workers(request: Request, client: PageClient, viewer: PageViewer) -> HTMLResponse:
    return render(request, viewer, "workers.html", workers=await client.workers())


@router.get("/cron", response_class=HTMLResponse, include_in_schema=False)
async def cron(request: Request, client: PageClient, viewer: PageViewer) -> HTMLResponse:
    return render(request, viewer, "cron.html", maintenance=await client.maintenance())
