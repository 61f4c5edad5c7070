"""Input bounds (dataloader.core.limits), the same for HTTP and the library: every text field at
its longest accepted length in incompressible 4-byte characters is stored and readable; one
character (4 bytes) more is a 422 / InvalidJob, and nothing is written. Never a 5xx."""

from __future__ import annotations

import random
import uuid
from typing import Any

import asyncpg
import pytest

from dataloader import NewJob
from dataloader.core import limits
from dataloader.exceptions import InvalidJob
from dataloader.storage.repositories import enqueue, enqueue_many

from ..conftest import StartService
from .constants import TRIGGER_URL, VALID_TRIGGER
from .test_service import count_rows, error_locs

#: Each text field of a trigger and its longest accepted length in characters.
TEXT_FIELDS = {
    "queue": limits.NAME_MAX_CHARS,
    "task": limits.NAME_MAX_CHARS,
    "producer": limits.NAME_MAX_CHARS,
    "consumer_group": limits.NAME_MAX_CHARS,
    "lock_key": limits.KEY_MAX_CHARS,
    "idempotency_key": limits.IDEMPOTENCY_KEY_MAX_CHARS,
    "partition_key": limits.KEY_MAX_CHARS,
}


def four_byte_text(chars: int, seed: int) -> str:
    """`chars` random characters of 4 bytes each in UTF-8 (planes 1-16): text that no
    compression makes smaller, unlike a repeated character."""
    rng = random.Random(seed)
    return "".join(chr(rng.randrange(0x10000, 0x110000)) for _ in range(chars))


def longest(field: str, extra: int = 0) -> str:
    return four_byte_text(TEXT_FIELDS[field] + extra, seed=len(field))


@pytest.mark.parametrize("field", sorted(TEXT_FIELDS))
async def test_the_longest_text_in_4_byte_characters_is_stored_and_readable(
    start_service: StartService, conn: asyncpg.Connection, field: str
) -> None:
    api = await start_service(run_workers=False)
    value = longest(field)
    assert len(value.encode()) == TEXT_FIELDS[field] * 4  # the field's whole byte budget
    response = await api.client.post(TRIGGER_URL, json=VALID_TRIGGER | {field: value})
    assert response.status_code == 200, response.text
    job_id = response.json()["job_id"]
    assert (await api.status(job_id))["job_id"] == job_id
    stored = await conn.fetchval(
        f"SELECT {field} FROM dl_jobs WHERE job_id = $1", uuid.UUID(job_id)
    )
    assert stored == value


@pytest.mark.parametrize("field", sorted(TEXT_FIELDS))
async def test_one_character_beyond_the_longest_is_422_and_writes_nothing(
    start_service: StartService, conn: asyncpg.Connection, field: str
) -> None:
    api = await start_service(run_workers=False)
    response = await api.client.post(TRIGGER_URL, json=VALID_TRIGGER | {field: longest(field, 1)})
    assert response.status_code == 422, response.text
    assert ("body", field) in error_locs(response.json())
    assert f"at most {TEXT_FIELDS[field]} characters" in response.text
    assert await count_rows(conn, "dl_jobs") == 0
    assert await count_rows(conn, "dl_job_events") == 0


async def test_an_idempotency_key_beyond_the_btree_limit_is_422_not_500(
    start_service: StartService, conn: asyncpg.Connection
) -> None:
    """1,000 characters of 4 bytes: 4,000 bytes, more than a btree entry may hold."""
    api = await start_service(run_workers=False)
    body = VALID_TRIGGER | {"idempotency_key": four_byte_text(1000, seed=1)}
    response = await api.client.post(TRIGGER_URL, json=body)
    assert response.status_code == 422, response.text
    assert await count_rows(conn, "dl_jobs") == 0


def job(**fields: Any) -> NewJob:
    return NewJob(**({"queue": "q", "task": "t", "lock_key": "k", "args": {}} | fields))


@pytest.mark.parametrize("field", sorted(TEXT_FIELDS))
async def test_the_library_accepts_the_same_longest_text(db_dsn: str, field: str) -> None:
    conn = await asyncpg.connect(db_dsn)
    try:
        result = await enqueue(conn, job(**{field: longest(field)}))
        stored = await conn.fetchval(
            f"SELECT {field} FROM dl_jobs WHERE job_id = $1", result.job_id
        )
    finally:
        await conn.close()
    assert stored == longest(field)


