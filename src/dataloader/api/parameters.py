"""What every route's query and path parameters must be, whatever the route declares: text
PostgreSQL can store (no NUL character). Checked by one dependency of the whole application,
before any route reads its parameters, so that no page nor API route hands such a value to a
statement (which would fail with a 500); a refusal is a validation error like the others (the
API's 422, a page's error page), naming the parameter."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError

from dataloader.core import limits


async def storable_parameters(request: Request) -> None:
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
