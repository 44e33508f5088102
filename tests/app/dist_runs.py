"""Real 2-rank runs of the reference trainer (torchrun, gloo on CPU) for the rank-view tests.

Tiny: six fine-tuning steps of eight samples, no DataLoader workers; about 15-30 s each on
the shared 2-core machine.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import TINY_DIST_ARGS, run_trainer_cli

SMALL_RUN_ARGS = (*TINY_DIST_ARGS, "--steps", "6")


def make_run(runs_dir: Path, scenario: str, run_id: str, nproc: int = 2) -> Path:
    """One completed run of ``scenario`` with ``nproc`` processes (1: no torchrun)."""
    args = ["run", "--scenario", scenario, "--run-id", run_id, *SMALL_RUN_ARGS]
    if nproc > 1:
        args += ["--nproc-per-node", str(nproc)]
    result = run_trainer_cli([*args, "--runs-dir", str(runs_dir)], timeout_s=300.0)
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(result.stdout.strip().splitlines()[-1])
