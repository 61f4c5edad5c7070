"""Every `DL_*` variable the code's text and the docs name is a setting (or one of the test
suite's knobs): a reader who sets it changes something."""

from __future__ import annotations

import re
from pathlib import Path

from dataloader.config import Settings

ROOT = Path(__file__).resolve().parents[2]
#: A variable's name, or a family of them (`DL_PRUNE_*`).
NAMED = re.compile(r"\bDL_[A-Z0-9_]*[A-Z0-9](?:_\*)?(?![A-Za-z0-9_])")
#: Variables that are no setting of the service: the test suite's, and examples of mistakes.
NOT_SETTINGS = {"DL_TEST_DSN", "DL_FUZZ", "DL_FAULT_REPORT", "DL_FAULT_ROUNDS", "DL_DB_DNS", "DL_X"}


def settings() -> set[str]:
    prefix = str(Settings.model_config.get("env_prefix", ""))
    return {f"{prefix}{name}".upper() for name in Settings.model_fields}


def test_every_dl_variable_named_in_the_code_and_the_docs_is_a_setting() -> None:
    known = settings()
    texts = [*(ROOT / "src").rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]
    unknown = set()
    for path in texts:
        for name in NAMED.findall(path.read_text(encoding="utf-8")):
            if name.endswith("_*"):
                if not any(s.startswith(name[:-1]) for s in known):
                    unknown.add((name, path.relative_to(ROOT).as_posix()))
            elif name not in known and name not in NOT_SETTINGS:
                unknown.add((name, path.relative_to(ROOT).as_posix()))
    assert sorted(unknown) == []
