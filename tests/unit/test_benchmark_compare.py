"""benchmarks/compare.py's reading of two revisions' runs: medians per side, the ratio, and
which way a change goes for each kind of measure."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest


def _compare() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "compare.py"
    spec = importlib.util.spec_from_file_location("benchmark_compare", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


compare = _compare()


@pytest.mark.parametrize(
    ("measure", "sign"),
    [
        ("jobs_per_s", 1),
        ("requests_per_s", 1),
        ("p99_ms", -1),
        ("server_cpu_us_per_job", -1),
        ("server_cpu_us_per_job_with_enqueue", -1),
        ("cpu_us_per_trigger", -1),
        ("python_calls_per_trigger", -1),
        ("jobs", 0),
        ("clients", 0),
    ],
)
def test_a_measure_says_which_way_is_better(measure: str, sign: int) -> None:
    assert compare.direction(measure) == sign


def test_medians_ratios_and_verdicts_per_measure() -> None:
    def run(rate: float, p99: float) -> dict[str, dict[str, float]]:
        return {"http_trigger": {"requests": 2000, "requests_per_s": rate, "p99_ms": p99}}

    runs = {
        "base": [run(1000, 20), run(1100, 30), run(900, 25)],
        "head": [run(800, 25), run(820, 26), run(5000, 24)],  # one outlier: medians hold
    }
    rows = {r["measure"]: r for r in compare.compared(runs, "base", "head")}
    assert set(rows) == {"requests_per_s", "p99_ms"}  # the workload's size is no measure
    assert (rows["requests_per_s"]["base"], rows["requests_per_s"]["head"]) == (1000, 820)
    assert math.isclose(rows["requests_per_s"]["ratio"], 0.82)
    assert rows["requests_per_s"]["verdict"] == "worse"  # fewer requests a second
    assert (rows["p99_ms"]["base"], rows["p99_ms"]["head"]) == (25, 25)
    assert rows["p99_ms"]["verdict"] == "same"


@pytest.mark.parametrize(
    ("ratio", "sign", "verdict"),
    [
        (0.9, 1, "worse"),
        (1.1, 1, "better"),
        (1.1, -1, "worse"),
        (0.9, -1, "better"),
        (1.04, 1, "same"),
        (0.96, -1, "same"),
    ],
)
def test_a_change_within_the_noise_is_no_step(ratio: float, sign: int, verdict: str) -> None:
    assert compare.verdict(ratio, sign) == verdict
