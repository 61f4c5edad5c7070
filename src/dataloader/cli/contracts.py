"""`dataloader contract export | check FILE | generate FILE`: queue contracts in YAML (queues,
tasks, options, args fields; `dataloader.contract`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dataloader.cli.common import BUILTIN_PIPELINES, fail, import_pipelines, load
from dataloader.contract import (
    Contract,
    ContractError,
    check_contract,
    dump_contract,
    export_contract,
    generate_code,
    load_contract_file,
)
from dataloader.exceptions import ConfigError
from dataloader.tasks import TaskRegistry
from dataloader.tasks import registry as default_registry

contract_app = typer.Typer(
    help="Queue contracts: a YAML file of queues, tasks, options and args fields.",
    no_args_is_help=True,
)
ContractFile = Annotated[Path, typer.Argument(help="The contract file.")]
OutFile = Annotated[Path | None, typer.Option("--out", "-o", help="Write here, not to stdout.")]


@contract_app.command("export")
def contract_export(out: OutFile = None) -> None:
    """Write the contract of the tasks your modules register (DL_PIPELINE_MODULES; the
    built-in demo tasks left out): their queues, options and args fields."""
    _write(dump_contract(export_contract(_user_tasks())), out)


@contract_app.command("check")
def contract_check(file: ContractFile) -> None:
    """Whether the tasks your modules register still honour FILE: exit 0 (additions are
    listed as notes), or 1 with one line per breaking change (a task, field or option that
    producers following FILE rely on, gone or changed). A gate for CI."""
    findings = check_contract(_read_contract(file), _user_tasks())
    for finding in findings:
        typer.echo(str(finding))
    breaking = sum(finding.breaking for finding in findings)
    if breaking:
        fail(f"{file}: {breaking} breaking change(s)", 1)
    typer.echo(f"{file}: honoured ({len(findings)} addition(s))")


@contract_app.command("generate")
def contract_generate(file: ContractFile, out: OutFile = None) -> None:
    """Write a Python module from FILE: a pydantic model of each task's args and a handler
    stub registered with its queue and options."""
    _write(generate_code(_read_contract(file)), out)


def _user_tasks() -> TaskRegistry:
    """The tasks DL_PIPELINE_MODULES registers (not the built-in demo tasks)."""
    settings = load()
    try:
        import_pipelines(settings.pipeline_modules)
    except ConfigError as exc:
        fail(str(exc), 2)
    return default_registry.only(lambda task: task.handler.__module__ not in BUILTIN_PIPELINES)


def _read_contract(file: Path) -> Contract:
    try:
        return load_contract_file(file)
    except ContractError as exc:
        fail(str(exc), 2)


def _write(text: str, out: Path | None) -> None:
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}", 2)
