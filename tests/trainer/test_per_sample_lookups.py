"""The per-sample-lookups scenario with the real trainer and the real analyser.

One module fixture shares four tiny CPU runs (20 fine-tuning steps, no pretraining, one
torch thread, no profiler): the scenario, then side by side its re-run with the finding's
patch, the scenario again as the speed baseline that shares the re-run's machine load, and
a copy of the patched run stopped with SIGTERM at step 6 and resumed. Expected read counts
come from the config (one read per sample; batched, one per crc32 shard touched), not
from the code under test.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from diagnostics.analyze import analyze
from diagnostics.runs import RunFolder
from tests.conftest import REPO_ROOT, run_trainer_cli
from tests.run_timing import raise_priority, shared_window, steps_per_s_within
from trainer.config import split_sizes
from trainer.data import order_key

pytestmark = pytest.mark.slow

ROWS, STEPS, BATCH, SHARDS = 200, 20, 32, 4
# the patched run and its baseline, timed against each other over the seconds both trained
# in: at 20 steps (~3 s each at a raised priority) CI once started one ~4 s after the other
# and they shared 1 s; their first STEPS steps are the other runs' (the data order and the
# learning rate do not depend on the run's length)
TIMED_STEPS = 60
ARGS = (
    "--scenario",
    "per-sample-lookups",
    "--device",
    "cpu",
    "--set",
    f"data.rows={ROWS}",
    "--set",
    "train.pretrain_steps=0",
    "--set",
    "runtime.threads=1",
    "--set",
    "train.checkpoint_every=4",
    "--set",
    "profiler.enabled=false",
)


def _start(
    runs_dir: Path, run_id: str, *extra: str, steps: int = STEPS, measured: bool = False
) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", *ARGS, "--steps", str(steps), *extra]
        + ["--runs-dir", str(runs_dir), "--run-id", run_id],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=raise_priority if measured else None,
    )


def _finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]


def _wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    lines = run_dir / "steps.jsonl"
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be stopped"
        if lines.exists():
            done = [json.loads(x)["step"] for x in lines.read_text().splitlines() if x.strip()]
            if done and max(done) >= step:
                return
        time.sleep(0.02)
    raise AssertionError(f"no step {step} within 240 s")


def _patch_args(patch: dict) -> list[str]:
    return [arg for key, value in patch.items() for arg in ("--set", f"{key}={value}")]


def _finding(result, rule: str):
    return next((f for f in result.findings if f.rule == rule), None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("per_sample_lookups")
    scenario = _start(runs_dir, "scenario")
    _finish(scenario)
    result = analyze(runs_dir / "scenario")
    found = _finding(result, "per-sample-lookups")
    assert found is not None, [f.rule for f in result.findings]
    patch = _patch_args(found.fix.config_patch)
    # the two runs timed against each other share the cores with each other only: at the
    # priority of other tests' processes the cores are saturated, and the baseline's extra
    # 48 ms of reads a step (sleeps) are CPU time the others use anyway (CI once measured
    # 1.55 fixed against 1.60 baseline steps/s)
    fixed = _start(runs_dir, "fixed", *patch, steps=TIMED_STEPS, measured=True)
    baseline = _start(runs_dir, "baseline", steps=TIMED_STEPS, measured=True)
    stopped = _start(runs_dir, "stopped", *patch)
    _wait_for_step(runs_dir / "stopped", 6, stopped)
    stopped.send_signal(signal.SIGTERM)
    stopped.communicate(timeout=120)
    assert stopped.returncode == 0  # preempted cleanly with a checkpoint
    for proc in (fixed, baseline):
        _finish(proc)
    resumed = run_trainer_cli(["resume", str(runs_dir / "stopped")], timeout_s=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return {
        "scenario": result,
        "finding": found,
        "fixed": analyze(runs_dir / "fixed"),
        "baseline": analyze(runs_dir / "baseline"),
        "folders": {name: RunFolder(runs_dir / name) for name in ("scenario", "fixed", "stopped")},
    }


def _batch_indices(steps: int) -> list[list[int]]:
    """The fine-tuning batches' training-row indices: the sampler's permutation, keyed by
    (seed 0, finetune, epoch), cut into batches of 32 with the tail dropped."""
    n_train, _ = split_sizes(ROWS)
    out: list[list[int]] = []
    epoch = 0
    while len(out) < steps:
        order = np.random.default_rng(order_key(0, "finetune", epoch)).permutation(n_train)
        out += [order[i : i + BATCH].tolist() for i in range(0, n_train - BATCH + 1, BATCH)]
        epoch += 1
    return out[:steps]


def test_the_scenario_records_one_read_per_sample(runs):
    steps = runs["folders"]["scenario"].steps()
    assert steps["store_reads"].to_list() == [BATCH] * STEPS
    assert steps["store_keys"].to_list() == [BATCH] * STEPS
    # 2 ms simulated round trip a read: at least 64 ms of reads a batch
    assert steps["store_read_ms"].min() >= BATCH * 2.0


def test_the_rule_fires_with_the_reads_and_their_share_of_the_wait(runs):
    found = runs["finding"]
    ev = found.evidence
    assert ev["store_reads_per_batch_median"] == BATCH
    assert ev["store_reads_per_sample"] == 1.0
    assert ev["embedding_lookup"] == "per-sample" and ev["embedding_shards"] == SHARDS
    assert ev["store_read_ms_per_read"] >= 2.0
    # no workers: the reads happen inside the wait, so they are most of it but not more
    assert 50.0 <= ev["store_read_share_of_data_wait_pct"] <= 100.0
    assert found.fix.config_patch == {"data.embedding_lookup": "batched"}
    assert "__getitems__" in found.fix.code and "batch_get" in found.fix.code
    assert "# before" in found.fix.code and "# after" in found.fix.code
    json.dumps(found.to_dict(), allow_nan=False)


def test_the_patched_run_reads_once_per_shard_and_the_finding_is_gone(runs):
    steps = runs["folders"]["fixed"].steps()
    expected = [
        len({zlib.crc32(index.to_bytes(8, "big")) % SHARDS for index in batch})
        for batch in _batch_indices(TIMED_STEPS)
    ]
    assert steps["store_reads"].to_list() == expected
    assert steps["store_keys"].to_list() == [BATCH] * TIMED_STEPS
    assert _finding(runs["fixed"], "per-sample-lookups") is None
    assert _finding(runs["baseline"], "per-sample-lookups") is not None


def test_the_patched_run_is_faster_than_the_baseline_beside_it(runs):
    # direction only: 64 ms of reads a batch against 8, on a shared 2-core host, over the
    # seconds both trained in (so both met the same load)
    fixed, baseline = runs["fixed"].run.steps, runs["baseline"].run.steps
    window = shared_window(fixed, baseline)
    assert steps_per_s_within(fixed, window) > steps_per_s_within(baseline, window)
    fixed_wait = runs["folders"]["fixed"].steps()["data_wait_ms"].median()
    scenario_wait = runs["folders"]["scenario"].steps()["data_wait_ms"].median()
    assert fixed_wait < 0.5 * scenario_wait


def test_the_switch_changes_the_reads_not_the_numbers(runs):
    # the same vectors reach the model either way: per-sample and batched losses are equal
    per_sample = runs["folders"]["scenario"].steps()["loss"].to_list()
    batched = runs["folders"]["fixed"].steps()["loss"].to_list()
    assert len(per_sample) == STEPS and per_sample == batched[:STEPS]


def test_a_preempted_run_with_a_store_resumes_bit_exactly(runs):
    stopped, fixed = runs["folders"]["stopped"], runs["folders"]["fixed"]
    assert stopped.status().status == "completed"
    assert "resumed from step_" in stopped.log_tail()
    assert stopped.steps()["step"].to_list() == list(range(1, STEPS + 1))
    assert stopped.steps()["loss"].to_list() == fixed.steps()["loss"].to_list()[:STEPS]
