"""The service's OpenAPI schema, made to say exactly what the service does: FastAPI's schema,
plus what it cannot derive from the routes alone.

* Security is declared only when `DL_API_TOKENS` is set: without tokens no route asks for one,
  and a schema that said otherwise would send clients (and generated ones) looking for a token
  that does not exist.
* `args` is any JSON object whose strings (keys and values) hold no NUL: jsonb cannot store
  one. The schema is recursive (`JsonValue`).
* Links from the trigger's `job_id` to the job's status and cancel, so that a client (or a
  stateful test) knows where the id goes.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from dataloader.core.limits import NO_NUL_PATTERN

TRIGGER_PATH = "/api/v1/jobs/trigger"
#: Operations that take the job_id a trigger answers with.
JOB_PATHS = {
    "GetJobStatus": ("/api/v1/jobs/{job_id}/status", "get"),
    "CancelJob": ("/api/v1/jobs/{job_id}/cancel", "post"),
}

#: Any JSON value whose strings hold no NUL.
JSON_VALUE: dict[str, Any] = {
    "anyOf": [
        {"type": "null"},
        {"type": "boolean"},
        {"type": "number"},
        {"type": "string", "pattern": NO_NUL_PATTERN},
        {"type": "array", "items": {"$ref": "#/components/schemas/JsonValue"}},
        {"$ref": "#/components/schemas/JsonObject"},
    ]
}
JSON_OBJECT: dict[str, Any] = {
    "type": "object",
    "propertyNames": {"pattern": NO_NUL_PATTERN},
    "additionalProperties": {"$ref": "#/components/schemas/JsonValue"},
}


def install_openapi(app: FastAPI, *, secured: bool) -> None:
    """Serve the exact schema from `app` (built once, on first use)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            if not secured:
                _drop_security(schema)
            _exact_args(schema)
            _link_job_id(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override


def _operations(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return [op for path in schema["paths"].values() for op in path.values()]


def _drop_security(schema: dict[str, Any]) -> None:
    for operation in _operations(schema):
        operation.pop("security", None)
        for status in ("401", "403"):  # no token is asked for, none is refused
            operation["responses"].pop(status, None)
    schema.get("components", {}).pop("securitySchemes", None)


def _exact_args(schema: dict[str, Any]) -> None:
    schemas = schema["components"]["schemas"]
    schemas["JsonValue"] = JSON_VALUE
    schemas["JsonObject"] = JSON_OBJECT
    args = schemas["TriggerRequest"]["properties"]["args"]
    schemas["TriggerRequest"]["properties"]["args"] = {
        "$ref": "#/components/schemas/JsonObject",
        "description": args.get("description", "The task's arguments (a JSON object)."),
    }


def _link_job_id(schema: dict[str, Any]) -> None:
    links = {}
    for name, (path, method) in JOB_PATHS.items():
        operation = schema["paths"][path][method]
        links[name] = {
            "operationId": operation["operationId"],
            "parameters": {"job_id": "$response.body#/job_id"},
        }
    schema["paths"][TRIGGER_PATH]["post"]["responses"]["200"]["links"] = links
