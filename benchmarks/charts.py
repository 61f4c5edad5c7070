"""Charts of the benchmark results, as PNG files beside docs/benchmarks.md.

    python benchmarks/charts.py            # from benchmarks/results/ into docs/img/
    python benchmarks/charts.py --out DIR

Reads the suite's results (`benchmarks/results/<time>.json`, written by `benchmarks/run.py`)
and the side-by-side runs with the peers (`benchmarks/results/peers/<stamp>-<system>-<i>.json`,
written by `benchmarks/peers.sh`), and draws:

* `peers.png`: dataloader beside pgqueuer and procrastinate (medians, min–max bars);
* `targets.png`: the latest suite's figures against their targets (blocked rows, serial
  chain, service against library and against pgqueuer, HTTP);
* `history.png`: the drain and the HTTP trigger across every result file kept;
* `slots.png`: the drain at 10, 128 and 256 slots (`drain_slots`), dataloader's jobs with and
  without a lock_key beside pgqueuer: jobs/s, and the server's CPU per job.

`benchmarks/run.py` calls `draw_all` at the end of a run when matplotlib is installed
(`pip install -e '.[bench]'`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "docs" / "img"
US = "dataloader"
#: Peer metrics drawn, with their axis labels.
PEER_METRICS = {
    "drain_jobs_per_s": "drain (jobs/s)",
    "enqueue_single_jobs_per_s": "enqueue, 1 job/call (jobs/s)",
    "enqueue_batch_jobs_per_s": "enqueue, 1000 jobs/call (jobs/s)",
    "latency_p99_ms": "enqueue→start p99 (ms)",
}


def suite_results(results: Path) -> list[dict[str, Any]]:
    """Every suite result, oldest first."""
    found = [json.loads(p.read_text()) for p in sorted(results.glob("*.json"))]
    # the same folder keeps other runs (steady.py's samples): only the suite's have phases
    return sorted((r for r in found if "phases" in r), key=lambda r: r["started_at"])


def latest_of_each_phase(suite: list[dict[str, Any]]) -> dict[str, Any]:
    """The latest result file, with each phase it lacks taken from the latest file that has
    it (a run of a few phases, `--only`, leaves the others as they were measured last)."""
    phases: dict[str, Any] = {}
    for result in suite:
        phases.update(result["phases"])
    return suite[-1] | {"phases": phases}


def peer_runs(results: Path) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    """The latest side-by-side run: its stamp and each system's passes."""
    files = sorted((results / "peers").glob("*-*-*.json"))
    if not files:
        return "", {}
    stamp = max("-".join(f.name.split("-")[:3]) for f in files)  # 2026-11-21T1649
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in files:
        if f.name.startswith(stamp + "-"):
            data = json.loads(f.read_text())
            runs[data["system"]].append(data)
    return stamp, dict(runs)


def _colour(system: str) -> str:
    return "tab:red" if system == US else "tab:gray"


def draw_peers(plt: Any, results: Path, out: Path) -> Path | None:
    stamp, runs = peer_runs(results)
    if not runs:
        return None
    systems = sorted(runs, key=lambda s: (s == US, s))
    fig, axes = plt.subplots(1, len(PEER_METRICS), figsize=(15, 4.6))
    for ax, (metric, label) in zip(axes, PEER_METRICS.items(), strict=True):
        values = [[r[metric] for r in runs[s]] for s in systems]
        medians = [statistics.median(v) for v in values]
        errors = [
            [m - min(v) for m, v in zip(medians, values, strict=True)],
            [max(v) - m for m, v in zip(medians, values, strict=True)],
        ]
        ax.bar(systems, medians, yerr=errors, color=[_colour(s) for s in systems], capsize=3)
        ax.set_title(label, fontsize=10)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        for i, m in enumerate(medians):
            ax.annotate(
                f"{m:,.0f}" if m >= 100 else f"{m:.2f}",
                (i, m),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 2),
                textcoords="offset points",
            )
    fig.suptitle(f"Side by side, no-op jobs, concurrency 10, medians (min–max) — run {stamp}")
    return _save(plt, fig, out / "peers.png")


