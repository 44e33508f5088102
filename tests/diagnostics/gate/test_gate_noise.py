"""The gate does not cry wolf on this noisy 2-core host: the same scenario run twice, for five
seeds, is "no change" each time, and the gate passes (issue 21's "Done when").

All ten runs are started together and each is held (SIGSTOP) as it reaches its first step,
until every one has: then all step at once, under the same load. Without the hold, the runs
that finished importing first stepped while the others still imported, and the order
showed: in five pairs started a then b, b was faster each time (medians 0.53-0.84 of a's, p
down to 0.021). Two twins alone, pair after pair, did no better (282 against 135 ms a step,
p = 0.007). The runs are the smallest that
still give a steady-state sample: the CPU-sized model, 9 fine-tuning steps (8 steady, so the
exact test can reach p = 2 / C(16, 8) = 0.00016), no profiler window (its steps are
slower by design) and one thread each."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diagnostics.__main__ import main as diagnostics_main

REPO_ROOT = Path(__file__).resolve().parents[3]
SEEDS = (1, 2, 3, 4, 5)
SMALL_RUN_ARGS = (
    "--scenario", "healthy", "--device", "cpu", "--steps", "9",
    "--set", "data.rows=240", "--set", "train.pretrain_steps=0",
    "--set", "train.checkpoint_every=1000", "--set", "runtime.threads=1",
    "--set", "profiler.enabled=false",
)  # fmt: skip


def _start(runs_dir: Path, run_id: str, seed: int) -> subprocess.Popen[bytes]:
    log = (runs_dir / f"{run_id}.err").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", *SMALL_RUN_ARGS, "--set", f"seed={seed}",
         "--run-id", run_id, "--runs-dir", str(runs_dir)],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip


def _hold_until_all_reach_their_steps(procs: dict[str, subprocess.Popen[bytes]], runs_dir: Path):
    """SIGSTOP each run when it logs its fine-tuning phase's start (trainer/loop.py, just
    before step 1, which steady_steps leaves out), and return once every run is stopped."""
    waiting = dict(procs)
    deadline = time.monotonic() + 500.0
    while waiting:
        assert time.monotonic() < deadline, f"never reached step 1: {sorted(waiting)}"
        for run_id, proc in list(waiting.items()):
            if b"finetune: steps" in (runs_dir / f"{run_id}.err").read_bytes():
                os.kill(proc.pid, signal.SIGSTOP)
                del waiting[run_id]
            else:
                assert proc.poll() is None, (runs_dir / f"{run_id}.err").read_text()[-3000:]
        time.sleep(0.05)


@pytest.fixture(scope="module")
def twin_runs(tmp_path_factory) -> dict[int, tuple[Path, Path]]:
    runs_dir = tmp_path_factory.mktemp("twin_runs")
    ids = {seed: (f"seed{seed}-a", f"seed{seed}-b") for seed in SEEDS}
    procs = {run_id: _start(runs_dir, run_id, seed) for seed in SEEDS for run_id in ids[seed]}
    try:
        _hold_until_all_reach_their_steps(procs, runs_dir)
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
    for run_id, proc in procs.items():
        assert proc.wait(timeout=600) == 0, (runs_dir / f"{run_id}.err").read_text()[-3000:]
    pairs = {seed: (runs_dir / a, runs_dir / b) for seed, (a, b) in ids.items()}
    return pairs


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_the_same_scenario_twice_is_no_change(twin_runs, seed, tmp_path, capsys):
    first, second = twin_runs[seed]
    out = tmp_path / "gate.json"
    code = diagnostics_main(["gate", str(first), str(second), "--json", str(out)])
    doc = json.loads(out.read_text())
    verdicts = {m["key"]: (m["verdict"], m["reason"]) for m in doc["measures"]}
    capsys.readouterr()
    # no change; or, where the twins' wall times differ by who had the two cores (the
    # steps less their wait for a CPU alike), inconclusive for that reason: never a claim
    for key in ("step_time_ms", "throughput"):
        verdict, reason = verdicts[key]
        assert verdict == "no change" or (
            verdict == "inconclusive" and "the difference is CPU contention" in reason
        ), verdicts
    assert code == 0 and not doc["failed"], verdicts
