"""The shape of one JSON log line.

`JsonFormatter` builds plain dicts for speed; this model documents that shape and parses lines
back (tests, log tooling). Keys other than the named fields are extra attributes of the logging
call; they sit at the top level of the JSON and are gathered into `extra` when parsed.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)


class LogLine(BaseModel):
    """One structured log line as written to stderr."""

    ts: str = Field(description="ISO-8601 UTC time with milliseconds, 2025-01-31T12:00:00.123Z.")
    level: str = Field(description="Level name: DEBUG, INFO, WARNING, ERROR or CRITICAL.")
    logger: str = Field(description="Name of the logger that emitted the record.")
    message: str = Field(description="The formatted message, secrets masked.")
    request_id: str | None = None
    job_id: str | None = None
    queue: str | None = None
    task: str | None = None
    exc: str | None = Field(default=None, description="Formatted traceback, secrets masked.")
    extra: dict[str, Any] = Field(
        default_factory=dict, description="Other attributes; top-level keys in the JSON form."
    )

    @model_validator(mode="before")
    @classmethod
    def _gather_extra(cls, data: Any) -> Any:
        # A parsed line has its extras at the top level; fold them back into `extra`.
        if not isinstance(data, dict):
            return data
        known = set(cls.model_fields) - {"extra"}
        gathered: dict[str, Any] = {}
        nested = data.get("extra")
        if isinstance(nested, dict):
            gathered.update(nested)
        elif "extra" in data:
            gathered["extra"] = nested
        gathered.update({k: v for k, v in data.items() if k not in known and k != "extra"})
        return {**{k: v for k, v in data.items() if k in known}, "extra": gathered}

    @model_serializer(mode="wrap")
    def _flatten(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The JSON form has no `extra` key and no null context fields: extras are merged into
        # the top level, never overriding a named field.
        data: dict[str, Any] = handler(self)
        extra = data.pop("extra", None) or {}
        out = {k: v for k, v in data.items() if v is not None}
        out.update({k: v for k, v in extra.items() if k not in out and k not in data})
        return out
