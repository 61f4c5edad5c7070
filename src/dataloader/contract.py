"""Contract files: a YAML file that declares queues, their tasks, each task's options and the
fields of its args, which producers and workers agree on (an OpenAPI for queues).

    version: 1
    queues:
      emails:
        tasks:
          emails.send:
            options: {max_attempts: 5, timeout_sec: 30}
            args:
              to: string
              user_id: int64
              body: bytes          # base64 in JSON
              tags: "[]string"
              urgent: bool?        # `?`: null accepted, and null when left out
              lang: {type: string, default: en}   # may be left out (then "en"), never null
    tasks:                         # tasks bound to no queue (the trigger names one)
      demo.noop: {}

Field types: `int`, `int64`, `float`, `string`, `bool`, `bytes`, and lists of them written
`[]int`. A field is required and never null unless it says otherwise: a trailing `?` accepts
null, and a field so typed may be left out (it is then null: the code's `T | None = None`); a
field with a default (`{type: T, default: V}`, the code's `T = V`) may be left out, the worker
then taking V, and accepts null only if T ends in `?`. Optional is not nullable: a producer
that sends null for `{type: string, default: en}` is refused. A field whose type the contract
cannot state is written as its JSON Schema (`{json_schema: {...}}`, with `optional: true` and
its `default` when it may be left out).

* `export_contract(registry)`: the contract of the tasks a process registers;
* `check_contract(contract, registry)`: what the code breaks of a contract (a CI gate: a
  producer that follows the contract must still be served);
* `generate_code(contract)`: pydantic models of each task's args and handler stubs;
* `ContractGuard`: checks triggers against a contract (the service's `DL_CONTRACT_FILE`).
"""

from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    Base64Bytes,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    create_model,
)

from dataloader.exceptions import InvalidJob, InvalidJobArgs
from dataloader.tasks import TaskRegistry, describe
from dataloader.workers.pipelines.contracts import task_spec

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]

#: Contract type → (Python type, its text in generated code).
SCALARS: dict[str, tuple[Any, str]] = {
    "int": (int, "int"),
    "int64": (Int64, "Int64"),
    "float": (float, "float"),
    "string": (str, "str"),
    "bool": (bool, "bool"),
    "bytes": (Base64Bytes, "Base64Bytes"),
}
_FIELD_TYPE = re.compile(r"^(?P<list>\[\])?(?P<scalar>[a-z0-9]+)(?P<optional>\?)?$")
#: The options a contract may fix, as `task_spec` names them.
OPTIONS = ("priority", "max_attempts", "lease_ttl_sec", "timeout_sec", "batch_size")
#: Options how workers run a task, which no producer can notice: a change is a note.
WORKER_OPTIONS = frozenset({"batch_size"})
#: Their names as `@dataloader.task` takes them, where they differ.
DECORATOR_NAMES = {"lease_ttl_sec": "lease_ttl", "timeout_sec": "timeout"}


