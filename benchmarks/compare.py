"""Two revisions of dataloader measured side by side on the hot paths, alternately, in one run:
each measure's median per revision and their ratio, so that no step back goes unseen.

    python benchmarks/compare.py --base fe9d220                 # against this checkout
    python benchmarks/compare.py --base v0.4 --head main --rounds 5 --only http_trigger

Each revision named by a commit is checked out in a worktree of its own and installed in a
virtual environment of its own, both kept under `.bench-revisions/<commit>/` and reused by the
next run; `--head .` (the default) is this checkout as it is, run by this interpreter. Both are
measured by this checkout's harness (`benchmarks/run.py`: the same workloads and the same
clocks), which imports and starts the revision's code (`PYTHONPATH`, `python -m dataloader`);
`--harness own` runs each revision's own harness instead, for a revision too old for this one.

Rounds alternate the order (base then head, head then base, …) on one server, so that the
machine's drift and the server's state (a checkpoint, autovacuum) fall on both alike; the table
gives medians. A ratio is head / base; `worse` marks a throughput more than 5 % lower or a
latency or CPU cost more than 5 % higher.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Where the revisions' worktrees and virtual environments are kept between runs.
REVISIONS = ROOT / ".bench-revisions"
RESULTS = ROOT / "benchmarks" / "results"

#: The hot paths compared by default: the drain lock-free and keyed (the spec's rows through the
#: service), the HTTP trigger (and what one costs the service's process), its
#: trigger-to-started latency, one key's chain, process calls.
DEFAULT_PHASES = (
    "drain_c10",
    "service_drain",
    "http_trigger",
    "trigger_cost",
    "http_latency",
    "serial_chain",
    "process_calls",
)
#: A change beyond this share counts as a step (back or forward).
NOISE = 0.05


@dataclass(frozen=True)
class Revision:
    """One side of the comparison: its name as given, its commit, its code and interpreter."""

    name: str
    commit: str
    tree: Path
    python: Path


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def prepared(name: str) -> Revision:
    """`name` checked out and installed (once: later runs reuse both); `.` is this checkout,
    installed alike in a virtual environment of its own (kept while its pyproject.toml stays
    the same), so that both sides run with the same kind of interpreter and packages: not
    this checkout's development environment, whose extra packages a measure could feel."""
    if name == ".":
        label = f"{git('rev-parse', '--short=12', 'HEAD')}+worktree"
        digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:12]
        python = installed(ROOT, REVISIONS / f"checkout-{digest}" / "venv", "this checkout")
        return Revision(".", label, ROOT, python)
    try:
        commit = git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
    except subprocess.CalledProcessError:
        sys.exit(f"no such revision: {name!r} (a commit, tag or branch of this repository)")
    home = REVISIONS / commit[:12]
    tree = home / "tree"
    if not (tree / "pyproject.toml").exists():
        home.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--force", "--detach", str(tree), commit)
    python = installed(tree, home / "venv", f"{name} ({commit[:12]})")
    return Revision(name, commit[:12], tree, python)


def installed(tree: Path, venv: Path, label: str) -> Path:
    """The interpreter of `venv`, where `tree` is installed (once), with what the harness
    needs beside it: httpx (HTTP phases)."""
    python = venv / "bin" / "python"
    if not (venv / "installed").exists():
        print(f"… installing {label} in {venv}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "-e", str(tree), "httpx"],
            check=True,
        )
        (venv / "installed").touch()
    return python


def measure(rev: Revision, phases: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """One run of the harness on `rev`'s code: {phase: {measure: value}}."""
    harness_root = rev.tree if args.harness == "own" else ROOT
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "run.json"
        command = [str(rev.python), str(harness_root / "benchmarks" / "run.py")]
        command += ["--only", ",".join(phases), "--out", str(out)]
        command += ["--dsn", args.dsn] if args.dsn else []
        command += ["--quick"] if args.quick else []
        env = os.environ | {"PYTHONPATH": str(rev.tree / "src")}
        print(f"… {rev.name} ({rev.commit}): {', '.join(phases)}", file=sys.stderr, flush=True)
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            hint = "" if args.harness == "own" else " (an older revision: try --harness own)"
            sys.exit(f"the harness failed on {rev.name}{hint}:\n{done.stderr[-2000:]}")
        phases_measured: dict[str, Any] = json.loads(out.read_text())["phases"]
        return phases_measured


def direction(measure: str) -> int:
    """+1 where more is better (a rate), -1 where less is (a latency, a CPU cost), 0 for what
    describes the workload rather than measures it (counts, sizes)."""
    if measure.endswith("_per_s"):
        return 1
    if measure.endswith(("_ms", "_us_per_job", "_us_per_job_with_enqueue", "_per_trigger")):
        return -1
    return 0


def verdict(ratio: float, sign: int) -> str:
    change = (ratio - 1) * sign
    if change < -NOISE:
        return "worse"
    if change > NOISE:
        return "better"
    return "same"


def compared(runs: dict[str, list[dict[str, Any]]], base: str, head: str) -> list[dict[str, Any]]:
    """Per phase and measure: each side's median over the rounds, the ratio and its verdict."""
    rows = []
    for phase in runs[base][0]:
        for name, value in runs[base][0][phase].items():
            sign = direction(name)
            if not sign or not isinstance(value, int | float):
                continue
            medians = {
                side: statistics.median(run[phase][name] for run in runs[side])
                for side in (base, head)
            }
            ratio = medians[head] / medians[base] if medians[base] else float("nan")
            rows.append(
                {
                    "phase": phase,
                    "measure": name,
                    "base": medians[base],
                    "head": medians[head],
                    "ratio": ratio,
                    "verdict": verdict(ratio, sign),
                }
            )
    return rows


def table(rows: list[dict[str, Any]], base: Revision, head: Revision) -> str:
    header = f"| phase | measure | {base.commit} | {head.commit} | ratio | |"
    lines = [header, "| --- | --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(
            f"| {r['phase']} | {r['measure']} | {r['base']:,.2f} | {r['head']:,.2f}"
            f" | {r['ratio']:.2f} | {r['verdict']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the revision compared against")
    parser.add_argument(
        "--head", default=".", help="the revision measured (default: this checkout)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs of each revision (default 3)")
    parser.add_argument(
        "--only", help="comma-separated phases of benchmarks/run.py (default: the hot paths)"
    )
    parser.add_argument("--dsn", help="admin DSN of a server (default: embedded PostgreSQL)")
    parser.add_argument("--quick", action="store_true", help="a tenth of the jobs (smoke test)")
    parser.add_argument(
        "--harness", choices=("head", "own"), default="head", help="whose benchmarks/run.py"
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    phases = args.only.split(",") if args.only else list(DEFAULT_PHASES)
    base, head = prepared(args.base), prepared(args.head)
    if base.commit == head.commit:
        parser.error(f"--base and --head are one revision ({base.commit})")
    runs: dict[str, list[dict[str, Any]]] = {base.commit: [], head.commit: []}
    for round_ in range(args.rounds):
        for rev in (base, head) if round_ % 2 == 0 else (head, base):
            runs[rev.commit].append(measure(rev, phases, args))
    rows = compared(runs, base.commit, head.commit)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    out = RESULTS / f"compare-{started.replace(':', '')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "started_at": started,
        "command": " ".join(["python", "benchmarks/compare.py", *sys.argv[1:]]),
        "base": {"name": base.name, "commit": base.commit},
        "head": {"name": head.name, "commit": head.commit},
        "rounds": args.rounds,
        "rows": rows,
        "runs": runs,
    }
    out.write_text(json.dumps(document, indent=2))
    print(table(rows, base, head))
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
