"""DL_CONTRACT_FILE: the API refuses triggers that break the contract (422), and writes
nothing for them, whatever tasks the API process itself imports."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import asyncpg
import pytest

from dataloader.api import create_app
from dataloader.config import Settings
from dataloader.contract import ContractError

from .conftest import StartService

CONTRACT = """
version: 1
queues:
  emails:
    tasks:
      emails.send:
        args:
          to: string
          user_id: int64
          tags: "[]string?"
          lang: {type: string, default: en}
"""


@pytest.fixture
def contract_file(tmp_path: Path) -> Path:
    path = tmp_path / "contract.yaml"
    path.write_text(CONTRACT)
    return path


async def test_triggers_are_checked_against_the_contract(
    start_service: StartService, contract_file: Path, conn: asyncpg.Connection
) -> None:
    service = await start_service(run_workers=False, contract_file=contract_file)
    body = {"queue": "emails", "task": "emails.send", "lock_key": "u-1"}
    good = await service.client.post(
        "/api/v1/jobs/trigger", json=body | {"args": {"to": "a@b.c", "user_id": 7}}
    )
    assert good.status_code == 200, good.text

    wrong_type = await service.client.post(
        "/api/v1/jobs/trigger", json=body | {"args": {"to": "a@b.c", "user_id": "7"}}
    )
    assert wrong_type.status_code == 422
    (problem,) = wrong_type.json()["detail"]
    assert problem["loc"] == ["body", "args"]
    assert "args.user_id" in problem["msg"]
    assert "the contract of 'emails.send'" in problem["msg"]

    missing = await service.client.post(
        "/api/v1/jobs/trigger", json=body | {"args": {"to": "a@b.c"}}
    )
    assert missing.status_code == 422

    null_for_a_default = await service.client.post(
        "/api/v1/jobs/trigger",
        json=body | {"args": {"to": "a@b.c", "user_id": 7, "tags": None, "lang": None}},
    )
    assert null_for_a_default.status_code == 422  # optional is not nullable
    assert "args.lang" in null_for_a_default.json()["detail"][0]["msg"]

    wrong_queue = await service.client.post(
        "/api/v1/jobs/trigger",
        json=body | {"queue": "other", "args": {"to": "a@b.c", "user_id": 7}},
    )
    assert wrong_queue.status_code == 422
    assert wrong_queue.json()["detail"][0]["loc"] == ["body", "queue"]

    undeclared = await service.client.post(
        "/api/v1/jobs/trigger",
        json={"queue": "misc", "task": "misc.ping", "lock_key": "p", "args": {"any": 1}},
    )
    assert undeclared.status_code == 200  # a contract may cover some of the tasks
    assert await conn.fetchval("SELECT count(*) FROM dl_jobs") == 2  # the refused wrote nothing


def test_a_contract_file_that_cannot_be_read_stops_the_start(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nqueues: {q: {tasks: {t: {args: {a: long}}}}}\n")
    for path, message in [(bad, "unknown type 'long'"), (tmp_path / "none.yaml", "cannot read")]:
        with pytest.raises(ContractError, match=message):
            create_app(make_settings(contract_file=path))
