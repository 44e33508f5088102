#!/usr/bin/env bash
# Sets everything up (dev tools, Debian's chromium) and runs the whole suite:
# ruff (lint and format check), hadolint on the Dockerfile, then pytest.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/trainer -k resume
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/hadolint Dockerfile
exec .venv/bin/python -m pytest "$@"
