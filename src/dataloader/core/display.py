"""How instants and untrusted text are shown to people, the same in every face that shows
them (the dashboard's pages, the reasons a job waits)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

#: Unicode's bidirectional controls: a `\u202e` in args would reverse the rest of its line on
#: screen, so that what an operator reads is not what the job holds. Shown as escapes.
BIDI_CONTROLS: Final = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
_ESCAPED: Final = {ord(char): f"\\u{ord(char):04x}" for char in BIDI_CONTROLS}


def stamp(moment: datetime) -> str:
    """`moment` to the second, in UTC, as people read it: `2026-01-31 09:30:00 UTC`."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def visible(text: str) -> str:
    """`text` with its bidirectional controls written as escapes (`\\u202e`), so that what is
    on screen is what the text holds, in the order it holds it."""
    return text.translate(_ESCAPED)
