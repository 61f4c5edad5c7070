"""The throughput series and its chart: bars stacked by outcome, numbers only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dataloader.core.queues import ThroughputPoint, series_of
from dataloader.dashboard.charts import summary, throughput_svg

T0 = datetime(2026, 11, 26, 12, tzinfo=UTC)


def test_a_series_sums_each_steps_outcomes_and_drops_other_kinds() -> None:
    later = T0 + timedelta(minutes=1)
    points = series_of(
        [(later, "done", 3), (T0, "done", 2), (T0, "failed", 1), (T0, "heartbeat", 9),
         (later, "requeue", 4), (later, "lost", 1)]
    )  # fmt: skip
    assert points == [
        ThroughputPoint(T0, succeeded=2, failed=1),
        ThroughputPoint(later, succeeded=3, retried=4, lost=1),
    ]
    assert [p.ended for p in points] == [3, 4]  # a retry ends no job


def test_the_chart_draws_a_rect_per_outcome_of_each_step_and_nothing_else() -> None:
    points = [
        ThroughputPoint(T0, succeeded=2, failed=1),
        ThroughputPoint(T0 + timedelta(minutes=5), succeeded=4),
    ]
    svg = str(
        throughput_svg(
            points, start=T0, span=timedelta(hours=1), step=timedelta(minutes=1), title="<t>"
        )
    )
    assert svg.count("<rect ") == 3
    assert 'class="ok"' in svg
    assert 'class="bad"' in svg
    assert "&lt;t&gt;" in svg
    assert "<t>" not in svg
    assert "<script" not in svg
    assert summary(points) == {"succeeded": 6, "retried": 0, "failed": 1, "canceled": 0, "lost": 0}


def test_an_empty_series_is_an_empty_chart() -> None:
    svg = str(
        throughput_svg([], start=T0, span=timedelta(hours=1), step=timedelta(minutes=1), title="x")
    )
    assert "<rect" not in svg
    assert svg.startswith("<svg")
