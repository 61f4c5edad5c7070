"""Unit tests of `dataloader.logger`: JSON lines, context, masking, configuration."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import logging.config
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from dataloader.logger import (
    LOGGING_CONFIG,
    UVICORN_LOGGERS,
    JsonFormatter,
    LogLine,
    StderrHandler,
    bind_request,
    build_uvicorn_log_config,
    configure_logging,
    current_context,
    get_logger,
    log_context,
    mask_dsn,
    mask_mapping,
    mask_text,
    request_id_var,
)

SECRET = "s3cr3t-Pa55"
TS_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put back the root and uvicorn loggers as they were (handlers, level, propagation)."""
    names = ["", *UVICORN_LOGGERS]
    saved = [
        (logging.getLogger(n), logging.getLogger(n).handlers[:], logging.getLogger(n).level)
        for n in names
    ]
    propagate = {n: logging.getLogger(n).propagate for n in UVICORN_LOGGERS}
    yield
    for logger, handlers, level in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)
    for n, value in propagate.items():
        logging.getLogger(n).propagate = value


@pytest.fixture
def capture(request: pytest.FixtureRequest) -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A private logger writing JSON lines into a StringIO (not through root)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(f"test_logger.{request.node.name}")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, stream
    logger.handlers.clear()


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    """Every line of the output parsed as JSON (fails if any line is not a JSON object)."""
    out = stream.getvalue()
    assert out.endswith("\n")
    parsed = [json.loads(line) for line in out.splitlines()]
    assert all(isinstance(p, dict) for p in parsed)
    return parsed


# --- line shape -------------------------------------------------------------------------------


