"""Contract files (dataloader/contract.py): export from code, read back, check, generate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import Base64Bytes, BaseModel

from dataloader import JobContext, TaskRegistry
from dataloader.contract import (
    Contract,
    ContractError,
    Int64,
    args_model,
    check_contract,
    dump_contract,
    export_contract,
    generate_code,
    load_contract,
)


class SendArgs(BaseModel):
    to: str
    user_id: Int64
    attempts: int
    score: float
    urgent: bool
    body: Base64Bytes
    ids: list[Int64]
    tags: list[str] | None = None
    extra: dict[str, Any] | None = None  # no contract type: kept as its JSON Schema


def registry_with(args: type[BaseModel] = SendArgs, **options: Any) -> TaskRegistry:
    registry = TaskRegistry()

    @registry.task("emails.send", queue="emails", args=args, **options)
    async def send(ctx: JobContext[Any]) -> None:
        return None

    @registry.task("misc.ping")
    async def ping(ctx: JobContext[dict[str, Any]]) -> None:
        return None

    return registry


CONTRACT = """
version: 1
queues:
  emails:
    tasks:
      emails.send:
        options: {max_attempts: 5}
        args:
          to: string
          user_id: int64
          attempts: int
          score: float
          urgent: bool
          body: bytes
          ids: "[]int64"
          tags: "[]string?"
          extra:
            json_schema:
              anyOf: [{type: object, additionalProperties: true}, {type: "null"}]
            optional: true
tasks:
  misc.ping: {}
"""


def test_the_export_of_code_reads_back_as_the_same_contract() -> None:
    exported = export_contract(registry_with(max_attempts=5))
    text = dump_contract(exported)
    assert text.startswith("version: 1\n")
    assert load_contract(text) == exported == load_contract(CONTRACT)


def test_code_that_matches_honours_the_contract() -> None:
    assert check_contract(load_contract(CONTRACT), registry_with(max_attempts=5)) == []


class Changed(BaseModel):
    """SendArgs with every kind of breaking change, and one addition."""

    to: int  # retyped
    user_id: Int64
    attempts: int
    score: float
    urgent: bool
    body: Base64Bytes
    ids: list[Int64]
    tags: list[str]  # made required
    # `extra` gone
    region: str  # a required field producers do not send
    note: str | None = None  # optional: an addition


def test_each_breaking_change_is_named_and_additions_are_notes() -> None:
    findings = check_contract(load_contract(CONTRACT), registry_with(Changed, max_attempts=3))
    assert sorted(str(f) for f in findings) == [
        "BREAKING: emails.send: field extra: in the contract, not in the code",
        "BREAKING: emails.send: field region: required, not in the contract",
        "BREAKING: emails.send: field tags: required, contract optional",
        "BREAKING: emails.send: field to: int, contract string",
        "BREAKING: emails.send: max_attempts 3, contract 5",
        "note: emails.send: field note: optional, not in the contract",
    ]


def test_a_task_gone_or_moved_breaks_the_contract_and_a_new_one_is_a_note() -> None:
    registry = TaskRegistry()

    @registry.task("emails.send", queue="mail", args=SendArgs, max_attempts=5)
    async def send(ctx: JobContext[Any]) -> None:
        return None

    @registry.task("misc.new")
    async def new(ctx: JobContext[Any]) -> None:
        return None

    assert sorted(str(f) for f in check_contract(load_contract(CONTRACT), registry)) == [
        "BREAKING: emails.send: queue 'mail', contract 'emails'",
        "BREAKING: misc.ping: in the contract, not registered",
        "note: misc.new: registered, not in the contract",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: 2", "version: Input should be 1"),
        ("queues: {q: {tasks: {t: {args: {a: integer}}}}}", "task t, field a: unknown type"),
        ("queues: {q: {tasks: {t: {retries: 3}}}}", "queues.q.tasks.t.retries: Extra inputs"),
        ("queues: [", "not YAML"),
    ],
)
def test_a_bad_contract_is_one_line_saying_where(text: str, message: str) -> None:
    with pytest.raises(ContractError) as raised:
        load_contract(text)
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def test_generated_code_registers_each_task_with_the_contract_s_models(tmp_path: Path) -> None:
    """The module imports (in a process of its own: it registers its tasks globally), its
    models take what the contract describes, and each stub has the contract's options."""
    (tmp_path / "generated.py").write_text(generate_code(load_contract(CONTRACT)))
    probe = """
import base64, generated, dataloader
sent = generated.EmailsSendArgs.model_validate({
    "to": "a@b.c", "user_id": 2**40, "attempts": 1, "score": 0.5, "urgent": False,
    "body": base64.b64encode(b"hello").decode(), "ids": [1, 2]})
assert sent.body == b"hello" and sent.tags is None
task = dataloader.registry.get("emails.send")
assert (task.queue, task.max_attempts, task.args_model) == ("emails", 5, generated.EmailsSendArgs)
assert dataloader.registry.get("misc.ping").queue is None
"""
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_the_contract_s_args_model_refuses_what_breaks_it() -> None:
    spec = load_contract(CONTRACT).queues["emails"].tasks["emails.send"]
    model = args_model("emails.send", spec)
    with pytest.raises(ValueError, match="user_id"):
        model.model_validate(
            {
                "to": "x",
                "user_id": 2**63,
                "attempts": 1,
                "score": 1.0,
                "urgent": True,
                "body": "",
                "ids": [],
            }
        )
    assert Contract().all_tasks() == {}


