"""`dataloader contract export | check | generate` as a CI job runs them."""

from __future__ import annotations

from pathlib import Path

from .procs import PYTHON_M_DATALOADER, one_line, run_cli

TASKS = """
from pydantic import BaseModel
import dataloader

class SendArgs(BaseModel):
    to: str
    user_id: int
    lang: str = "en"

@dataloader.task("emails.send", queue="emails", args=SendArgs, max_attempts=5)
async def send(ctx: dataloader.JobContext[SendArgs]) -> None:
    return None
"""


def contract(tmp_path: Path, *args: str) -> tuple[int, str]:
    result = run_cli(
        [*PYTHON_M_DATALOADER, "contract", *args],
        {"DL_PIPELINE_MODULES": "mytasks", "PYTHONPATH": str(tmp_path)},
        tmp_path,
    )
    return result.returncode, result.stdout


def test_export_then_check_is_a_gate_against_breaking_changes(tmp_path: Path) -> None:
    (tmp_path / "mytasks.py").write_text(TASKS)
    code, _ = contract(tmp_path, "export", "--out", "contract.yaml")
    assert code == 0
    written = (tmp_path / "contract.yaml").read_text()
    assert "emails.send:" in written
    assert "demo." not in written  # the built-in demo tasks are not the user's contract
    assert contract(tmp_path, "check", "contract.yaml") == (
        0,
        "contract.yaml: honoured (0 addition(s))\n",
    )

    (tmp_path / "mytasks.py").write_text(TASKS.replace("user_id: int", "user_id: str"))
    code, output = contract(tmp_path, "check", "contract.yaml")
    assert code == 1
    assert "BREAKING: emails.send: field user_id: string, contract int" in output
    assert "dataloader: contract.yaml: 1 breaking change(s)" in output

    (tmp_path / "mytasks.py").write_text(
        TASKS.replace('lang: str = "en"', "lang: str | None = None")
    )
    assert contract(tmp_path, "export", "--out", "nullable.yaml")[0] == 0
    (tmp_path / "mytasks.py").write_text(TASKS)
    code, output = contract(tmp_path, "check", "nullable.yaml")
    assert code == 1
    assert "BREAKING: emails.send: field lang: null refused, contract accepts null" in output


def test_a_missing_or_bad_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "mytasks.py").write_text(TASKS)
    code, output = contract(tmp_path, "check", "missing.yaml")
    assert (code, one_line(output)) == (
        2,
        "dataloader: cannot read missing.yaml: No such file or directory",
    )
    (tmp_path / "bad.yaml").write_text("version: 1\nqueues: {q: {tasks: {t: {args: {a: long}}}}}\n")
    code, output = contract(tmp_path, "check", "bad.yaml")
    assert code == 2
    assert one_line(output).startswith("dataloader: bad.yaml: task t, field a: unknown type 'long'")


def test_generate_writes_a_module_of_models_and_stubs(tmp_path: Path) -> None:
    (tmp_path / "mytasks.py").write_text(TASKS)
    assert contract(tmp_path, "export", "--out", "contract.yaml")[0] == 0
    assert contract(tmp_path, "generate", "contract.yaml", "--out", "stubs.py")[0] == 0
    stubs = (tmp_path / "stubs.py").read_text()
    assert (
        'class EmailsSendArgs(BaseModel):\n    to: str\n    user_id: int\n    lang: str = "en"\n'
        in stubs
    )
    compile(stubs, "stubs.py", "exec")
