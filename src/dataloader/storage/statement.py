"""SQL statements with named parameters.

asyncpg numbers its parameters (`$1`, `$2` …): a statement of twelve of them, and the call
that passes twelve values in the same order, must be kept in step by hand. A `Statement` is
written with names (`:queue`, `:job_ids`) and compiled once, when its module is imported, to
asyncpg's numbered form; `bind(queue=…, job_ids=…)` puts the values in that order and refuses
a missing or unknown name. The text asyncpg prepares is the same as if it had been numbered by
hand, so nothing is paid at run time beyond building one tuple.

A name is `:` followed by a lower-case identifier, outside quoted text and comments, and not
part of a `::type` cast.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from operator import itemgetter
from typing import Any, Final

#: Quoted text, quoted identifiers and comments (left alone), or a parameter name.
_TOKEN: Final = re.compile(
    r"""(?P<skip>'(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*)"""
    r"""|(?<![:\w]):(?P<name>[a-z_][a-z0-9_]*)"""
)


class Statement:
    """One SQL statement, its named parameters compiled to asyncpg's `$n`."""

    __slots__ = ("_values_of", "names", "sql")

    def __init__(self, sql: str) -> None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match.group("name")
            if name is None:
                return match.group(0)
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        #: The text asyncpg prepares (`$1` … in the order of `names`).
        self.sql: str = _TOKEN.sub(number, sql)
        #: Parameter names, in the order of their numbers.
        self.names: tuple[str, ...] = tuple(names)
        self._values_of: Callable[[Mapping[str, Any]], tuple[Any, ...]] = _getter(self.names)

    def bind(self, **values: Any) -> tuple[Any, ...]:
        """`(sql, value of $1, value of $2, …)`, to unpack into an asyncpg call:
        `await conn.fetch(*STATEMENT.bind(queue=q))`."""
        if len(values) == len(self.names):  # then a name missing means one unknown
            try:
                return (self.sql, *self._values_of(values))
            except KeyError:
                pass
        missing = [n for n in self.names if n not in values]
        unknown = [n for n in values if n not in self.names]
        raise TypeError(f"statement parameters: missing {missing}, unknown {unknown}")

    def __repr__(self) -> str:
        return f"Statement({self.sql[:60]!r}…, names={self.names})"


def _getter(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """The values of `names` from a mapping, as a tuple in their order (a KeyError for a
    missing one); `bind` runs for every statement a worker sends."""
    if len(names) >= 2:
        return itemgetter(*names)
    return lambda values: tuple(values[n] for n in names)
