"""The fault suite's figures as a Markdown table (docs/faults.md).

    DL_FAULT_ROUNDS=5 DL_FAULT_REPORT=faults.jsonl pytest tests/faults
    python benchmarks/fault_report.py faults.jsonl

Each line of the report file is one scenario's `Report` (tests/faults/ledger.py). "Lost" counts
jobs that did not end in a state the scenario allows plus succeeded jobs without their effect.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

COLUMNS = (
    "scenario",
    "rounds",
    "jobs",
    "runs",
    "lost",
    "duplicate effects",
    "overlaps",
    "locks left",
    "unexplained attempts",
    "fenced-out writes",
    "recovered in (s)",
)


def row(report: dict[str, Any]) -> list[str]:
    lost = sum(report["unexpected_states"].values()) + report["missing_effects"]
    return [
        report["scenario"].replace("_", " "),
        str(report["rounds"]),
        f"{report['jobs']:,}",
        f"{report['runs']:,}",
        str(lost),
        str(report["duplicate_effects"]),
        str(len(report["overlaps"])),
        str(report["leftover_advisory_locks"]),
        str(len(report["unexplained_attempts"])),
        str(report["fenced_out_writes"]),
        f"{report['recovered_in_s']:.1f}",
    ]


def table(reports: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row(r)) + " |" for r in reports]
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/fault_report.py REPORT.jsonl")
    lines = Path(sys.argv[1]).read_text(encoding="utf-8").splitlines()
    print(table([json.loads(line) for line in lines if line.strip()]))


if __name__ == "__main__":
    main()
