#!/usr/bin/env bash
# Sets everything up, then serves the app on http://127.0.0.1:8501 with the embedded
# default: runs kept as folders under ./runs, no database or other service. On loopback
# it needs no sign-in; scripts/serve.py requires one on any other address (docs/SECURITY.md).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh runtime
export PIPELINE_DOCTOR_RUNS_DIR="${PIPELINE_DOCTOR_RUNS_DIR:-$PWD/runs}"
exec .venv/bin/python scripts/serve.py "$@"
