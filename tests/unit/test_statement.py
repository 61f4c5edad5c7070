"""Unit tests of `dataloader.storage.statement` and of every statement in `storage/queries.py`."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

from dataloader import storage
from dataloader.storage import db, queries
from dataloader.storage.statement import Statement

QUERIES_PY = Path(queries.__file__)

# --- compiling names to $n --------------------------------------------------------------------


def test_names_are_numbered_in_order_of_first_appearance() -> None:
    s = Statement("SELECT * FROM t WHERE b = :beta AND a = :alpha")
    assert s.sql == "SELECT * FROM t WHERE b = $1 AND a = $2"
    assert s.names == ("beta", "alpha")


def test_a_repeated_name_shares_its_number() -> None:
    s = Statement("SELECT :x, :y, :x, :y_2")
    assert s.sql == "SELECT $1, $2, $1, $3"
    assert s.names == ("x", "y", "y_2")


def test_a_statement_without_names_is_unchanged() -> None:
    s = Statement("SELECT now()")
    assert s.sql == "SELECT now()"
    assert s.names == ()


def test_casts_are_left_alone() -> None:
    s = Statement("SELECT :args::text::jsonb, status::text, :ids::uuid[]")
    assert s.sql == "SELECT $1::text::jsonb, status::text, $2::uuid[]"
    assert s.names == ("args", "ids")


def test_names_in_single_quoted_text_are_left_alone() -> None:
    s = Statement("SELECT ':not_a_name', 'it''s :neither', :real")
    assert s.sql == "SELECT ':not_a_name', 'it''s :neither', $1"
    assert s.names == ("real",)


def test_names_in_quoted_identifiers_are_left_alone() -> None:
    s = Statement('SELECT "col:umn", ":odd""name" FROM t WHERE x = :x')
    assert s.sql == 'SELECT "col:umn", ":odd""name" FROM t WHERE x = $1'
    assert s.names == ("x",)


def test_names_in_line_comments_are_left_alone() -> None:
    s = Statement("SELECT :a -- compare with :b, not :c\nFROM t WHERE y = :d")
    assert s.sql == "SELECT $1 -- compare with :b, not :c\nFROM t WHERE y = $2"
    assert s.names == ("a", "d")


def test_only_lower_case_identifiers_are_names() -> None:
    s = Statement("SELECT :Upper, :1, : spaced, arr[lo:hi], :ok")
    assert s.sql == "SELECT :Upper, :1, : spaced, arr[lo:hi], $1"
    assert s.names == ("ok",)


def test_a_name_may_start_with_an_underscore_and_hold_digits() -> None:
    s = Statement("SELECT :_x1")
    assert s.names == ("_x1",)


# --- bind -------------------------------------------------------------------------------------


def test_bind_puts_values_in_number_order() -> None:
    s = Statement("UPDATE t SET a = :a WHERE id = :id AND a <> :a")
    assert s.bind(id=7, a="x") == ("UPDATE t SET a = $1 WHERE id = $2 AND a <> $1", "x", 7)


def test_bind_of_a_statement_without_names_is_the_text_alone() -> None:
    assert Statement("SELECT 1").bind() == ("SELECT 1",)


def test_bind_passes_none_as_a_value() -> None:
    assert Statement("SELECT :x").bind(x=None) == ("SELECT $1", None)


def test_bind_refuses_a_missing_name_and_names_it() -> None:
    with pytest.raises(TypeError, match=r"missing \['b'\], unknown \[\]"):
        Statement("SELECT :a, :b").bind(a=1)


def test_bind_refuses_an_unknown_name_and_names_it() -> None:
    with pytest.raises(TypeError, match=r"missing \[\], unknown \['c'\]"):
        Statement("SELECT :a").bind(a=1, c=2)


def test_bind_refuses_a_misspelt_name_naming_both() -> None:
    with pytest.raises(TypeError, match=r"missing \['queue'\], unknown \['queues'\]"):
        Statement("SELECT :queue").bind(queues="q")


# --- every statement of queries.py ------------------------------------------------------------

STATEMENTS = {name: value for name, value in vars(queries).items() if isinstance(value, Statement)}
#: Quoted text, quoted identifiers and comments: where a ':' or '$' is no parameter.
_SKIPPED = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*""")
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


def statement_sources() -> dict[str, str]:
    """The text each `X = Statement("…")` of queries.py was written with: its literal, or,
    for one built from a template (`Statement(_CLAIM.format(…))`), every literal it is built
    from (the template's included)."""
    module = ast.parse(QUERIES_PY.read_text(encoding="utf-8"))
    literals = {
        target.id: node.value.value
        for node in module.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in ([node.target] if isinstance(node, ast.AnnAssign) else node.targets)
        if isinstance(target, ast.Name)
    }
    found = {}
    for node in ast.walk(module):
        if (
            isinstance(node, ast.AnnAssign | ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "Statement"
        ):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            assert isinstance(target, ast.Name)
            [text] = node.value.args
            parts = [
                part.value if isinstance(part, ast.Constant) else literals[part.id]
                for part in ast.walk(text)
                if (isinstance(part, ast.Constant) and isinstance(part.value, str))
                or (isinstance(part, ast.Name) and part.id in literals)
            ]
            assert parts, target.id
            found[target.id] = "\n".join(parts)
    return found


def test_queries_holds_statements() -> None:
    assert len(STATEMENTS) >= 10
    assert set(statement_sources()) == set(STATEMENTS)


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_every_statement_binds_its_names(name: str) -> None:
    statement = STATEMENTS[name]
    assert all(_IDENTIFIER.fullmatch(n) for n in statement.names)
    values = {n: object() for n in statement.names}
    bound = statement.bind(**values)
    assert bound[0] == statement.sql
    assert bound[1:] == tuple(values[n] for n in statement.names)


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_every_statement_numbers_each_of_its_names_once(name: str) -> None:
    statement = STATEMENTS[name]
    code = _SKIPPED.sub("", statement.sql)
    numbers = {int(n) for n in re.findall(r"\$(\d+)", code)}
    assert numbers == set(range(1, len(statement.names) + 1))
    assert not re.search(r"\$\d+[A-Za-z_]", code)  # no name cut short (":jobIds" → "$1Ids")


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_no_statement_leaves_a_parameter_like_token(name: str) -> None:
    code = _SKIPPED.sub("", STATEMENTS[name].sql)
    leftovers = re.findall(r"(?<!:):(?!:)\S*", code)  # a ':' that is not part of '::'
    assert leftovers == []


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_no_statement_is_written_with_positional_parameters(name: str) -> None:
    source = _SKIPPED.sub("", statement_sources()[name])
    assert not re.search(r"\$\d", source)


# --- every statement stays prepared -------------------------------------------------------------


def _storage_statements() -> dict[str, Statement]:
    found = {}
    for info in pkgutil.iter_modules(storage.__path__):
        module = importlib.import_module(f"dataloader.storage.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, Statement):
                found[f"{info.name}.{name}"] = value
            elif isinstance(value, dict):
                for key, item in value.items():
                    if isinstance(item, Statement):
                        found[f"{info.name}.{name}[{key!r}]"] = item
    return found


def test_every_statement_fits_in_the_prepared_statement_cache() -> None:
    statements = _storage_statements()
    assert "processes.FINISH_TASKS" in statements  # the longest, beyond asyncpg's default
    too_long = {
        name: len(s.sql)
        for name, s in statements.items()
        if len(s.sql) > db.MAX_CACHEABLE_STATEMENT_BYTES
    }
    assert too_long == {}
