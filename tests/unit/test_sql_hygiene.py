"""SQL is written once, in `storage/queries.py`, with parameters; no statement is assembled
from strings at run time, so no identifier or value can come from a request."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "dataloader"
SQL_START = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|DROP|ALTER|SET|RESET|LISTEN|UNLISTEN|NOTIFY"
    r"|TRUNCATE|COPY|LOCK|VACUUM|ANALYZE|GRANT|REVOKE|DO|CALL|EXPLAIN)\b"
)  # case-sensitive: our SQL is upper case, and "lock connection lost" is English
#: Functions allowed to build SQL from strings, and why.
ALLOWED = {
    # the embedded server's own database name, a module constant; psql takes no parameters
    ("storage/embedded.py", "start_embedded"),
}


def _template(node: ast.AST) -> str | None:
    """The literal text that starts an f-string, a "….format()", a "…" % x or a "…" + x."""
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value for part in node.values if isinstance(part, ast.Constant))
    if (  # "SELECT … %s" % x, "SELECT … " + x
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Mod | ast.Add)
        and isinstance(node.left, ast.Constant)
        and isinstance(node.left.value, str)
    ):
        return node.left.value
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
        and isinstance(node.func.value, ast.Constant)
    ):
        return str(node.func.value.value)
    return None


def assembled_sql(source: str) -> list[tuple[str, int]]:
    """(function, line) of every string assembled in `source` that starts like SQL; the
    function is "<module>" at module level."""
    found = []
    _walk(ast.parse(source), "<module>", found)
    return sorted(found, key=lambda hit: hit[1])


def _walk(node: ast.AST, function: str, found: list[tuple[str, int]]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            _walk(child, child.name, found)
            continue
        text = _template(child)
        if text is not None and SQL_START.match(text):
            found.append((function, child.lineno))
        _walk(child, function, found)


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
        "def by_percent(t):\n    return 'LISTEN %s' % t\n"
        "def by_plus(t):\n    return 'SET search_path = ' + t\n"
        "AT_IMPORT = f'NOTIFY {CHANNEL}'\n"
    )
    assert assembled_sql(source) == [
        ("by_fstring", 2),
        ("by_format", 4),
        ("by_percent", 8),
        ("by_plus", 10),
        ("<module>", 11),
    ]