class ContractError(ValueError):
    """A contract file that cannot be read: one line saying where and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskOptions(_Strict):
    priority: int | None = None
    max_attempts: int | None = None
    lease_ttl_sec: int | None = None
    timeout_sec: float | None = None
    batch_size: int | None = None


class DefaultedField(_Strict):
    """A field a producer may leave out, the worker then taking `default`:
    `{type: string, default: readings}`. It accepts null only if `type` ends in `?`."""

    type: str
    default: Any


class RawField(_Strict):
    """A field the contract types cannot state, kept as its JSON Schema (which says whether
    null is accepted). `optional`: a producer may leave it out, the worker then taking
    `default`."""

    json_schema: dict[str, Any]
    optional: bool = False
    default: Any = None


#: A field as a contract writes it: a type (`string`, `string?`), or one of the mappings.
FieldKind = str | DefaultedField | RawField


@dataclass(frozen=True, slots=True)
class FieldRule:
    """What a field asks of a producer, whichever form the contract writes it in."""

    #: Its type without `?`, or its JSON Schema.
    base: str | dict[str, Any]
    #: Whether null is accepted (a JSON Schema says so itself: False for one).
    nullable: bool
    #: Whether a producer may leave it out.
    optional: bool
    #: What the worker takes when it is left out.
    default: Any


def field_rule(kind: FieldKind) -> FieldRule:
    """The rule of a field, whatever its form."""
    if isinstance(kind, RawField):
        return FieldRule(kind.json_schema, False, kind.optional, kind.default)
    if isinstance(kind, DefaultedField):
        return FieldRule(kind.type.rstrip("?"), kind.type.endswith("?"), True, kind.default)
    nullable = kind.endswith("?")
    return FieldRule(kind.rstrip("?"), nullable, nullable, None)


class TaskContract(_Strict):
    options: TaskOptions = Field(default_factory=TaskOptions)
    args: dict[str, FieldKind] = Field(default_factory=dict)


class QueueContract(_Strict):
    tasks: dict[str, TaskContract] = Field(default_factory=dict)


class Contract(_Strict):
    version: Literal[1] = 1
    queues: dict[str, QueueContract] = Field(default_factory=dict)
    #: Tasks bound to no queue: the trigger names one.
    tasks: dict[str, TaskContract] = Field(default_factory=dict)

    def all_tasks(self) -> dict[str, tuple[str | None, TaskContract]]:
        """Task name → (its queue or None, its contract)."""
        found: dict[str, tuple[str | None, TaskContract]] = {
            name: (None, spec) for name, spec in self.tasks.items()
        }
        for queue, declared in self.queues.items():
            for name, spec in declared.tasks.items():
                found[name] = (queue, spec)
        return found


# --- reading and writing ----------------------------------------------------------------------


def load_contract(text: str) -> Contract:
    """Parse a contract file's text; ContractError naming the first problem."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ContractError(f"not YAML: {exc}".splitlines()[0]) from None
    try:
        contract = Contract.model_validate(data or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the file"
        raise ContractError(f"{where}: {first['msg']}") from None
    for name, (_, spec) in contract.all_tasks().items():
        for field, kind in spec.args.items():
            problem = _field_problem(kind)
            if problem is not None:
                raise ContractError(f"task {name}, field {field}: {problem}")
    return contract


def _field_problem(kind: FieldKind) -> str | None:
    """Why a field of a contract cannot be: a type it does not know, a default its type
    refuses; None when it can."""
    if isinstance(kind, RawField):
        return None
    typed = kind if isinstance(kind, str) else kind.type
    parsed = _parse_type(typed)
    if parsed is None:
        return (
            f"unknown type {typed!r} (one of {', '.join(SCALARS)}, `[]` before one for a"
            " list, `?` after to accept null)"
        )
    if isinstance(kind, DefaultedField):
        python = parsed[0] | None if parsed[2] else parsed[0]
        try:
            TypeAdapter(python).validate_json(json.dumps(kind.default), strict=True)
        except ValidationError:
            return f"default {kind.default!r} is no {typed}"
    return None


def load_contract_file(path: Path) -> Contract:
    """Read and parse a contract file; ContractError (one line) if it cannot be."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ContractError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ContractError(f"{path}: not UTF-8 text") from None
    try:
        return load_contract(text)
    except ContractError as exc:
        raise ContractError(f"{path}: {exc}") from None


def dump_contract(contract: Contract) -> str:
    """The contract as YAML, keys in the order of the model, options left unset omitted."""
    data = {"version": 1} | contract.model_dump(mode="json", exclude_defaults=True)
    text: str = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return text


# --- from code --------------------------------------------------------------------------------


def export_contract(registry: TaskRegistry) -> Contract:
    """The contract of every task `registry` holds, as the code defines it now."""
    contract = Contract()
    for name in registry:
        task = registry.get(name)
        if task is None:
            continue
        spec = task_spec(task)
        declared = TaskContract(
            options=TaskOptions(**{option: spec[option] for option in OPTIONS}),
            args=_fields_of(spec["args_schema"]),
        )
        if task.queue is None:
            contract.tasks[name] = declared
        else:
            contract.queues.setdefault(task.queue, QueueContract()).tasks[name] = declared
    return contract


def _fields_of(schema: dict[str, Any]) -> dict[str, FieldKind]:
    """A JSON Schema object's properties as contract fields. A field may be left out when its
    schema states the default the worker takes; one whose default a factory makes (which no
    schema states) is written required: a producer that sends it is always served."""
    fields: dict[str, FieldKind] = {}
    for field, prop in schema.get("properties", {}).items():
        optional = "default" in prop
        default = prop.get("default")
        nullable = {"type": "null"} in prop.get("anyOf", [])
        kind = _type_of(_without_null(prop))
        if kind is None or (nullable and not optional):  # no type says "required, or null"
            fields[field] = RawField(
                json_schema=_bare(prop, schema), optional=optional, default=default
            )
        elif optional and (default is not None or not nullable):
            fields[field] = DefaultedField(type=kind + ("?" if nullable else ""), default=default)
        else:  # required and never null, or null when left out
            fields[field] = kind + ("?" if nullable else "")
    return fields


def _without_null(prop: dict[str, Any]) -> dict[str, Any]:
    """`T | None` as `T`."""
    options = [p for p in prop.get("anyOf", []) if p != {"type": "null"}]
    return options[0] if "anyOf" in prop and len(options) == 1 else prop


def _type_of(prop: dict[str, Any]) -> str | None:
    """A property's contract type, or None when it has none."""
    kind = prop.get("type")
    if kind == "array":
        item = _type_of(prop.get("items", {}))
        return None if item is None or item.startswith("[]") else "[]" + item
    if kind == "integer":
        bounded = prop.get("minimum") == INT64_MIN and prop.get("maximum") == INT64_MAX
        return "int64" if bounded else "int" if "minimum" not in prop else None
    if kind == "string":
        return {"": "string", "base64": "bytes"}.get(prop.get("format", ""))
    return {"number": "float", "boolean": "bool"}.get(str(kind))


def _bare(prop: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """A property's JSON Schema without its title and default (the field holds that), with
    the definitions it refers to."""
    bare = {k: v for k, v in prop.items() if k not in ("title", "default")}
    if "$defs" in schema and "$ref" in repr(bare):
        bare["$defs"] = schema["$defs"]
    return bare


# --- checking code against a contract ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Finding:
    """One difference between the code and a contract."""

    task: str
    message: str
    #: Whether a producer that follows the contract may fail (else: an addition).
    breaking: bool

    def __str__(self) -> str:
        return f"{'BREAKING' if self.breaking else 'note'}: {self.task}: {self.message}"


def check_contract(contract: Contract, registry: TaskRegistry) -> list[Finding]:
    """What the code (`registry`) changes of `contract`. Breaking: a task gone or moved to
    another queue, an option changed, a field gone, retyped, made required, refusing the null
    the contract accepts or taking another default, a required field added. Notes: tasks and
    optional fields the contract does not have yet."""
    code = export_contract(registry).all_tasks()
    findings = []
    for name, (queue, declared) in contract.all_tasks().items():
        if name not in code:
            findings.append(Finding(name, "in the contract, not registered", True))
            continue
        code_queue, defined = code[name]
        if code_queue != queue:
            findings.append(Finding(name, f"queue {code_queue!r}, contract {queue!r}", True))
        for option in OPTIONS:
            wanted, got = getattr(declared.options, option), getattr(defined.options, option)
            if wanted != got:
                message = f"{option} {got!r}, contract {wanted!r}"
                findings.append(Finding(name, message, option not in WORKER_OPTIONS))
        findings += _field_findings(name, declared.args, defined.args)
    findings += [
        Finding(name, "registered, not in the contract", False)
        for name in code
        if name not in contract.all_tasks()
    ]
    return findings


def _field_findings(
    task: str, declared: dict[str, FieldKind], defined: dict[str, FieldKind]
) -> list[Finding]:
    findings = []
    for field, kind in declared.items():
        if field not in defined:
            findings.append(Finding(task, f"field {field}: in the contract, not in the code", True))
            continue
        broken = _broken(field_rule(kind), field_rule(defined[field]))
        if broken is not None:
            findings.append(Finding(task, f"field {field}: {broken}", True))
    for field, kind in defined.items():
        if field not in declared:
            required = not field_rule(kind).optional
            what = "required" if required else "optional"
            findings.append(Finding(task, f"field {field}: {what}, not in the contract", required))
    return findings


def _broken(declared: FieldRule, defined: FieldRule) -> str | None:
    """How the code's field fails a producer that follows the contract's, or None."""
    if defined.base != declared.base:
        return f"{_shown(defined.base)}, contract {_shown(declared.base)}"
    if declared.optional and not defined.optional:
        return "required, contract optional"
    if declared.nullable and not defined.nullable:
        return "null refused, contract accepts null"
    if declared.optional and defined.default != declared.default:
        return f"default {defined.default!r}, contract {declared.default!r}"
    return None


def _shown(base: str | dict[str, Any]) -> str:
    return "a JSON Schema" if isinstance(base, dict) else base


# --- models and code --------------------------------------------------------------------------


def _parse_type(kind: str) -> tuple[Any, str, bool] | None:
    """A contract type → (Python type, its text in code, whether `?` accepts null), None when
    unknown."""
    match = _FIELD_TYPE.match(kind)
    if match is None or match["scalar"] not in SCALARS:
        return None
    python, text = SCALARS[match["scalar"]]
    if match["list"]:
        python, text = list[python], f"list[{text}]"  # type: ignore[valid-type]
    return python, text, bool(match["optional"])


def args_model(task: str, spec: TaskContract) -> type[BaseModel]:
    """The task's args as a pydantic model (fields the contract cannot type take any JSON).
    Each field is known by its name in JSON, whatever it is (`user-id`, `_x`)."""
    fields: dict[str, Any] = {}
    for i, (field, kind) in enumerate(spec.args.items()):
        rule = field_rule(kind)
        parsed = _parse_type(rule.base) if isinstance(rule.base, str) else None
        python = Any if parsed is None else parsed[0]
        if rule.nullable:
            python = python | None
        default = rule.default if rule.optional else ...
        fields[f"field_{i}"] = (python, Field(default, alias=field))
    model: type[BaseModel] = create_model(_class_name(task) + "Args", **fields)
    return model


class ContractGuard:
    """Checks triggers against a contract: a task it declares must be sent to its queue, with
    args that satisfy its fields (as JSON, strictly: `"5"` is no int). Tasks it does not
    declare pass: a contract may cover some of a service's tasks."""

    def __init__(self, contract: Contract) -> None:
        self._tasks = {
            name: (queue, args_model(name, spec))
            for name, (queue, spec) in contract.all_tasks().items()
        }

    def check(self, task: str, queue: str | None, args: dict[str, Any]) -> None:
        """InvalidJob (the queue) or InvalidJobArgs (the args) when the trigger breaks it."""
        declared = self._tasks.get(task)
        if declared is None:
            return
        contract_queue, model = declared
        if contract_queue is not None and queue != contract_queue:
            raise InvalidJob("queue", f"task {task!r} runs on queue {contract_queue!r}")
        try:
            model.model_validate_json(json.dumps(args), strict=True)
        except ValidationError as exc:
            raise InvalidJobArgs(f"{describe(exc)} (the contract of {task!r})") from None


def generate_code(contract: Contract) -> str:
    """A Python module: a pydantic model of each task's args and a handler stub registered
    with the contract's queue and options, to fill in."""
    lines = [
        '"""Tasks of a dataloader contract: fill in each handler. Generated by'
        ' `dataloader contract generate`."""',
        "",
        "from typing import Annotated, Any",
        "",
        "from pydantic import Base64Bytes, BaseModel, Field",
        "",
        "import dataloader",
        "",
        "Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]",
    ]
    for name, (queue, spec) in sorted(contract.all_tasks().items()):
        model = _class_name(name) + "Args"
        lines += ["", "", f"class {model}(BaseModel):"]
        lines += [f"    {_field_line(field, kind)}" for field, kind in spec.args.items()] or [
            "    pass"
        ]
        options = {"queue": queue} if queue is not None else {}
        options |= {DECORATOR_NAMES.get(k, k): v for k, v in declared_options(spec).items()}
        shown = "".join(f", {k}={_literal(v)}" for k, v in options.items())
        lines += [
            "",
            "",
            f"@dataloader.task({_literal(name)}, args={model}{shown})",
            f"async def {_identifier(name)}(batch: dataloader.Batch[{model}]) -> None:"
            if spec.options.batch_size is not None
            else f"async def {_identifier(name)}(ctx: dataloader.JobContext[{model}]) -> Any:",
            f'    raise NotImplementedError("task {name}")',
        ]
    return "\n".join(lines) + "\n"


def declared_options(spec: TaskContract) -> dict[str, Any]:
    """The options the contract fixes for a task."""
    return spec.options.model_dump(exclude_none=True)


def _field_line(field: str, kind: FieldKind) -> str:
    rule = field_rule(kind)
    parsed = _parse_type(rule.base) if isinstance(rule.base, str) else None
    name = field if field.isidentifier() and not keyword.iskeyword(field) else None
    annotation = "Any" if parsed is None else parsed[1] + (" | None" if rule.nullable else "")
    default = f" = {_literal(rule.default)}" if rule.optional else ""
    if name is None:  # a JSON key that is no Python name: an alias
        alias = f"Field({default.removeprefix(' = ') or '...'}, alias={_literal(field)})"
        return f"{_identifier(field)}: {annotation} = {alias}"
    return f"{name}: {annotation}{default}"


def _literal(value: object) -> str:
    """A Python literal of a contract value (strings double-quoted, as formatters write)."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _class_name(task: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", task) if part) or "Task"


def _identifier(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", text).strip("_").lower() or "field"
    return f"_{name}" if name[0].isdigit() or keyword.iskeyword(name) else name
