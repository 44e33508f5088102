#!/usr/bin/env bash
# The GPU check, on a CUDA machine (sized for ~8 minutes on an H200, estimated from its step
# times; not yet run on one): every scenario at the cpu and
# the gpu size, each run's findings against what the scenario must show, the fix-and-verify
# re-runs, the gpu-marked tests (memory snapshots recorded by the trainer and the wrapper
# included), the instrument overhead at both sizes and the cost of recording memory
# snapshots (history off / python / all stacks, ~3 extra short runs); one Markdown
# summary, whose path is the last line printed. Exit 0 when every required check passed.
#
#   scripts/gpu_check.sh [OPTIONS]                   # .venv/bin/python (made by setup.sh)
#   PYTHON=python3 scripts/gpu_check.sh [OPTIONS]    # an interpreter with the packages already
#
# OPTIONS go to `python -m trainer.gpu_check` (--runs-dir DIR, --summary FILE, --sizes,
# --scenarios, --steps N, --no-tests, --no-bench; see --help). With PYTHON set nothing is
# installed and nothing is downloaded: packages must be installed or on PYTHONPATH (see
# docs/TRAINER.md, "A GPU machine without network", for the wheel bundle).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"
elif [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
else
  scripts/setup.sh dev
  PY=.venv/bin/python
fi
# the project itself is imported from here, whatever PYTHONPATH already holds
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

"$PY" - <<'PYEOF'
import importlib.util, sys
needed = ("torch", "transformers", "tokenizers", "numpy", "polars", "msgspec", "psutil",
          "memory_profiler", "torch_tb_profiler", "pytest")
missing = [name for name in needed if importlib.util.find_spec(name) is None]
if missing:
    sys.exit(f"gpu_check: missing packages for {sys.executable}: {', '.join(missing)} "
             "(docs/TRAINER.md: 'A GPU machine without network')")
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device: nothing to check")
print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, Python {sys.version.split()[0]}")
PYEOF

exec "$PY" -m trainer.gpu_check --device cuda "$@"
