"""Charts drawn on the server as SVG: numbers and fixed words only, no script."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Final

from markupsafe import Markup, escape

from dataloader.core.queues import ThroughputPoint

#: The outcomes a bar stacks, bottom up, with their CSS class (colours follow the theme).
STACK: Final = (("succeeded", "ok"), ("retried", "retry"), ("failed", "bad"),
                ("canceled", "muted"), ("lost", "bad2"))  # fmt: skip
WIDTH: Final = 600
HEIGHT: Final = 120


def throughput_svg(
    points: Sequence[ThroughputPoint],
    *,
    start: datetime,
    span: timedelta,
    step: timedelta,
    title: str,
) -> Markup:
    """A stacked bar per step from `start` over `span` (steps without attempts are empty),
    with a title and a text summary for screen readers."""
    steps = max(1, int(span / step))
    by_step = {int((p.at - start) / step): p for p in points}
    top = max((sum(getattr(p, name) for name, _ in STACK) for p in points), default=0)
    scale = (HEIGHT - 4) / top if top else 0.0
    bar = WIDTH / steps
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" preserveAspectRatio="none">',
        f"<title>{escape(title)}</title>",
    ]
    for index in range(steps):
        point = by_step.get(index)
        if point is None:
            continue
        y = float(HEIGHT)
        for name, css in STACK:
            n = getattr(point, name)
            if not n:
                continue
            h = n * scale
            y -= h
            parts.append(
                f'<rect class="{css}" x="{index * bar:.2f}" y="{y:.2f}" '
                f'width="{max(bar - 0.5, 0.5):.2f}" height="{h:.2f}">'
                f"<title>{n} {name}</title></rect>"
            )
    parts.append("</svg>")
    return Markup("".join(parts))


def summary(points: Sequence[ThroughputPoint]) -> dict[str, int]:
    """The totals of a series, by outcome (what the chart shows, as text)."""
    return {name: sum(getattr(p, name) for p in points) for name, _ in STACK}
