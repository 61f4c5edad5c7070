"""Path segments that carry any text: a durable process's namespace and id in the URLs of the
API and the dashboard.

A process id may hold a slash, or be a word a route uses for itself (`call`, `events`):
`report/call`, `events`. Each such value travels as ONE path segment, percent-encoded
(`report%2Fcall`), so that no id spells another route's path. Starlette matches routes on the
decoded path, where `%2F` is already a slash; a route of this module matches on the path as
the client sent it (`raw_path`) and decodes each segment it captures, so that
`/api/v1/processes/orders/report%2Fcall/call` is the call of `report/call`, and
`/api/v1/processes/orders/call` the process `call`.

The segments `.` and `..` (also as `%2E`) are not sent as they are by browsers and most HTTP
clients, which resolve them away: `core.processes` refuses them as ids and namespaces.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import quote, unquote

from starlette.convertors import Convertor, register_url_convertor
from starlette.routing import Match
from starlette.types import Scope

from dataloader.api.parameters import CheckedRoute

#: The convertor of a segment: `{process_id:dl_segment}` in a route of `SegmentRoute`.
SEGMENT: Final = "dl_segment"


class _Segment(Convertor[str]):
    """One percent-encoded path segment, decoded (and encoded again by `url_for`)."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return unquote(value)

    def to_string(self, value: str) -> str:
        return segment(value)


register_url_convertor(SEGMENT, _Segment())


def segment(value: str) -> str:
    """`value` as one path segment: every character a path gives a meaning to, `/` and `%`
    first, percent-encoded."""
    return quote(value, safe="")


def sent_path(scope: Scope) -> str | None:
    """The request's path as the client sent it (percent-encoded, without its `root_path`'s
    segments; bytes beyond ASCII percent-encoded too), or None when the server gave no
    `raw_path`."""
    raw = scope.get("raw_path")
    if not isinstance(raw, bytes | bytearray):
        return None
    path = "".join(chr(b) if b < 0x80 else f"%{b:02X}" for b in raw.split(b"?", 1)[0])
    root = scope.get("root_path", "")
    if root and scope.get("path", "").startswith(root):
        # the root path as sent may be encoded otherwise than its decoded form: drop as
        # many segments as it has
        parts = path.split("/")
        path = "/".join(parts[:1] + parts[1 + root.strip("/").count("/") + 1 :])
    return path


class SegmentRoute(CheckedRoute):
    """A route matched on the path as sent, so that its `dl_segment` parameters may hold any
    text, `/` included (see the module's doc)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope.get("type") == "http":
            path = sent_path(scope)
            if path is not None:
                scope = {**scope, "path": path, "root_path": ""}
        result: tuple[Match, Any] = super().matches(scope)
        return result
