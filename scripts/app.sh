#!/usr/bin/env bash
# Sets everything up, then serves the app on http://127.0.0.1:8501 with the embedded
# default: runs kept as folders under ./runs, no database or other service.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh runtime
export PIPELINE_DOCTOR_RUNS_DIR="${PIPELINE_DOCTOR_RUNS_DIR:-$PWD/runs}"
exec .venv/bin/python -m streamlit run app.py \
  --server.address 127.0.0.1 --server.port "${PORT:-8501}" \
  --server.headless true --browser.gatherUsageStats false "$@"
