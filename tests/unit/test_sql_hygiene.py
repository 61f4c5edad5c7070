"""SQL is written once, in `storage/queries.py`, with parameters; no statement is assembled
from strings at run time, so no identifier or value can come from a request."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "dataloader"
SQL_START = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|DROP|ALTER)\b", re.I)
#: Functions allowed to build SQL from strings, and why.
ALLOWED = {
    # the embedded server's own database name, a module constant; psql takes no parameters
    ("storage/embedded.py", "start_embedded"),
}


def _template(node: ast.AST) -> str | None:
    """The literal text of an f-string or of "….format()"'s receiver."""
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value for part in node.values if isinstance(part, ast.Constant))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
        and isinstance(node.func.value, ast.Constant)
    ):
        return str(node.func.value.value)
    return None


def assembled_sql(source: str) -> list[tuple[str, int]]:
    """(function, line) of every f-string or .format() in `source` that starts like SQL."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                text = _template(node)
                if text is not None and SQL_START.match(text):
                    found.append((function.name, node.lineno))
    return found


def test_no_sql_is_assembled_from_strings() -> None:
    unexpected = [
        (path.relative_to(SRC).as_posix(), function, line)
        for path in SRC.rglob("*.py")
        for function, line in assembled_sql(path.read_text(encoding="utf-8"))
        if (path.relative_to(SRC).as_posix(), function) not in ALLOWED
    ]
    assert unexpected == []


def test_the_check_finds_assembled_statements() -> None:
    source = (
        "def by_fstring(t):\n    return f'SELECT * FROM {t}'\n"
        "async def by_format(t):\n    return 'DELETE FROM {}'.format(t)\n"
        "def fine(q):\n    return f'queue {q} is busy'\n"
    )
    assert assembled_sql(source) == [("by_fstring", 2), ("by_format", 4)]
