"""A logging dictConfig for uvicorn's `log_config=`, so its lines are JSON like ours.

uvicorn applies `log_config` itself (at `uvicorn.Config` creation), which would otherwise
re-install its coloured text formatters on its loggers. Root is not configured here: that is
`configure_logging`'s job, and its level may differ.
"""

from __future__ import annotations

from typing import Any

from dataloader.logger.logger import JsonFormatter, StderrHandler


def _dotted(cls: type) -> str:
    # dictConfig wants import paths; derived from the classes so a rename cannot break them
    return f"{cls.__module__}.{cls.__qualname__}"


def build_uvicorn_log_config(level: str = "INFO") -> dict[str, Any]:
    """Return a dictConfig routing `uvicorn`, `uvicorn.error` and `uvicorn.access` through
    `JsonFormatter` to stderr at `level`."""
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": _dotted(JsonFormatter)}},
        "handlers": {"json_stderr": {"class": _dotted(StderrHandler), "formatter": "json"}},
        "loggers": {
            # same topology as uvicorn's default config: uvicorn.error propagates to uvicorn,
            # and neither uvicorn nor uvicorn.access reaches root (no duplicate lines)
            "uvicorn": {"handlers": ["json_stderr"], "level": level, "propagate": False},
            "uvicorn.error": {"handlers": [], "level": level, "propagate": True},
            "uvicorn.access": {"handlers": ["json_stderr"], "level": level, "propagate": False},
        },
    }


#: The config at INFO, for `uvicorn.run(..., log_config=LOGGING_CONFIG)`.
LOGGING_CONFIG: dict[str, Any] = build_uvicorn_log_config()
