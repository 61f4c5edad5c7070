"""URLs and payloads shared by the API v1 tests."""

from __future__ import annotations

from typing import Any

TRIGGER_URL = "/api/v1/jobs/trigger"
HEALTH_URL = "/health"
STATUS_URL = "/status"


def job_url(job_id: str) -> str:
    return f"/api/v1/jobs/{job_id}"


def status_url(job_id: str) -> str:
    return f"/api/v1/jobs/{job_id}/status"


def cancel_url(job_id: str) -> str:
    return f"/api/v1/jobs/{job_id}/cancel"


#: The fields spec §5 promises in the status (and cancel) answer.
SPEC_STATUS_FIELDS = frozenset(
    {
        "job_id",
        "status",
        "attempt",
        "started_at",
        "finished_at",
        "heartbeat_at",
        "error",
        "progress",
    }
)

#: A minimal valid trigger body; tests override single fields to make it invalid.
VALID_TRIGGER: dict[str, Any] = {"queue": "default", "task": "demo.noop", "lock_key": "k-1"}

#: A long `demo.sleep` that checks for cancellation every 0.1 s.
LONG_SLEEP_ARGS: dict[str, Any] = {"seconds": 30, "chunks": 300}


def nested(depth: int) -> dict[str, Any]:
    """{"a": {"a": … {}}} nested `depth` levels deep."""
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def without(field: str) -> dict[str, Any]:
    """VALID_TRIGGER without `field`."""
    return {k: v for k, v in VALID_TRIGGER.items() if k != field}


def with_(**fields: Any) -> dict[str, Any]:
    """VALID_TRIGGER with `fields` replaced or added."""
    return VALID_TRIGGER | fields


#: (case id, JSON body, the `loc` that the 422 must name). Each must be refused, nothing stored.
INVALID_TRIGGER_BODIES: list[tuple[str, Any, tuple[str | int, ...]]] = [
    ("missing-queue", without("queue"), ("body", "queue")),
    ("missing-task", without("task"), ("body", "task")),
    ("missing-lock_key", without("lock_key"), ("body", "lock_key")),
    ("queue-int", with_(queue=5), ("body", "queue")),
    ("queue-empty", with_(queue=""), ("body", "queue")),
    ("queue-too-long", with_(queue="q" * 201), ("body", "queue")),
    ("lock_key-too-long", with_(lock_key="k" * 1001), ("body", "lock_key")),
    ("queue-nul", with_(queue="q\u0000"), ("body", "queue")),
    ("task-nul", with_(task="t\u0000"), ("body", "task")),
    ("lock_key-empty", with_(lock_key=""), ("body", "lock_key")),
    ("lock_key-nul", with_(lock_key="k\u0000"), ("body", "lock_key")),
    ("args-list", with_(args=[]), ("body", "args")),
    ("args-string", with_(args="x"), ("body", "args")),
    ("args-nul-in-value", with_(args={"s": "a\u0000b"}), ("body", "args")),
    ("args-nul-in-key", with_(args={"a\u0000b": 1}), ("body", "args")),
    ("args-nested-100", with_(args=nested(100)), ("body", "args")),
    ("priority-string", with_(priority="high"), ("body", "priority")),
    ("priority-negative", with_(priority=-1), ("body", "priority")),
    ("priority-above-int32", with_(priority=2**31), ("body", "priority")),
    ("priority-boolean", with_(priority=True), ("body", "priority")),
    ("priority-fraction", with_(priority=1.5), ("body", "priority")),
    ("available_at-a-number", with_(available_at=0), ("body", "available_at")),
    ("priority-numeric-string", with_(priority="5"), ("body", "priority")),
    ("available_at-words", with_(available_at="yesterday"), ("body", "available_at")),
    ("available_at-no-offset", with_(available_at="2026-01-01T00:00:00"), ("body", "available_at")),
    ("available_at-infinity", with_(available_at="infinity"), ("body", "available_at")),
    (
        "available_at-after-year-9999-in-utc",
        with_(available_at="9999-12-31T23:59:59-14:00"),
        ("body", "available_at"),
    ),
    (
        "available_at-the-last-instant",
        with_(available_at="9999-12-31T23:59:59.999999Z"),
        ("body", "available_at"),
    ),
    (
        "available_at-the-first-instant",
        with_(available_at="0001-01-01T00:00:00Z"),
        ("body", "available_at"),
    ),
    (
        "available_at-in-year-1",
        with_(available_at="0001-06-01T00:00:00Z"),
        ("body", "available_at"),
    ),
    (
        "available_at-before-year-1-in-utc",
        with_(available_at="0001-01-01T00:00:00+14:00"),
        ("body", "available_at"),
    ),
    ("idempotency_key-empty", with_(idempotency_key=""), ("body", "idempotency_key")),
    ("partition_key-nul", with_(partition_key="p\u0000"), ("body", "partition_key")),
    ("max_attempts-zero", with_(max_attempts=0), ("body", "max_attempts")),
    ("max_attempts-negative", with_(max_attempts=-1), ("body", "max_attempts")),
    ("lease_ttl_sec-zero", with_(lease_ttl_sec=0), ("body", "lease_ttl_sec")),
    ("lease_ttl_sec-negative", with_(lease_ttl_sec=-60), ("body", "lease_ttl_sec")),
    ("lease_ttl_sec-above-int32", with_(lease_ttl_sec=2**31), ("body", "lease_ttl_sec")),
    (
        "available_at-year-0",
        with_(available_at="0000-01-01T00:00:00+00:00"),
        ("body", "available_at"),
    ),
    ("unknown-field", with_(colour="red"), ("body", "colour")),
    ("array-body", [VALID_TRIGGER], ("body",)),
]

#: (case id, raw body bytes, the `loc` prefix the 422 must name), sent as application/json.
INVALID_RAW_BODIES: list[tuple[str, bytes, tuple[str | int, ...]]] = [
    (
        "args-nan",
        b'{"queue":"q","task":"t","lock_key":"k","args":{"x":NaN}}',
        ("body", "args"),
    ),
    (
        "args-infinity",
        b'{"queue":"q","task":"t","lock_key":"k","args":{"x":1e400}}',
        ("body", "args"),
    ),
    # JSON's "\\ud800" escape decodes to a lone surrogate, which UTF-8 (and PostgreSQL) refuse.
    ("queue-lone-surrogate", b'{"queue":"\\ud800","task":"t","lock_key":"k"}', ("body", "queue")),
    (
        "args-key-lone-surrogate",
        b'{"queue":"q","task":"t","lock_key":"k","args":{"\\ud800":1}}',
        ("body", "args"),
    ),
    (
        "args-value-lone-surrogate",
        b'{"queue":"q","task":"t","lock_key":"k","args":{"x":["\\udfff"]}}',
        ("body", "args"),
    ),
    ("malformed-json", b'{"queue": "q", "task": ', ("body",)),
    ("empty-body", b"", ("body",)),
]

#: Bodies FastAPI cannot even parse (UnicodeDecodeError, RecursionError): a 400, never a 500.
_DEEP = 100_000
UNPARSABLE_RAW_BODIES: list[tuple[str, bytes]] = [
    ("invalid-utf8", b'{"queue":"\xff\xfe","task":"t","lock_key":"k"}'),
    (
        "nested-beyond-parser-limit",
        b'{"queue":"q","task":"t","lock_key":"k","args":{"x":'
        + b"[" * _DEEP
        + b"]" * _DEEP
        + b"}}",
    ),
]
