#!/usr/bin/env bash
# The GPU check (a CUDA machine; under 5 minutes): the gpu-marked tests, then a short
# profiled run of every scenario on cuda, each analysed, with a one-line summary per run.
# Usage: scripts/gpu_check.sh [RUNS_DIR]   (default: a fresh temporary folder)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || { scripts/setup.sh dev; }
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: nothing to check')"
RUNS_DIR="${1:-$(mktemp -d -t pipeline-doctor-gpu-XXXXXX)}"
started=$(date +%s)

echo "== gpu-marked tests"
"$PY" -m pytest -m gpu -q tests

echo "== a short profiled run of each scenario on cuda (runs in $RUNS_DIR)"
for scenario in healthy slow-loader no-pin-memory unstable leak small-batch; do
  run_dir=$("$PY" -m trainer run --scenario "$scenario" --device cuda --steps 20 \
    --runs-dir "$RUNS_DIR" 2>"$RUNS_DIR/$scenario.stderr" | tail -n 1)
  "$PY" - "$run_dir" <<'PYEOF'
import sys
from diagnostics.runs import RunFolder
run = RunFolder(sys.argv[1])
steps, status = run.steps(), run.status()
assert status.status == "completed", f"{run.path}: {status.status} {status.reason}"
assert run.trace_files(), f"{run.path}: no trace"
assert steps["cuda_peak_bytes"].null_count() == 0, f"{run.path}: no CUDA memory stats"
median = steps["step_time_ms"].median()
print(f"{run.manifest().scenario:14s} {status.status:9s} {steps.height:3d} steps "
      f"median {median:7.1f} ms  data wait {steps['data_wait_ms'].median():6.1f} ms  "
      f"peak {steps['cuda_peak_bytes'].max() / 2**20:7.1f} MiB  {run.path}")
PYEOF
  "$PY" -m diagnostics analyze "$run_dir" --format text >"$run_dir.analysis.txt" 2>&1 \
    || echo "   (analyse failed: see $run_dir.analysis.txt)"
done
echo "== done in $(( $(date +%s) - started )) s"
