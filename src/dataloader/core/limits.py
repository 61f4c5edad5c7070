"""What a job may carry: the bounds and checks shared by the HTTP request schema and the
library's `NewJob`, so that both refuse the same input with the same words. No I/O.

Text is bounded so that PostgreSQL can always store and index it. Its limits are in bytes
(a btree entry holds at most ~2,700 bytes; a NOTIFY payload, which carries the queue name,
8,000), while a JSON Schema can only count characters. A character takes at most 4 bytes of
UTF-8, so each field's limit is stated in characters as its byte budget / 4: the OpenAPI schema
then says exactly what is accepted, and no accepted text, whatever its script, exceeds the
budget. Text must also be storable at all: no NUL (PostgreSQL text cannot hold it) and no
unpaired UTF-16 surrogate (JSON can spell one, UTF-8 cannot encode it).

Every check raises `ValueError` with a message that names the limit, not the field: pydantic
adds the field's location, `NewJob` its name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

#: The most bytes one character takes in UTF-8.
UTF8_MAX_BYTES_PER_CHAR: Final = 4

#: Byte budget of a name (queue, task, producer, consumer_group): the claim indexes hold the
#: queue beside a few fixed-size columns, and the NOTIFY that wakes workers (8,000 bytes at
#: most) carries it.
NAME_MAX_BYTES: Final = 800
#: Byte budget of an idempotency_key: its unique index holds the text itself, and a btree entry
#: holds at most ~2,700 bytes (with its headers).
IDEMPOTENCY_KEY_MAX_BYTES: Final = 2400
#: Byte budget of a lock_key or partition_key: no index holds their text (the lock_key and
#: partition_key indexes hold their hashtext), so only sanity bounds them.
KEY_MAX_BYTES: Final = 4000

NAME_MAX_CHARS: Final = NAME_MAX_BYTES // UTF8_MAX_BYTES_PER_CHAR  # 200
IDEMPOTENCY_KEY_MAX_CHARS: Final = IDEMPOTENCY_KEY_MAX_BYTES // UTF8_MAX_BYTES_PER_CHAR  # 600
KEY_MAX_CHARS: Final = KEY_MAX_BYTES // UTF8_MAX_BYTES_PER_CHAR  # 1000

#: int columns of the spec's DDL are 32-bit.
INT32_MAX: Final = 2_147_483_647
PRIORITY_MIN, PRIORITY_MAX = 0, INT32_MAX
#: bigint columns (event ids, process cursors) are 64-bit.
BIGINT_MAX: Final = 2**63 - 1
MAX_ATTEMPTS_MIN, MAX_ATTEMPTS_MAX = 1, 1000
LEASE_TTL_MIN, LEASE_TTL_MAX = 1, INT32_MAX
#: Largest batch a batch handler may take: a claim locks every job of it, and one statement
#: writes their outcomes.
BATCH_SIZE_MAX: Final = 1000
#: Deepest nesting accepted in `args` (PostgreSQL's jsonb accepts more; nobody needs it).
ARGS_MAX_DEPTH: Final = 64
#: Arrays held directly by arrays in `args`, at most (an object between them starts the count
#: again): a JSON Schema can only spell arrays of arrays out level by level for client
#: generators (see `api.openapi`). GeoJSON's deepest coordinates need 4.
ARGS_MAX_ARRAY_NESTING: Final = 6

#: Byte budget of the JSON object a list of jobs searches args by (containment): the index
#: holds hashes of args' paths, so this bounds only the work of one search.
ARGS_FILTER_MAX_BYTES: Final = 8000

#: JSON Schema spelling of "no NUL character" (the surrogate rule cannot be spelt in one).
NO_NUL_PATTERN: Final = "^[^\\u0000]*$"

_SURROGATE = re.compile("[\ud800-\udfff]")
#: A JSON `\u0000` escape (NUL), not an escaped backslash followed by "u0000".
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def check_text(value: object, max_chars: int, *, allow_empty: bool = False) -> str:
    """`value` if it is storable text of 1 (or 0) to `max_chars` characters."""
    if not isinstance(value, str):
        raise ValueError(f"must be a string, not {type(value).__name__}")
    if not value and not allow_empty:
        raise ValueError("must not be empty")
    if len(value) > max_chars:
        raise ValueError(
            f"must be at most {max_chars} characters"
            f" ({max_chars * UTF8_MAX_BYTES_PER_CHAR} bytes of UTF-8), not {len(value)}"
        )
    _storable(value)
    return value


def check_storable(value: str) -> str:
    """Text PostgreSQL can store (no NUL, no unpaired surrogate), whatever its length;
    ValueError otherwise."""
    _storable(value)
    return value


def _storable(value: str) -> None:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    if not value.isascii() and _SURROGATE.search(value):  # ASCII has no surrogates (fast path)
        raise ValueError("must not contain unpaired surrogates (\\ud800-\\udfff)")


def check_name(value: object) -> str:
    """A queue, task, producer or consumer_group name."""
    return check_text(value, NAME_MAX_CHARS)


def check_key(value: object) -> str:
    """A lock_key."""
    return check_text(value, KEY_MAX_CHARS)


def check_idempotency_key(value: object) -> str:
    """An idempotency_key."""
    return check_text(value, IDEMPOTENCY_KEY_MAX_CHARS)


def check_partition_key(value: object) -> str:
    """A partition_key ('' is the spec's default)."""
    return check_text(value, KEY_MAX_CHARS, allow_empty=True)


def check_int(value: object, low: int, high: int) -> int:
    """`value` if it is an int (not a bool) in [low, high]."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"must be between {low} and {high}, not {value}")
    return value


def check_priority(value: object) -> int:
    return check_int(value, PRIORITY_MIN, PRIORITY_MAX)


def check_max_attempts(value: object) -> int:
    return check_int(value, MAX_ATTEMPTS_MIN, MAX_ATTEMPTS_MAX)


def check_lease_ttl(value: object) -> int:
    return check_int(value, LEASE_TTL_MIN, LEASE_TTL_MAX)


_INFINITE_INSTANTS: Final = (datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC))


def check_batch_size(value: object) -> int:
    """Jobs one call of a batch handler takes: 1 (one job per call) to BATCH_SIZE_MAX."""
    return check_int(value, 1, BATCH_SIZE_MAX)


def check_instant(value: object) -> datetime:
    """An aware datetime that has a UTC equivalent (9999-12-31T23:59:59-14:00 has none) and is
    not one of the two extremes the database driver writes as PostgreSQL's `infinity` and
    `-infinity`, which no clock ever reaches or leaves behind."""
    if not isinstance(value, datetime):
        raise ValueError(f"must be a datetime, not {type(value).__name__}")
    if value.utcoffset() is None:
        raise ValueError("must have a time zone offset")
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        raise ValueError("out of range once converted to UTC") from None
    if utc in _INFINITE_INSTANTS:
        raise ValueError("must be a finite instant, not the first or last one a datetime holds")
    return value


def args_json(args: object) -> str:
    """`args` as the JSON text stored in jsonb, if jsonb can store it: an object, no NUL in any
    string, no NaN/Infinity, at most ARGS_MAX_DEPTH levels deep, arrays directly in arrays at
    most ARGS_MAX_ARRAY_NESTING levels deep."""
    if not isinstance(args, dict):
        raise ValueError(f"must be a JSON object (a dict), not {type(args).__name__}")
    try:
        text = json.dumps(args, ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise ValueError("NaN and Infinity are not valid JSON numbers") from None
    except (TypeError, RecursionError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise ValueError("must not contain NUL characters")
    if not text.isascii() and _SURROGATE.search(text):
        raise ValueError("must not contain unpaired surrogates (\\ud800-\\udfff)")
    # Only text with enough brackets can be that deep: the walk is skipped for everyday args.
    arrays = text.count("[")
    if arrays > ARGS_MAX_ARRAY_NESTING or text.count("{") + arrays > ARGS_MAX_DEPTH:
        depth, array_run = _depth(args)
        if depth > ARGS_MAX_DEPTH:
            raise ValueError(f"nested deeper than {ARGS_MAX_DEPTH} levels")
        if array_run > ARGS_MAX_ARRAY_NESTING:
            raise ValueError(
                f"holds arrays in arrays more than {ARGS_MAX_ARRAY_NESTING} levels deep"
                " (put an object between them)"
            )
    return text


def check_args(args: object) -> dict[str, Any]:
    """`args` if `args_json` accepts it."""
    args_json(args)
    assert isinstance(args, dict)  # args_json refuses anything else
    return args


def check_args_filter(value: object) -> dict[str, Any]:
    """What a list of jobs searches args by: a JSON object `args_json` accepts, naming at
    least one key (`{}` is in every job's args: it would search nothing), at most
    ARGS_FILTER_MAX_BYTES of JSON; given as text (a query parameter), it is parsed first."""
    given = value if isinstance(value, str) else args_json(value)
    if len(given.encode()) > ARGS_FILTER_MAX_BYTES:
        raise ValueError(f"must be at most {ARGS_FILTER_MAX_BYTES} bytes of JSON")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc.msg} at position {exc.pos})") from None
        except RecursionError:
            raise ValueError(f"nested deeper than {ARGS_MAX_DEPTH} levels") from None
        args_json(value)
    if not value:
        raise ValueError('must name at least one key, e.g. {"day": "2026-01-01"}')
    assert isinstance(value, dict)  # args_json refuses anything else
    return value


def _depth(value: object) -> tuple[int, int]:
    """Nesting depth of containers in `value` (a scalar is 0), and the longest run of arrays
    directly in arrays; iteratively: a Python recursion would give up on what the limits are
    there to refuse."""
    deepest = longest_run = 0
    stack: list[tuple[object, int, int]] = [(value, 0, 0)]
    while stack:
        item, depth, run = stack.pop()
        if isinstance(item, dict):
            children: list[object] = list(item.values())
            run = 0
        elif isinstance(item, list):
            children = item
            run += 1
        else:
            continue
        deepest = max(deepest, depth + 1)
        longest_run = max(longest_run, run)
        if deepest > ARGS_MAX_DEPTH:
            break
        stack.extend((child, depth + 1, run) for child in children)
    return deepest, longest_run


#: The check of each `NewJob` field that has one (None is "not given" for the optional ones).
JOB_FIELD_CHECKS: Final[dict[str, Callable[[object], object]]] = {
    "queue": check_name,
    "task": check_name,
    "lock_key": check_key,
    "args": args_json,
    "idempotency_key": check_idempotency_key,
    "partition_key": check_partition_key,
    "priority": check_priority,
    "available_at": check_instant,
    "max_attempts": check_max_attempts,
    "lease_ttl_sec": check_lease_ttl,
    "producer": check_name,
    "consumer_group": check_name,
}

#: Fields of `NewJob` that may be None (not given: a default fills them).
OPTIONAL_JOB_FIELDS: Final = frozenset(
    {
        "queue",
        "lock_key",
        "idempotency_key",
        "priority",
        "available_at",
        "max_attempts",
        "lease_ttl_sec",
        "producer",
        "consumer_group",
    }
)


def result_json(value: object, max_bytes: int, what: str = "the result") -> str | None:
    """A task's return value (or checkpoint: `what`) as the JSON text stored in jsonb (None
    for None): pydantic models, dataclasses, datetimes, UUIDs … as pydantic renders them in
    JSON; refused with a ValueError naming the problem when it is not JSON, holds NUL, or
    exceeds `max_bytes`."""
    if value is None:
        return None
    from pydantic_core import PydanticSerializationError, to_jsonable_python

    # Two steps, so that each failure is named for what it is: pydantic refuses what has no
    # JSON form (an unknown type, a cycle, bytes that are not UTF-8, too deep a nesting, a
    # dict key that cannot be a string) with an error of its own, and json.dumps then refuses
    # only NaN and Infinity.
    try:
        plain = to_jsonable_python(value)
    except (PydanticSerializationError, ValueError, TypeError, RecursionError) as exc:
        raise ValueError(f"{what} is not JSON: {exc}") from None
    try:
        text = json.dumps(plain, ensure_ascii=False, allow_nan=False)
    except ValueError:  # the only one left: a float JSON cannot spell
        raise ValueError(f"{what} holds NaN or Infinity, which JSON cannot") from None
    except RecursionError:
        raise ValueError(f"{what} is not JSON: nested too deeply") from None
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise ValueError(f"{what} holds a NUL character, which PostgreSQL cannot store")
    if not text.isascii() and _SURROGATE.search(text):
        raise ValueError(f"{what} holds unpaired surrogates (\\ud800-\\udfff)")
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise ValueError(
            f"{what} is {size} bytes of JSON, more than DL_MAX_RESULT_BYTES ({max_bytes})"
        )
    return text