#: A target row: what, measured, target, unit, and whether more is better.
TargetRow = tuple[str, float, float, str, bool]


def _target_rows(latest: dict[str, Any]) -> list[TargetRow]:
    """The latest suite's targets that it measured."""
    p = latest["phases"]
    rows: list[TargetRow] = []
    if "blocked" in p:
        for key, value in p["blocked"].items():
            if key.endswith("_ratio"):
                rows.append((f"behind 50k {key[:-6]} / plain", value, 0.9, "ratio", True))
    if "serial_chain" in p:
        chain = p["serial_chain"]["jobs_per_s"]
        rows.append(("serial chain, 2 processes", chain, 400, "jobs/s", True))
    if "service_drain" in p:
        s = p["service_drain"]
        rows.append(("service / library drain", s["ratio"], 0.95, "ratio", True))
        if "service_vs_pgqueuer_defaults" in s:
            ratio = s["service_vs_pgqueuer_defaults"]
            rows.append(("service / pgqueuer out of the box", ratio, 1.0, "ratio", True))
        if "service_lock_free_vs_pgqueuer_defaults" in s:
            ratio = s["service_lock_free_vs_pgqueuer_defaults"]
            rows.append(("service, no lock_key / pgqueuer", ratio, 1.0, "ratio", True))
    if "http_trigger" in p:
        http = p["http_trigger"]
        rows.append(("HTTP trigger", http["requests_per_s"], 2000, "req/s", True))
        rows.append(("HTTP trigger p99", http["p99_ms"], 25, "ms", False))
    if "http_latency" in p:
        rows.append(("enqueue→start via HTTP p99", p["http_latency"]["p99_ms"], 10, "ms", False))
    return rows


def draw_targets(plt: Any, latest: dict[str, Any], out: Path) -> Path | None:
    rows = _target_rows(latest)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 1.4))
    # how far past the target: 1 = met exactly, either way round
    shares = [m / t if more else t / m for _, m, t, _, more in rows]
    colours = ["tab:green" if s >= 1 else "tab:orange" for s in shares]
    ax.barh([what for what, *_ in rows], shares, color=colours)
    ax.axvline(1.0, color="black", linewidth=1)
    for i, (_, measured, target, unit, more) in enumerate(rows):
        bound = "≥" if more else "<"
        shown = (
            f"{measured:.2f} ({bound} {target:g})"
            if unit == "ratio"
            else (
                f"{measured:,.1f} {unit} ({bound} {target:,.0f})"
                if unit == "ms"
                else f"{measured:,.0f} {unit} ({bound} {target:,.0f})"
            )
        )
        ax.annotate(
            shown,
            (shares[i], i),
            va="center",
            fontsize=8,
            xytext=(4, 0),
            textcoords="offset points",
        )
    ax.set_xlabel("how far past the target (1 = target met; for latencies target / measured)")
    ax.set_xlim(0, max(max(shares) * 1.5, 1.6))
    ax.invert_yaxis()
    version = latest["postgres"]["server_version"].split()[0]
    fig.suptitle(
        f"Targets: the latest figure of each phase, up to {latest['started_at'][:16]} UTC"
        f" (PostgreSQL {version})"
    )
    return _save(plt, fig, out / "targets.png")


def _peer_ratios(results: Path) -> list[tuple[datetime, dict[str, float]]]:
    """For each side-by-side run kept: dataloader's median drain over each peer's."""
    runs: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for f in (results / "peers").glob("*-*-*.json"):
        data = json.loads(f.read_text())
        stamp = "-".join(f.name.split("-")[:3])
        runs[stamp][data["system"]].append(data["drain_jobs_per_s"])
    ratios = []
    for stamp, systems in sorted(runs.items()):
        if US not in systems:
            continue
        ours = statistics.median(systems[US])
        when = datetime.strptime(stamp, "%Y-%m-%dT%H%M")
        peers = {s: ours / statistics.median(v) for s, v in systems.items() if s != US}
        ratios.append((when, peers))
    return ratios


