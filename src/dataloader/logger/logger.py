"""JSON log lines on stderr, one object per line, secrets masked.

Only the service calls `configure_logging`; importing `dataloader` never touches logging
configuration, so an application embedding the library keeps its own.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from dataloader.logger.context_vars import CONTEXT_FIELDS, current_context
from dataloader.logger.utils import mask_mapping, mask_text

#: Loggers uvicorn installs handlers on; routed to the root handler by `configure_logging`.
UVICORN_LOGGERS: tuple[str, ...] = ("uvicorn", "uvicorn.error", "uvicorn.access")

# Attributes every LogRecord has; anything else on a record came from `extra={...}`.
# `color_message` is uvicorn's ANSI-coloured duplicate of the message, noise in JSON.
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
}

# Top-level keys owned by the formatter; an extra with one of these names is renamed.
_RESERVED_KEYS = frozenset({"ts", "level", "logger", "message", "exc", "stack", "extra"})


def _json_default(obj: object) -> str:
    # str() of an arbitrary object (settings, exceptions, connections) may embed a DSN.
    return mask_text(str(obj))


def _utc_timestamp(created: float) -> str:
    ts = datetime.fromtimestamp(created, tz=UTC).isoformat(timespec="milliseconds")
    return ts.replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON object: ts, level, logger, message, context, extras, exc.

    Message, extras and traceback are masked (`dataloader.logger.utils`), so a DSN password or
    token logged by mistake never reaches the output.
    """

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as a single-line JSON object."""
        try:
            return self._format(record)
        except Exception as exc:
            # Never let a formatting error propagate: `Handler.handleError` would print the
            # raw, unmasked message and arguments to stderr.
            return self._fallback(record, exc)

    def _format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _utc_timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": mask_text(record.getMessage()),
        }
        line.update(current_context())
        line.update(self._extras(record))
        # cached on the record like logging.Formatter does: several handlers may format it
        if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exc"] = mask_text(record.exc_text)
        if record.stack_info:
            line["stack"] = mask_text(self.formatStack(record.stack_info))
        text = json.dumps(line, ensure_ascii=False, default=_json_default)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (e.g. half an emoji in an error message)
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        return text

    def _extras(self, record: logging.LogRecord) -> dict[str, Any]:
        extras: dict[str, Any] = {}
        if record.name == "uvicorn.access" and isinstance(record.args, tuple):
            extras.update(_access_fields(record.args))
        for key, value in record.__dict__.items():
            if key in _RECORD_ATTRS or key.startswith("_"):
                continue
            if key in _RESERVED_KEYS:
                key = f"extra_{key}"
            elif key in CONTEXT_FIELDS and value is not None:
                # context fields are strings in every line, whoever supplied them
                value = str(value)
            extras[key] = value
        masked: dict[str, Any] = mask_mapping(extras)
        return masked

    def _fallback(self, record: logging.LogRecord, error: Exception) -> str:
        # The template only: with the arguments unmerged, nothing tells which of them is a
        # secret (`"token=%s"` masks after merging, not before), so none are written.
        try:
            raw = str(record.msg)
        except Exception:
            raw = "<unprintable message>"
        line = {
            "ts": _utc_timestamp(record.created),
            "level": str(record.levelname),
            "logger": str(record.name),
            "message": mask_text(raw),
            "format_error": mask_text(f"{type(error).__name__}: {error}"),
        }
        return json.dumps(line, ensure_ascii=False)


def _access_fields(args: tuple[object, ...]) -> dict[str, Any]:
    # uvicorn's access record: (client_addr, method, path, http_version, status_code); keeping
    # them as fields lets log tooling filter on status without parsing the message.
    if len(args) != 5:
        return {}
    client_addr, method, path, http_version, status_code = args
    return {
        "client_addr": client_addr,
        "method": method,
        "path": path,
        "http_version": http_version,
        "status_code": status_code,
    }


class StderrHandler(logging.StreamHandler[TextIO]):
    """A StreamHandler writing to whatever `sys.stderr` is at emit time.

    Looked up on each write rather than bound at creation, so a handler installed early keeps
    working when stderr is replaced later (test capture, daemonisation).
    """

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> TextIO:
        """The current `sys.stderr`."""
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        # StreamHandler.__init__/setStream assign the stream; ours is always sys.stderr.
        pass


class OneLineReconnects(logging.Filter):
    """asyncpg's pool reconnecting in the background while the database is away (a restart, a
    failover) logs a warning with a traceback at every try: one line is what an operator
    needs, the error's type and message, as our own connection warnings say it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            message = " ".join(str(error).split())
            record.msg = f"{record.getMessage()}: {type(error).__name__}: {message}"
            record.args = None
            record.exc_info = record.exc_text = None
        return True


#: The driver's logger whose background reconnects `OneLineReconnects` shortens.
ASYNCPG_POOL_LOGGER = "asyncpg.pool"


def configure_logging(level: str = "INFO") -> None:
    """Install one JSON stderr handler on the root logger and set its level.

    Idempotent: a second call reuses the handler (only the level changes). Handlers installed
    by others are left alone. uvicorn's loggers lose their own handlers and propagate to root,
    so its lines come out in the same format.
    """
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, StderrHandler)), None)
    if handler is None:
        handler = StderrHandler()
        root.addHandler(handler)
    handler.setFormatter(JsonFormatter())
    root.setLevel(level.upper())
    pool_logger = logging.getLogger(ASYNCPG_POOL_LOGGER)
    if not any(isinstance(f, OneLineReconnects) for f in pool_logger.filters):
        pool_logger.addFilter(OneLineReconnects())
    for name in UVICORN_LOGGERS:
        uv_logger = logging.getLogger(name)
        for uv_handler in list(uv_logger.handlers):
            uv_logger.removeHandler(uv_handler)
        uv_logger.setLevel(logging.NOTSET)
        uv_logger.propagate = True


def get_logger(name: str) -> logging.Logger:
    """Return the standard logger `name` (use `__name__`)."""
    return logging.getLogger(name)