@pytest.mark.parametrize("field", sorted(TEXT_FIELDS))
def test_the_library_refuses_one_character_more_naming_the_field(field: str) -> None:
    with pytest.raises(
        InvalidJob, match=f"^{field}: must be at most {TEXT_FIELDS[field]} "
    ) as info:
        job(**{field: longest(field, 1)})
    assert info.value.field == field
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"queue": ""}, "queue", "must not be empty"),
        ({"lock_key": "a\x00b"}, "lock_key", "NUL"),
        ({"task": "half \ud83d"}, "task", "unpaired surrogates"),
        ({"args": {"s": "a\x00b"}}, "args", "NUL"),
        ({"args": {"a\x00": 1}}, "args", "NUL"),
        ({"args": {"x": ["\udfff"]}}, "args", "unpaired surrogates"),
        ({"args": {"x": float("nan")}}, "args", "NaN"),
        ({"args": {"x": {1, 2}}}, "args", "not JSON"),
        ({"args": [1]}, "args", "JSON object"),
        ({"priority": -1}, "priority", "between 0 and 2147483647"),
        ({"priority": True}, "priority", "integer"),
        ({"priority": "5"}, "priority", "integer"),
        ({"max_attempts": 0}, "max_attempts", "between 1 and 1000"),
        ({"lease_ttl_sec": 2**31}, "lease_ttl_sec", "between 1 and 2147483647"),
        ({"producer": 5}, "producer", "must be a string"),
    ],
)
def test_the_library_refuses_what_the_api_refuses(
    fields: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(InvalidJob, match=f"^{field}: .*{words}"):
        job(**fields)


def test_the_library_refuses_args_nested_too_deep() -> None:
    deep: dict[str, Any] = {}
    for _ in range(limits.ARGS_MAX_DEPTH - 1):
        deep = {"a": deep}
    job(args=deep)  # exactly the limit
    with pytest.raises(InvalidJob, match=r"^args: nested deeper than 64 levels"):
        job(args={"a": deep})


def test_arrays_in_arrays_are_refused_past_their_nesting_limit() -> None:
    """The OpenAPI schema spells arrays of arrays out level by level (client generators refuse
    a recursive array), and the service holds to what it spells."""
    nested: Any = 1
    for _ in range(limits.ARGS_MAX_ARRAY_NESTING):
        nested = [0, nested]
    job(args={"a": nested, "b": [{"c": nested}]})  # an object between them starts again
    with pytest.raises(InvalidJob, match=r"^args: holds arrays in arrays more than 6 levels"):
        job(args={"a": [nested]})
    assert job(args={"text": "[" * 20}).args == {"text": "[" * 20}


async def test_the_api_refuses_arrays_nested_past_the_schema(start_service: StartService) -> None:
    service = await start_service(run_workers=False)
    nested: Any = [None]
    for _ in range(limits.ARGS_MAX_ARRAY_NESTING):
        nested = [nested]
    body = {"queue": "q", "task": "demo.noop", "lock_key": "k", "args": {"a": nested}}
    response = await service.client.post("/api/v1/jobs/trigger", json=body)
    assert response.status_code == 422
    assert "arrays in arrays" in response.text
    body["args"] = {"a": nested[0]}
    assert (await service.client.post("/api/v1/jobs/trigger", json=body)).status_code == 200


def test_an_escaped_backslash_before_u0000_is_not_a_nul() -> None:
    assert job(args={"path": "C:\\u0000"}).args_json == '{"path": "C:\\\\u0000"}'


async def test_a_batch_with_one_bad_job_is_refused_before_anything_is_written(db_dsn: str) -> None:
    conn = await asyncpg.connect(db_dsn)
    try:
        with pytest.raises(InvalidJob, match=r"^lock_key"):
            await enqueue_many(conn, [job(lock_key="a"), job(lock_key=longest("lock_key", 1))])
        assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 0
    finally:
        await conn.close()
