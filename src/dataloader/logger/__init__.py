"""Structured JSON logging: formatter, per-task context and secret masking."""

from dataloader.logger.context_vars import (
    CONTEXT_FIELDS,
    bind_request,
    current_context,
    job_id_var,
    log_context,
    queue_var,
    request_id_var,
    task_var,
)
from dataloader.logger.logger import (
    UVICORN_LOGGERS,
    JsonFormatter,
    StderrHandler,
    configure_logging,
    get_logger,
)
from dataloader.logger.models import LogLine
from dataloader.logger.utils import MASK, is_secret_key, mask_dsn, mask_mapping, mask_text
from dataloader.logger.uvicorn_logging_config import LOGGING_CONFIG, build_uvicorn_log_config

__all__ = [
    "CONTEXT_FIELDS",
    "LOGGING_CONFIG",
    "MASK",
    "UVICORN_LOGGERS",
    "JsonFormatter",
    "LogLine",
    "StderrHandler",
    "bind_request",
    "build_uvicorn_log_config",
    "configure_logging",
    "current_context",
    "get_logger",
    "is_secret_key",
    "job_id_var",
    "log_context",
    "mask_dsn",
    "mask_mapping",
    "mask_text",
    "queue_var",
    "request_id_var",
    "task_var",
]
