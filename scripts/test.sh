#!/usr/bin/env bash
# Sets everything up (dev tools, Debian's chromium) and runs the whole suite:
# ruff (lint and format check), hadolint on the Dockerfile, actionlint on the CI workflows,
# then pytest.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/trainer -k resume
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/hadolint Dockerfile
.venv/bin/actionlint .github/workflows/*.yml
# three workers (pytest-xdist) on two cores, each test file on one of them (tests/conftest.py
# keeps shared runs together): much of the suite waits on real runs, and with two the cores
# were idle 31 % of the run (fresh clone: 18:27 of tests with two workers, 16:41 with three)
exec .venv/bin/python -m pytest -n 3 --dist loadfile "$@"
