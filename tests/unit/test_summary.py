"""The periodic summaries of ended jobs and answered requests (logger/summary.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dataloader.logger.summary import job_summary, request_summary


def test_a_flush_logs_one_line_per_queue_with_its_counts_then_starts_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    summary = job_summary(60)
    for queue, ended in [("b", "done"), ("a", "done"), ("a", "retry"), ("a", "done")]:
        summary.count(queue, ended)
    with caplog.at_level(logging.INFO, logger="dataloader.workers"):
        summary.flush()
        summary.flush()  # nothing ended since: no line
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "queue a: 2 done, 1 retry in the last 60s"),
        (logging.INFO, "queue b: 1 done in the last 60s"),
    ]
    assert [r.__dict__["ended"] for r in caplog.records] == [{"done": 2, "retry": 1}, {"done": 1}]


def test_large_counts_are_grouped_by_thousands(caplog: pytest.LogCaptureFixture) -> None:
    summary = job_summary(30)
    for _ in range(12_345):
        summary.count("etl", "done")
    with caplog.at_level(logging.INFO, logger="dataloader.workers"):
        summary.flush()
    assert caplog.records[0].getMessage() == "queue etl: 12,345 done in the last 30s"


async def test_the_loop_flushes_once_more_when_stopped(caplog: pytest.LogCaptureFixture) -> None:
    summary = job_summary(3600)
    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="dataloader.workers"):
        loop = asyncio.create_task(summary.run(stop))
        summary.count("etl", "failed")
        stop.set()
        await asyncio.wait_for(loop, timeout=10)
    assert [r.getMessage() for r in caplog.records] == ["queue etl: 1 failed in the last 3600s"]


async def test_a_period_of_zero_turns_the_summary_off(caplog: pytest.LogCaptureFixture) -> None:
    summary = job_summary(0)
    summary.count("etl", "done")
    with caplog.at_level(logging.INFO, logger="dataloader.workers"):
        await asyncio.wait_for(summary.run(asyncio.Event()), timeout=10)
    assert caplog.records == []


def test_requests_are_counted_per_route_by_status(caplog: pytest.LogCaptureFixture) -> None:
    summary = request_summary(60)
    for _ in range(1200):
        summary.count("POST /api/v1/jobs/trigger", "200")
    summary.count("POST /api/v1/jobs/trigger", "422")
    summary.count("GET /api/v1/jobs/{job_id}/status", "404")
    with caplog.at_level(logging.INFO, logger="dataloader.access"):
        summary.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "GET /api/v1/jobs/{job_id}/status: 404 ×1 in the last 60s",
        "POST /api/v1/jobs/trigger: 200 ×1,200, 422 ×1 in the last 60s",
    ]
    assert caplog.records[1].__dict__["route"] == "POST /api/v1/jobs/trigger"
    assert caplog.records[1].__dict__["statuses"] == {"200": 1200, "422": 1}