def test_fields_are_known_by_their_json_names_whatever_they_are() -> None:
    text = "tasks:\n  t:\n    args:\n      user-id: int\n      _private: string?\n"
    spec = load_contract(text).tasks["t"]
    model = args_model("t", spec)
    model.model_validate({"user-id": 1, "_private": "x"})
    with pytest.raises(ValueError, match="user-id"):
        model.model_validate({"user-id": "one"})
    with pytest.raises(ValueError, match="user-id"):
        model.model_validate({"user_id": 1})


def test_a_batch_size_is_exported_and_a_change_of_it_is_a_note() -> None:
    """How a worker takes the jobs is no producer's concern: never breaking."""
    batched = registry_with(batch_size=50)
    contract = export_contract(batched)
    assert contract.queues["emails"].tasks["emails.send"].options.batch_size == 50
    findings = check_contract(contract, registry_with(batch_size=20))
    assert [str(f) for f in findings] == ["note: emails.send: batch_size 20, contract 50"]


def test_generated_code_of_a_batched_task_takes_a_batch(tmp_path: Path) -> None:
    text = CONTRACT.replace("options: {max_attempts: 5}", "options: {batch_size: 10}")
    (tmp_path / "generated.py").write_text(generate_code(load_contract(text)))
    probe = """
import inspect, generated, dataloader
task = dataloader.registry.get("emails.send")
assert task.batch_size == 10
annotation = inspect.signature(task.handler).parameters["batch"].annotation
assert annotation == dataloader.Batch[generated.EmailsSendArgs], annotation
"""
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


class LoadArgs(BaseModel):
    """Fields that may be left out, each its own way."""

    day: str
    table: str = "readings"  # left out: "readings"; null refused
    limit: int | None = 100  # left out: 100; null accepted
    note: str | None = None  # left out: null
    shards: list[int] = [1]  # a list's default
    since: int | None  # required, null accepted


def load_registry(args: type[BaseModel] = LoadArgs) -> TaskRegistry:
    registry = TaskRegistry()

    @registry.task("etl.load", args=args)
    async def load(ctx: JobContext[Any]) -> None:
        return None

    return registry


def test_a_field_with_a_default_may_be_left_out_and_is_not_nullable() -> None:
    text = dump_contract(export_contract(load_registry()))
    assert (
        load_contract(text).tasks["etl.load"].args
        == load_contract(
            """
tasks:
  etl.load:
    args:
      day: string
      table: {type: string, default: readings}
      limit: {type: "int?", default: 100}
      note: string?
      shards: {type: "[]int", default: [1]}
      since: {json_schema: {anyOf: [{type: integer}, {type: "null"}]}}
"""
        )
        .tasks["etl.load"]
        .args
    )
    model = args_model("etl.load", load_contract(text).tasks["etl.load"])
    left_out = model.model_validate({"day": "d", "since": None})
    assert left_out.model_dump(by_alias=True) == LoadArgs(day="d", since=None).model_dump()
    with pytest.raises(ValueError, match="table"):
        model.model_validate({"day": "d", "since": None, "table": None})
    model.model_validate({"day": "d", "since": None, "limit": None, "note": None})


def test_what_a_producer_makes_with_the_generated_model_is_what_the_worker_takes(
    tmp_path: Path,
) -> None:
    """The stub's model has the worker's defaults: filled by a producer that leaves out what
    it may, its JSON is valid for the worker's own model, defaults included."""
    contract = export_contract(load_registry())
    (tmp_path / "generated.py").write_text(generate_code(contract))
    probe = """
import json, generated
print(json.dumps(generated.EtlLoadArgs(day="d", since=None).model_dump(mode="json")))
"""
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    sent = json.loads(result.stdout)
    assert LoadArgs.model_validate_json(json.dumps(sent), strict=True) == LoadArgs(
        day="d", since=None
    )
    assert sent["table"] == "readings"


class Nullable(BaseModel):
    """LoadArgs as a contract that read defaults as nullable described it."""

    day: str
    table: str | None = None
    limit: int | None = 100
    note: str | None = None
    shards: list[int] = [1]
    since: int | None


def test_code_that_refuses_a_null_or_moves_a_default_breaks_the_contract() -> None:
    contract = export_contract(load_registry(Nullable))
    assert sorted(str(f) for f in check_contract(contract, load_registry())) == [
        "BREAKING: etl.load: field table: null refused, contract accepts null"
    ]

    class Moved(LoadArgs):
        limit: int | None = 10

    assert [
        str(f) for f in check_contract(export_contract(load_registry()), load_registry(Moved))
    ] == ["BREAKING: etl.load: field limit: default 10, contract 100"]


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("{type: long, default: 1}", "task t, field a: unknown type 'long'"),
        ("{type: int, default: seven}", "task t, field a: default 'seven' is no int"),
        ("{type: int, default: null}", "task t, field a: default None is no int"),
    ],
)
def test_a_default_its_type_refuses_is_one_line(field: str, message: str) -> None:
    with pytest.raises(ContractError) as raised:
        load_contract(f"tasks: {{t: {{args: {{a: {field}}}}}}}")
    assert str(raised.value).startswith(message)