def draw_history(plt: Any, suite: list[dict[str, Any]], results: Path, out: Path) -> Path | None:
    """Left: the suite's drain and HTTP trigger across the result files kept (absolute: the
    machine's own speed varies from day to day). Right: dataloader's drain over each peer's,
    measured in the same run (what a slower or faster day cannot move)."""
    series = {
        "drain c10 (jobs/s)": ("drain_c10", "jobs_per_s"),
        "HTTP trigger (req/s)": ("http_trigger", "requests_per_s"),
    }
    ratios = _peer_ratios(results)
    if not suite and not ratios:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    for (label, (phase, metric)), marker in zip(series.items(), "os", strict=True):
        values = [
            (
                datetime.fromisoformat(r["started_at"]).replace(tzinfo=None),
                r["phases"][phase][metric],
            )
            for r in suite
            if phase in r["phases"]
        ]
        left.plot([t for t, _ in values], [v for _, v in values], marker=marker, label=label)
    left.set_title("dataloader's suite, one run a file (absolute: noisy)", fontsize=10)
    left.set_ylim(bottom=0)
    left.legend(fontsize=8)
    for peer in sorted({p for _, peers in ratios for p in peers}):
        points = [(when, peers[peer]) for when, peers in ratios if peer in peers]
        right.plot([t for t, _ in points], [r for _, r in points], marker="o", label=peer)
    right.axhline(1.0, color="black", linewidth=1)
    right.set_title("drain: dataloader / peer, same run (medians)", fontsize=10)
    right.set_ylim(bottom=0)
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle("History")
    return _save(plt, fig, out / "history.png")


#: The series of `slots.png`: `drain_slots`'s kind prefixes, with their labels.
SLOT_SERIES = {
    "lock_free": "dataloader, no lock_key",
    "keyed": "dataloader, a lock_key each",
    "pgqueuer": "pgqueuer",
}


def draw_slots(plt: Any, latest: dict[str, Any], out: Path) -> Path | None:
    """The latest `drain_slots`: jobs/s and server CPU per job against the slots."""
    result = latest["phases"].get("drain_slots")
    if result is None:
        return None
    slots = result["slots"]
    fig, (rate, cpu) = plt.subplots(1, 2, figsize=(11, 4.2))
    for prefix, label in SLOT_SERIES.items():
        rates = [result.get(f"{prefix}_{n}_jobs_per_s") for n in slots]
        if None in rates:
            continue
        rate.plot(slots, rates, marker="o", label=label)
        # the peer's CPU counts its enqueue too (the harness times its phases apart)
        cpus = [
            result.get(f"{prefix}_{n}_server_cpu_us_per_job")
            or result.get(f"{prefix}_{n}_server_cpu_us_per_job_with_enqueue")
            for n in slots
        ]
        cpu.plot(slots, cpus, marker="o", label=label)
    rate.set_title("drain (jobs/s)", fontsize=10)
    cpu.set_title("server CPU per job (µs; pgqueuer's with its enqueue)", fontsize=10)
    for ax in (rate, cpu):
        ax.set_xlabel("slots (worker concurrency)")
        ax.set_xticks(slots)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(f"One worker process, {result['jobs']:,} no-op jobs, medians of alternating runs")
    return _save(plt, fig, out / "slots.png")


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def draw_all(results: Path = RESULTS, out: Path = OUT) -> list[Path]:
    """Draw every chart the results allow; the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suite = suite_results(results)
    drawn = [draw_peers(plt, results, out), draw_history(plt, suite, results, out)]
    if suite:
        latest = latest_of_each_phase(suite)
        drawn += [draw_targets(plt, latest, out), draw_slots(plt, latest, out)]
    return [p for p in drawn if p is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("matplotlib is not installed: pip install -e '.[bench]'")
    for path in draw_all(args.results, args.out):
        print(path)


if __name__ == "__main__":
    main()
