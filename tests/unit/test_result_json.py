"""Unit tests of `dataloader.core.limits.result_json`: a task's result as storable JSON text."""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from pydantic import BaseModel

from dataloader.core.limits import result_json

LIMIT = 10_000


class Summary(BaseModel):
    rows: int
    day: date


@dataclass
class Point:
    x: int
    y: int


def test_none_is_no_result() -> None:
    assert result_json(None, LIMIT) is None


def test_plain_json_values_are_their_json_text() -> None:
    assert result_json({"rows": 3, "ok": True, "tags": ["a"]}, LIMIT) == (
        '{"rows": 3, "ok": true, "tags": ["a"]}'
    )
    assert result_json(0, LIMIT) == "0"
    assert result_json("", LIMIT) == '""'
    assert result_json([], LIMIT) == "[]"


def test_a_pydantic_model_is_its_json_object() -> None:
    text = result_json(Summary(rows=5, day=date(2024, 1, 2)), LIMIT)
    assert text is not None
    assert json.loads(text) == {"rows": 5, "day": "2024-01-02"}


def test_a_dataclass_is_its_json_object() -> None:
    assert result_json(Point(1, 2), LIMIT) == '{"x": 1, "y": 2}'


def test_datetimes_uuids_and_decimals_are_rendered_as_pydantic_renders_them() -> None:
    job_id = uuid.UUID("12345678-1234-5678-1234-567812345678")
    text = result_json(
        {"at": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), "id": job_id, "n": Decimal("1.5")},
        LIMIT,
    )
    assert text is not None
    assert json.loads(text) == {
        "at": "2024-01-02T03:04:05Z",
        "id": "12345678-1234-5678-1234-567812345678",
        "n": "1.5",
    }


def test_non_ascii_text_is_kept_as_it_is() -> None:
    assert result_json({"город": "Москва"}, LIMIT) == '{"город": "Москва"}'


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, {"x": [math.nan]}])
def test_nan_and_infinity_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"^the result holds NaN or Infinity, which JSON cannot$"):
        result_json(value, LIMIT)


def test_a_nul_character_is_refused() -> None:
    with pytest.raises(ValueError, match="holds a NUL character, which PostgreSQL cannot store"):
        result_json({"name": "a\x00b"}, LIMIT)


def test_a_nul_in_a_key_is_refused() -> None:
    with pytest.raises(ValueError, match="holds a NUL character"):
        result_json({"a\x00": 1}, LIMIT)


def test_an_escaped_backslash_before_u0000_is_no_nul() -> None:
    assert result_json("\\u0000", LIMIT) == '"\\\\u0000"'


def test_an_unpaired_surrogate_is_refused() -> None:
    with pytest.raises(ValueError, match=r"holds unpaired surrogates \(\\ud800-\\udfff\)"):
        result_json({"s": "x\udc80"}, LIMIT)


def test_a_value_that_is_not_json_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^the result is not JSON: "):
        result_json(object(), LIMIT)


def test_a_circular_value_is_refused_as_not_json() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match=r"^the result is not JSON: .*[Cc]ircular"):
        result_json(loop, LIMIT)


def test_bytes_that_are_not_utf8_are_refused_as_not_json() -> None:
    with pytest.raises(ValueError, match=r"^the result is not JSON: "):
        result_json({"raw": b"\xff"}, LIMIT)


def test_a_value_nested_too_deep_is_refused_as_not_json() -> None:
    deep: list[object] = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ValueError, match=r"^the result is not JSON: "):
        result_json(deep, 10**9)


def test_a_result_of_exactly_the_limit_is_accepted() -> None:
    text = result_json("x" * 98, 100)  # 98 characters and two quotes
    assert text is not None
    assert len(text.encode()) == 100


def test_a_result_over_the_limit_is_refused_with_its_size() -> None:
    with pytest.raises(
        ValueError,
        match=r"^the result is 101 bytes of JSON, more than DL_MAX_RESULT_BYTES \(100\)$",
    ):
        result_json("x" * 99, 100)


def test_the_limit_counts_utf8_bytes_not_characters() -> None:
    # 40 Cyrillic letters are 42 characters of JSON but 82 bytes of UTF-8
    value = "я" * 40
    assert result_json(value, 82) is not None
    with pytest.raises(ValueError, match="is 82 bytes of JSON"):
        result_json(value, 81)


def test_a_four_byte_character_counts_four_bytes() -> None:
    with pytest.raises(ValueError, match="is 6 bytes of JSON"):
        result_json("🙂", 5)


@pytest.mark.parametrize(
    ("value", "limit", "start"),
    [
        (object(), LIMIT, "the checkpoint is not JSON"),
        (math.nan, LIMIT, "the checkpoint holds NaN"),
        ("\x00", LIMIT, "the checkpoint holds a NUL"),
        ("\ud800", LIMIT, "the checkpoint holds unpaired surrogates"),
        ("long", 3, "the checkpoint is 6 bytes"),
    ],
)
def test_every_message_names_what_is_checked(value: object, limit: int, start: str) -> None:
    with pytest.raises(ValueError, match=rf"^{start}"):
        result_json(value, limit, what="the checkpoint")
