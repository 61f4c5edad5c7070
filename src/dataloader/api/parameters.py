"""What every route's query and path parameters must be, whatever the route declares: text
PostgreSQL can store (no NUL character). Checked by the class of every route (`CheckedRoute`),
before any dependency or the route reads its parameters, so that no page nor API route hands
such a value to a statement (which would fail with a 500); a refusal is a validation error like
the others (the API's 422, a page's error page), naming the parameter.

A route class rather than a dependency of the whole application: FastAPI solves each
dependency of each request through its general machinery, about 2 % of the service's CPU on the
HTTP trigger's path; a route class pays only the check."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from dataloader.core import limits

#: What a route runs on a request before FastAPI reads anything of it: it raises to refuse.
Admission = Callable[[Request], None]


def check_parameters(request: Request) -> None:
    """Refuse (RequestValidationError) a request whose query or path parameters hold text
    that no statement can take."""
    given = [
        *(("query", name, value) for name, value in request.query_params.multi_items()),
        *(("path", name, value) for name, value in request.path_params.items()),
    ]
    errors = []
    for where, name, value in given:
        if not isinstance(value, str):
            continue  # converted by its route (an int, a uuid): not text
        try:
            limits.check_storable(value)
        except ValueError as exc:
            errors.append(
                {
                    "type": "value_error",
                    "loc": (where, name),
                    "msg": f"Value error, {exc}",
                    "input": value,
                }
            )
    if errors:
        raise RequestValidationError(errors)


class CheckedRoute(APIRoute):
    """The class of every route of the service: its `admission` runs first of all on each
    request (here: `check_parameters`; subclasses check more, e.g. the bearer token)."""

    def admission(self) -> Admission:
        """What this route checks of a request before FastAPI reads it."""
        return check_parameters

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        admit = self.admission()

        async def admitted(request: Request) -> Response:
            admit(request)
            return await handler(request)

        return admitted
