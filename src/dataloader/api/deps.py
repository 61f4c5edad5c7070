"""Route dependencies shared by the API's routers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request


def from_state(name: str) -> Callable[[Request], Awaitable[Any]]:
    """A dependency that gives what the application's lifespan put in `app.state.<name>`.
    (A coroutine: FastAPI runs a plain function dependency in a thread, a hop per request.)"""

    async def dependency(request: Request) -> Any:
        return getattr(request.app.state, name)

    return dependency
