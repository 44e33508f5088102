#!/usr/bin/env bash
# Creates .venv in the project root and installs the pinned dependencies.
# Idempotent: a stamp holding the requirements' checksum skips pip when nothing changed.
# Usage: scripts/setup.sh [runtime|dev|peers]
#   peers: the benchmarks' peer tools, each in a venv of its own under bench/ (HTA 0.5.0 and
#   traceinsight 0.6.1 install the same `hta` package)
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-runtime}"

if [ "$profile" = peers ]; then
  for pair in .venv-peers:requirements-hta.txt .venv-traceinsight:requirements-traceinsight.txt; do
    venv="bench/${pair%%:*}"
    reqs="bench/${pair#*:}"
    stamp="$venv/.installed"
    want="$(sha256sum "$reqs" | cut -d' ' -f1)"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
      echo "setup: installing $reqs into $venv" >&2
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$reqs"
      echo "$want" >"$stamp"
    fi
  done
  exit 0
fi
reqs=requirements.txt
[ "$profile" = dev ] && reqs=requirements-dev.txt

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=".venv/.installed-$profile"
want="$(cat requirements.txt requirements-dev.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing $reqs into .venv" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$reqs"
  echo "$want" >"$stamp"
fi

# the console command (pipeline-doctor): this checkout, editable, no dependencies fetched;
# --no-build-isolation builds with the venv's own setuptools, so it needs no network
if [ ! -x .venv/bin/pipeline-doctor ]; then
  echo "setup: installing the pipeline-doctor command into .venv" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation -e .
fi

# the compiled modules (diagnostics/trace/event_scan.c, diagnostics/facts/nesting/op_nesting.c),
# built in place, again when a source changed; optional: without a C compiler the loader
# reads every chunk with msgspec and the linking nests operators with polars
scanner=(diagnostics/trace/_event_scan.*.so)
nesting=(diagnostics/facts/nesting/_op_nesting.*.so)
if [ ! -f "${scanner[0]}" ] || [ diagnostics/trace/event_scan.c -nt "${scanner[0]}" ] \
  || [ pyproject.toml -nt "${scanner[0]}" ] || [ ! -f "${nesting[0]}" ] \
  || [ diagnostics/facts/nesting/op_nesting.c -nt "${nesting[0]}" ] \
  || [ diagnostics/arrow_c_data.h -nt "${scanner[0]}" ]; then
  echo "setup: building the compiled modules" >&2
  # declared in pyproject.toml; setuptools still calls that table experimental, and says so
  .venv/bin/python -W 'ignore:`[tool.setuptools.ext-modules]`::' \
    -c "from setuptools import setup; setup()" --quiet build_ext --inplace >&2
fi

if [ "$profile" = dev ] && [ ! -x /usr/bin/chromium ]; then
  # The browser tests drive Debian's Chromium; Playwright never downloads a browser here.
  echo "setup: installing Debian's chromium for the browser tests" >&2
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  fi
fi
