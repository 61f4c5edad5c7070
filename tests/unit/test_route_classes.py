"""Every route of the service checks its query and path parameters before anything reads
them (`api.parameters.CheckedRoute`): a route of a router that forgot its route class would
hand a NUL to a statement (a 500), so this walks every route of the application."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from dataloader.api import create_app
from dataloader.api.auth import AuthorizedRoute
from dataloader.api.parameters import CheckedRoute
from dataloader.config import load_settings
from dataloader.tasks import TaskRegistry

from .settings_env import clean_environment

__all__ = ["clean_environment"]

#: Pages of the docs, which FastAPI adds before any route class can be chosen; they read no
#: parameter.
DOCS_PAGES = {"/docs", "/docs/oauth2-redirect", "/redoc"}


def _routes(routes: list[BaseRoute], prefix: str = "") -> Iterator[tuple[str, APIRoute]]:
    """Every APIRoute reachable from `routes`, through included routers, with its full path."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            context = route.include_context  # type: ignore[attr-defined]
            yield from _routes(included.routes, prefix + context.prefix)
        elif isinstance(route, APIRoute):
            yield prefix + route.path, route


@pytest.mark.usefixtures("clean_environment")
def test_every_route_checks_its_parameters_and_every_api_route_its_token() -> None:
    app = create_app(load_settings(db_dsn="postgresql://nobody@127.0.0.1:1/none"), TaskRegistry())
    routes = dict(_routes(app.routes))
    # the walk found the API's routes and the dashboard's
    assert "/api/v1/jobs/trigger" in routes
    assert "/ui/jobs" in routes
    unchecked = [p for p, r in routes.items() if not isinstance(r, CheckedRoute)]
    assert sorted(unchecked) == sorted(DOCS_PAGES)
    api = [r for p, r in routes.items() if p.startswith("/api/")]
    assert all(isinstance(r, AuthorizedRoute) for r in api)