def test_one_json_object_per_line_with_fields(
    capture: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = capture
    logger.info("first %s", "line")
    logger.warning("second\nwith a newline and ünïcode")

    first, second = lines(stream)
    assert TS_RE.match(first["ts"])
    assert first["level"] == "INFO"
    assert first["logger"] == logger.name
    assert first["message"] == "first line"
    assert second["level"] == "WARNING"
    assert second["message"] == "second\nwith a newline and ünïcode"
    assert "ünïcode" in stream.getvalue()  # ensure_ascii=False
    for line in (first, second):
        assert not {"request_id", "job_id", "queue", "task", "exc"} & line.keys()
        parsed = LogLine.model_validate(line)
        assert parsed.extra == {}


def test_logline_round_trip_flattens_extra() -> None:
    raw = {
        "ts": "2025-01-31T12:00:00.123Z",
        "level": "INFO",
        "logger": "x",
        "message": "m",
        "job_id": "7",
        "rows": 3,
    }
    line = LogLine.model_validate(raw)
    assert line.job_id == "7"
    assert line.extra == {"rows": 3}
    assert line.model_dump() == raw
    assert json.loads(line.model_dump_json()) == raw


# --- context ----------------------------------------------------------------------------------


def test_context_fields_bound_then_gone(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = capture
    with log_context(request_id="r-1", job_id="j-1", queue="q", task="load.x"):
        assert current_context() == {
            "request_id": "r-1",
            "job_id": "j-1",
            "queue": "q",
            "task": "load.x",
        }
        logger.info("inside")
        with log_context(job_id=None, queue="other"):
            logger.info("nested")
        logger.info("inside again")
    logger.info("outside")

    inside, nested, again, outside = lines(stream)
    assert {k: inside[k] for k in ("request_id", "job_id", "queue", "task")} == {
        "request_id": "r-1",
        "job_id": "j-1",
        "queue": "q",
        "task": "load.x",
    }
    assert "job_id" not in nested
    assert nested["queue"] == "other"
    assert again["job_id"] == "j-1"
    assert again["queue"] == "q"
    assert not {"request_id", "job_id", "queue", "task"} & outside.keys()
    assert current_context() == {}


def test_log_context_rejects_unknown_field() -> None:
    with pytest.raises(TypeError, match="jobid"), log_context(jobid="1"):
        pass
    assert current_context() == {}


def test_log_context_resets_on_exception() -> None:
    with pytest.raises(RuntimeError), log_context(job_id="j"):
        raise RuntimeError
    assert current_context() == {}


def test_bind_request_token_resets() -> None:
    token = bind_request("r-9")
    try:
        assert current_context() == {"request_id": "r-9"}
    finally:
        request_id_var.reset(token)
    assert current_context() == {}


async def test_context_not_shared_between_asyncio_tasks(
    capture: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = capture
    started = asyncio.Event()
    bound = asyncio.Event()
    release = asyncio.Event()

    async def other() -> dict[str, str]:
        # started before `binder` binds anything; must not see its job id
        started.set()
        await bound.wait()
        logger.info("other")
        release.set()
        return current_context()

    async def binder() -> dict[str, str]:
        with log_context(job_id="job-A", queue="qa"):
            bound.set()
            await release.wait()
            logger.info("binder")
            return current_context()

    other_task = asyncio.create_task(other())
    await started.wait()
    binder_ctx, other_ctx = await asyncio.gather(binder(), other_task)

    assert binder_ctx == {"job_id": "job-A", "queue": "qa"}
    assert other_ctx == {}
    by_message = {line["message"]: line for line in lines(stream)}
    assert by_message["binder"]["job_id"] == "job-A"
    assert "job_id" not in by_message["other"]
    assert current_context() == {}


# --- extras -----------------------------------------------------------------------------------


def test_extra_fields_included(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = capture
    with log_context(queue="ctx-queue"):
        logger.info(
            "extras",
            extra={
                "rows": 3,
                "tables": ["a", "b"],
                "job_id": 42,  # context fields are always strings
                "queue": "explicit",  # the call site wins over the context
                "ts": "not the timestamp",  # cannot override a formatter field
                "obj": object(),  # not JSON serialisable: str() of it
            },
        )
    (line,) = lines(stream)
    assert line["rows"] == 3
    assert line["tables"] == ["a", "b"]
    assert line["job_id"] == "42"
    assert line["queue"] == "explicit"
    assert TS_RE.match(line["ts"])
    assert line["extra_ts"] == "not the timestamp"
    assert line["obj"].startswith("<object object")
    parsed = LogLine.model_validate(line)
    assert parsed.job_id == "42"
    assert parsed.extra["rows"] == 3


# --- masking ----------------------------------------------------------------------------------


def test_dsn_password_in_message_is_masked(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = capture
    logger.info("connecting to postgresql://loader:%s@db:5432/dl", SECRET)
    logger.info("dsn %s", f"postgresql+asyncpg://loader:{SECRET}@db/dl?sslmode=require")
    logger.info("kv dsn host=db user=loader password=%s dbname=dl", SECRET)
    logger.info("header Authorization: Bearer %s", SECRET)
    logger.info("settings %r", {"db_dsn": f"postgresql://u:{SECRET}@h/d"})

    out = stream.getvalue()
    assert SECRET not in out
    messages = [line["message"] for line in lines(stream)]
    assert messages[0] == "connecting to postgresql://loader:***@db:5432/dl"
    assert messages[1] == "dsn postgresql+asyncpg://loader:***@db/dl?sslmode=require"
    assert messages[2] == "kv dsn host=db user=loader password=*** dbname=dl"
    assert messages[3] == "header Authorization: Bearer ***"


def test_secret_keys_in_extra_are_masked(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = capture
    logger.info(
        "extras with secrets",
        extra={
            "password": SECRET,
            "api_key": SECRET,
            "headers": {"Authorization": f"Bearer {SECRET}", "X-Auth-Token": SECRET},
            "db_dsn": f"postgresql://loader:{SECRET}@db/dl",
            "notes": [f"token={SECRET}", "plain"],
            "user": "loader",
        },
    )
    assert SECRET not in stream.getvalue()
    (line,) = lines(stream)
    assert line["password"] == "***"
    assert line["api_key"] == "***"
    assert line["headers"] == {"Authorization": "***", "X-Auth-Token": "***"}
    assert line["db_dsn"] == "postgresql://loader:***@db/dl"
    assert line["notes"] == ["token=***", "plain"]
    assert line["user"] == "loader"


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        ("postgresql://user:secret@host/db", "postgresql://user:***@host/db"),
        ("postgresql+asyncpg://u:secret@h:5432/db", "postgresql+asyncpg://u:***@h:5432/db"),
        ("postgres://u:p@ss@h/db", "postgres://u:***@h/db"),
        ("postgresql://user@host/db", "postgresql://user@host/db"),
        ("postgresql://host:5432/db", "postgresql://host:5432/db"),
        ("postgresql:///db?host=/run/pg", "postgresql:///db?host=/run/pg"),
        ("postgresql://u@h/db?password=secret&x=1", "postgresql://u@h/db?password=***&x=1"),
        ("host=h user=u password=secret dbname=d", "host=h user=u password=*** dbname=d"),
        ("host=h password = 'my secret' dbname=d", "host=h password = '***' dbname=d"),
        ("host=h user=u dbname=d", "host=h user=u dbname=d"),
    ],
)
def test_mask_dsn(dsn: str, masked: str) -> None:
    assert mask_dsn(dsn) == masked


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("failed: postgresql://a:b@h/d, retrying", "failed: postgresql://a:***@h/d, retrying"),
        ("Authorization: Bearer abc.DEF-123==", "Authorization: Bearer ***"),
        ("{'password': 'x', 'user': 'u'}", "{'password': '***', 'user': 'u'}"),
        ('{"client_secret": "x"}', '{"client_secret": "***"}'),
        ("GET /cb?token=abc&state=1", "GET /cb?token=***&state=1"),
        ("DRIVER=x;UID=u;PWD=abc;", "DRIVER=x;UID=u;PWD=***;"),
        ("the password is wrong", "the password is wrong"),
        ("nothing to hide", "nothing to hide"),
        ("-H 'authorization: token abc123'", "-H 'authorization: token ***'"),
    ],
)
def test_mask_text(text: str, masked: str) -> None:
    assert mask_text(text) == masked


@pytest.mark.parametrize(
    "text",
    [
        "DL_API_TOKENS: not valid JSON (Expecting value at position 0)",
        "DL_API_TOKENS: two tokens have the same name",
        "token: not set",
        "password: must not be empty",
        "DL_API_TOKENS (item 0.token): Field required",
        "Bearer tokens of the API",
        "Authorization: missing",
    ],
)
def test_mask_text_leaves_the_words_of_a_sentence_that_names_a_secret(text: str) -> None:
    assert mask_text(text) == text


def test_mask_text_is_fast_on_large_input() -> None:
    # pathological shapes for naive patterns; each must finish (timeout guards the suite)
    for text in ("a.b-" * 50_000, "x" * 200_000 + "password=", "a:" * 100_000):
        assert mask_text(text) == text
    assert mask_text("p://:" + "@" * 200_000) == "p://:***@"


def test_mask_mapping_copies_and_masks() -> None:
    original: dict[str, Any] = {
        "Password": "x",
        "token": None,
        "dsn": "postgresql://u:p@h/d",
        "nested": ({"apikey": 1},),
        "count": 5,
    }
    masked = mask_mapping(original)
    assert masked == {
        "Password": "***",
        "token": None,
        "dsn": "postgresql://u:***@h/d",
        "nested": ({"apikey": "***"},),
        "count": 5,
    }
    assert original["Password"] == "x"


# --- exceptions and robustness ----------------------------------------------------------------


def test_exception_text_in_exc(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = capture
    try:
        raise ValueError(f"cannot connect to postgresql://u:{SECRET}@h/d")
    except ValueError:
        logger.exception("load failed")
    logger.error("no exception here", exc_info=True)  # outside an except block

    assert SECRET not in stream.getvalue()
    failed, plain = lines(stream)
    assert failed["level"] == "ERROR"
    assert failed["message"] == "load failed"
    assert failed["exc"].startswith("Traceback (most recent call last):")
    assert "ValueError: cannot connect to postgresql://u:***@h/d" in failed["exc"]
    assert LogLine.model_validate(failed).exc == failed["exc"]
    assert "exc" not in plain


def test_bad_format_arguments_still_give_json() -> None:
    # formatted directly: a handler would see the error too, and pytest's capture handler
    # (attached to every logger) re-raises it
    record = logging.LogRecord(
        "x", logging.INFO, __file__, 1, "rows %d token=%s", ("not-a-number", SECRET), None
    )
    out = JsonFormatter().format(record)
    assert SECRET not in out
    line = json.loads(out)
    assert line["format_error"].startswith("TypeError")
    assert line["message"] == "rows %d token=***"  # the (masked) template, no arguments


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.usefixtures("restore_logging")
def test_configure_logging_twice_installs_one_handler(capsys: pytest.CaptureFixture[str]) -> None:
    logging.getLogger("uvicorn.access").addHandler(logging.NullHandler())
    root = logging.getLogger()
    before = len(root.handlers)

    configure_logging("debug")
    configure_logging("INFO")

    ours = [h for h in root.handlers if isinstance(h, StderrHandler)]
    assert len(ours) == 1
    assert len(root.handlers) == before + 1
    assert root.level == logging.INFO
    for name in UVICORN_LOGGERS:
        assert logging.getLogger(name).handlers == []
        assert logging.getLogger(name).propagate is True

    capsys.readouterr()
    get_logger("dataloader.test").info("via root", extra={"rows": 1})
    get_logger("dataloader.test").debug("below the level")
    logging.getLogger("uvicorn.error").info("uvicorn via root")
    err = capsys.readouterr().err
    parsed = [json.loads(line) for line in err.splitlines()]
    assert [p["message"] for p in parsed] == ["via root", "uvicorn via root"]
    assert parsed[0]["rows"] == 1
    assert parsed[1]["logger"] == "uvicorn.error"


@pytest.mark.usefixtures("restore_logging")
def test_uvicorn_log_config_gives_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_uvicorn_log_config("info") == LOGGING_CONFIG
    logging.config.dictConfig(build_uvicorn_log_config("INFO"))

    capsys.readouterr()
    # the call uvicorn's httptools/h11 protocols make for each request
    logging.getLogger("uvicorn.access").info(
        '%s - "%s %s HTTP/%s" %d',
        "127.0.0.1:50000",
        "GET",
        f"/api/v1/jobs?token={SECRET}",
        "1.1",
        200,
    )
    logging.getLogger("uvicorn.error").info(
        "Started server process [%d]", 1, extra={"color_message": "\x1b[1mStarted\x1b[0m"}
    )
    captured = capsys.readouterr()
    assert SECRET not in captured.err
    access, started = (json.loads(line) for line in captured.err.splitlines())
    assert access["logger"] == "uvicorn.access"
    assert access["level"] == "INFO"
    assert access["message"] == '127.0.0.1:50000 - "GET /api/v1/jobs?token=*** HTTP/1.1" 200'
    assert access["method"] == "GET"
    assert access["status_code"] == 200
    assert access["path"] == "/api/v1/jobs?token=***"
    assert started["logger"] == "uvicorn.error"
    assert started["message"] == "Started server process [1]"
    assert "color_message" not in started
    assert captured.out == ""


def test_importing_the_package_configures_nothing() -> None:
    code = (
        "import logging, dataloader, dataloader.logger\n"
        "assert logging.getLogger().handlers == [], logging.getLogger().handlers\n"
        "assert logging.getLogger().level == logging.WARNING\n"
        "assert logging.getLogger('uvicorn').handlers == []\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_lone_surrogate_is_escaped_so_the_line_can_be_written() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "half an emoji \ud83d", None, None)
    line = JsonFormatter().format(record)
    line.encode("utf-8")  # would raise UnicodeEncodeError on the raw surrogate
    assert "\\ud83d" in line


def test_the_driver_s_background_reconnects_are_one_line_each(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """While the database is away, asyncpg's pool tries to reconnect in the background and
    warns with a traceback at every try: after configure_logging it is one line, naming the
    error, whatever its driver's text."""
    configure_logging("INFO")
    configure_logging("INFO")  # idempotent: one filter, not two
    pool_logger = logging.getLogger("asyncpg.pool")
    try:
        raise ConnectionRefusedError(111, "Connect call failed\n('127.0.0.1', 5432)")
    except ConnectionRefusedError:
        pool_logger.warning("Failed to restore the pool connection floor; retrying", exc_info=True)
    (line,) = [json.loads(text) for text in capsys.readouterr().err.splitlines()]
    assert line["message"] == (
        "Failed to restore the pool connection floor; retrying: ConnectionRefusedError:"
        " [Errno 111] Connect call failed ('127.0.0.1', 5432)"
    )
    assert "Traceback" not in json.dumps(line)
    assert len(pool_logger.filters) == 1
