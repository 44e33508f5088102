"""Running ``python -m probe profile`` as a user would: a real subprocess, real torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.run_timing import raise_priority

SCRIPTS = REPO_ROOT / "tests" / "scripts"
SLOW_LOADER = SCRIPTS / "slow_loader.py"


def child_env() -> dict[str, str]:
    """One torch thread per process: the host has two cores shared by several jobs."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT))
    env.pop("PIPELINE_DOCTOR_RUNS_DIR", None)
    return env


def profile_command(runs_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "probe", "profile", "--runs-dir", str(runs_dir), *args]


def profile(
    runs_dir: Path, *args: str, timeout_s: float = 240.0, measured: bool = False
) -> subprocess.CompletedProcess:
    """The wrapper's CompletedProcess (text), run from a folder that is not the repo's.
    ``measured``: at a raised priority (tests.run_timing.raise_priority), for a test that
    judges shares of its step times."""
    return subprocess.run(
        profile_command(runs_dir, *args),
        cwd=runs_dir.parent,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        preexec_fn=raise_priority if measured else None,
    )


def run_folder(result: subprocess.CompletedProcess) -> Path:
    """The folder the wrapper printed as its last line of stdout."""
    return Path(result.stdout.strip().splitlines()[-1])


def line_of(path: Path, text: str) -> int:
    """The 1-based line of the first occurrence of ``text`` in ``path``."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {path}")
