#!/usr/bin/env bash
# Side-by-side with the peers (pgqueuer, procrastinate) through the shared harness in
# ../shared/bench, on its PostgreSQL 15 (default durability), our adapter added from
# benchmarks/bench_adapters/. Results and SUMMARY.md go to benchmarks/results/peers/.
#   benchmarks/peers.sh                  # RUNS=3 alternating runs of every system
#   RUNS=1 N=2000 benchmarks/peers.sh    # smoke
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
bench=${BENCH_HARNESS:-$repo/../shared/bench}
venvs=${VENVS:-/tmp/bench-venvs}

[ -d "$venvs/pgqueuer" ] && [ -d "$venvs/procrastinate" ] || VENVS=$venvs "$bench/setup_venvs.sh"
if [ ! -x "$venvs/dataloader/bin/python" ]; then
  python3 -m venv "$venvs/dataloader"
  "$venvs/dataloader/bin/pip" install --quiet -e "$repo"
fi

export BENCH_ADAPTER_PATH=$here/bench_adapters
export SYSTEMS=${SYSTEMS:-"pgqueuer procrastinate pgqueuer_defaults:pgqueuer dataloader"}
export RESULTS=${RESULTS:-$here/results/peers}
export VENVS=$venvs
exec "$bench/compare.sh"
