"""The service's OpenAPI schema, made to say exactly what the service does: FastAPI's schema,
plus what it cannot derive from the routes alone.

* Security is declared only when `DL_API_TOKENS` is set: without tokens no route asks for one,
  and a schema that said otherwise would send clients (and generated ones) looking for a token
  that does not exist.
* `args` is any JSON object whose strings (keys and values) hold no NUL: jsonb cannot store
  one (so are a durable process's task args and metadata, or null). The schema is
  recursive through objects (`JsonValue`, `JsonObject`); arrays directly inside arrays are
  spelt out to `NESTED_ARRAYS` levels, since client generators refuse an array that holds
  itself.
* The `args` a list of jobs or a bulk change filters by is a JSON object naming one key at
  least; in the list's query, its JSON text (a parameter with `content`, not `schema`).
* Links from the trigger's `job_id` to the job (and its status) and cancel, and from a
  process's start to the operations on it, so that a client (or a stateful test) knows where
  the ids go.
* The trigger's `args` follow the model of each task registered in this process (the trigger
  checks them against it), as a condition on `task`. `task` itself is not an enum: a trigger of
  a task no live process knows is accepted while no live process serves its queue
  (`core.routing`), so no list of names could say what is accepted.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from dataloader.core.limits import ARGS_MAX_ARRAY_NESTING, NO_NUL_PATTERN
from dataloader.tasks import TaskRegistry

TRIGGER_PATH = "/api/v1/jobs/trigger"
#: Operations that take the job_id a trigger answers with.
JOB_PATHS = {
    "GetJob": ("/api/v1/jobs/{job_id}", "get"),
    "GetJobStatus": ("/api/v1/jobs/{job_id}/status", "get"),
    "CancelJob": ("/api/v1/jobs/{job_id}/cancel", "post"),
}

#: A process's path, and the operations on the process its start's answer links to.
PROCESS_PATH = "/api/v1/processes/{namespace}/{process_id}"
PROCESS_LINKS = {
    "GetProcess": "get_process",
    "CallProcess": "call_process",
    "RepairProcess": "repair_process",
    "RemoveProcess": "remove_process",
    "ListProcessEvents": "list_process_events",
}

#: The JSON objects of the request bodies of durable processes' tasks.
PROCESS_OBJECTS = (("StartRequest", "args"), ("StartRequest", "metadata"), ("CallRequest", "args"))

#: Generators of clients (openapi-python-client) refuse an array whose items refer back to
#: it, so arrays of arrays are written out level by level, as deep as `args` may hold them.
NESTED_ARRAYS = ARGS_MAX_ARRAY_NESTING
_SCALARS_AND_OBJECT: list[dict[str, Any]] = [
    {"type": "null"},
    {"type": "boolean"},
    {"type": "number"},
    {"type": "string", "pattern": NO_NUL_PATTERN},
    {"$ref": "#/components/schemas/JsonObject"},
]


def _json_array(depth: int) -> dict[str, Any]:
    """An array of JSON values, holding arrays down to `depth` more levels."""
    items = [*_SCALARS_AND_OBJECT, *([_json_array(depth - 1)] if depth > 1 else [])]
    return {"type": "array", "items": {"anyOf": items}}


#: Any JSON value whose strings hold no NUL.
JSON_VALUE: dict[str, Any] = {"anyOf": [*_SCALARS_AND_OBJECT, _json_array(NESTED_ARRAYS)]}
JSON_OBJECT: dict[str, Any] = {
    "type": "object",
    "propertyNames": {"pattern": NO_NUL_PATTERN},
    "additionalProperties": {"$ref": "#/components/schemas/JsonValue"},
}


#: What a job's args contain, as a list or a bulk change filters them: a JSON object naming
#: at least one key (`{}` would match every job).
ARGS_FILTER: dict[str, Any] = {
    "allOf": [{"$ref": "#/components/schemas/JsonObject"}],
    "minProperties": 1,
}
#: The list of jobs, whose query may hold `args` (as JSON).
JOBS_PATH = "/api/v1/jobs"


def install_openapi(app: FastAPI, *, secured: bool, registry: TaskRegistry) -> None:
    """Serve the exact schema from `app`, built once, on first use (tasks registered by then
    have their args in it)."""

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
            _args_filters(schema)
            _task_args(schema, registry)
            _link_job_id(schema)
            _link_process(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override


def _task_args(schema: dict[str, Any], registry: TaskRegistry) -> None:
    """The trigger's `args` follow the model of each task of `registry` that has one."""
    schemas = schema["components"]["schemas"]
    trigger = schemas["TriggerRequest"]
    conditions = []
    for name in sorted(registry):
        pipeline = registry.get(name)
        if pipeline is None or pipeline.args_model is None:
            continue
        model = pipeline.args_model.model_json_schema(ref_template=_REF_TEMPLATE)
        schemas.update(model.pop("$defs", {}))
        conditions.append(
            {
                "if": {"properties": {"task": {"const": name}}, "required": ["task"]},
                # args default to {}, which a model with required fields refuses
                "then": {"properties": {"args": model}, "required": ["args"]}
                if model.get("required")
                else {"properties": {"args": model}},
            }
        )
    if conditions:
        trigger["allOf"] = conditions


_REF_TEMPLATE = "#/components/schemas/{model}"


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
    # a durable process's task args, and its start's metadata: a JSON object, or null
    for request, name in PROCESS_OBJECTS:
        field = schemas[request]["properties"][name]
        schemas[request]["properties"][name] = {
            "anyOf": [{"$ref": "#/components/schemas/JsonObject"}, {"type": "null"}],
            "description": field.get("description", "A JSON object."),
        }


def _args_filters(schema: dict[str, Any]) -> None:
    """The `args` a list of jobs (a query parameter, sent as JSON) and a bulk change (a body's
    member) filter by: a JSON object naming at least one key."""
    bulk = schema["components"]["schemas"]["JobBulkRequest"]["properties"]
    bulk["args"] = {
        "anyOf": [ARGS_FILTER, {"type": "null"}],
        "description": bulk["args"].get("description", "What the jobs' args contain."),
    }
    for parameter in schema["paths"][JOBS_PATH]["get"]["parameters"]:
        if parameter["name"] == "args":
            parameter.pop("schema")
            parameter["content"] = {"application/json": {"schema": ARGS_FILTER}}


def _link_process(schema: dict[str, Any]) -> None:
    """Links from a process's start to the operations on it, and on the init task."""
    start = schema["paths"][PROCESS_PATH]["post"]
    process = {
        "namespace": "$request.path.namespace",
        "process_id": "$request.path.process_id",
    }
    links: dict[str, Any] = {
        name: {"operationId": operation_id, "parameters": process}
        for name, operation_id in PROCESS_LINKS.items()
    }
    links["GetProcessTaskResponse"] = {
        "operationId": "get_process_task_response",
        "parameters": {"task_id": "$response.body#/task_id"},
    }
    start["responses"]["200"]["links"] = links


def _link_job_id(schema: dict[str, Any]) -> None:
    """Links from a trigger's answer to the operations on its job, and to its queue."""
    links = {}
    for name, (path, method) in JOB_PATHS.items():
        operation = schema["paths"][path][method]
        links[name] = {
            "operationId": operation["operationId"],
            "parameters": {"job_id": "$response.body#/job_id"},
        }
    links["GetQueue"] = {
        "operationId": "get_queue",
        "parameters": {"queue": "$request.body#/queue"},
    }
    schema["paths"][TRIGGER_PATH]["post"]["responses"]["200"]["links"] = links
