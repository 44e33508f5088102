"""Every scenario runs to completion through the CLI and leaves a complete run folder."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from diagnostics.runs import RunFolder
from tests.conftest import REPO_ROOT, TINY_RUN_ARGS
from trainer.config import SCENARIOS

# real training jobs, tens of seconds: `-m 'not slow'` skips them while iterating
pytestmark = pytest.mark.slow

TINY_ARGS = list(TINY_RUN_ARGS[2:])  # the tiny run's settings without its scenario
TOTAL = 10  # 2 pre-training + 8 fine-tuning steps


def _args(scenario):
    args = TINY_ARGS
    if scenario == "small-batch":  # keep the preset's batch size, not the tiny run's 16
        cut = args.index("train.batch_size=16")
        args = args[: cut - 1] + args[cut + 1 :]
    return ["--scenario", scenario, *args]


def _assert_complete(run):
    assert run.status().status == "completed"
    assert run.steps()["step"].to_list() == list(range(1, TOTAL + 1))
    assert run.samples().height > 0
    assert len(run.trace_files()) == 1
    assert run.checkpoints()
    assert (run.path / "steps.parquet").exists() and (run.path / "log.txt").exists()


@pytest.fixture(scope="module")
def scenario_runs(tmp_path_factory, tiny_run):
    """Every scenario once (healthy is the session's tiny run)."""
    runs = {"healthy": RunFolder(tiny_run)}
    # side by side: each run is mostly interpreter and import start-up, and together they
    # finish in about the time of two or three in a row on two cores
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "trainer", "run", *_args(name), "--runs-dir", str(tmp)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in SCENARIOS
        if name != "healthy"
        for tmp in [tmp_path_factory.mktemp(name)]
    }
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name}: {err[-3000:]}"
        runs[name] = RunFolder(out.strip().splitlines()[-1])
    return runs


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario_completes_with_a_complete_folder(scenario_runs, scenario):
    run = scenario_runs[scenario]
    _assert_complete(run)
    assert run.manifest().scenario == scenario


def test_slow_loader_waits_at_least_its_simulated_latency(scenario_runs):
    # 16 samples a batch, each sleeping 2 ms in __getitem__ in the training process (no
    # workers): every step waits at least 16 x 2 = 32 ms for its batch
    waits = scenario_runs["slow-loader"].steps()["data_wait_ms"]
    assert waits.min() >= 16 * 2.0
    healthy = scenario_runs["healthy"].steps()["data_wait_ms"]
    assert waits.median() > healthy.median()


def test_no_pin_memory_says_it_has_no_effect_on_cpu(scenario_runs):
    notes = scenario_runs["no-pin-memory"].manifest().notes
    assert any("pin_memory=false has no effect on CPU" in note for note in notes)
    assert scenario_runs["no-pin-memory"].manifest().config["data"]["pin_memory"] is False


def test_unstable_gradient_norm_climbs_without_clipping(scenario_runs):
    grad_norm = scenario_runs["unstable"].steps()["grad_norm"].to_list()
    # lr 1.0 x weight decay 2.3 scales every weight by -1.3 a step: within ten steps the
    # norm is far above its start (here by well over 10x); nothing clips it
    finite = [g for g in grad_norm if math.isfinite(g)]
    assert max(finite) > 10 * grad_norm[0]
    assert scenario_runs["unstable"].manifest().config["train"]["grad_clip"] is None


def test_small_batch_trains_batches_of_two(scenario_runs):
    steps = scenario_runs["small-batch"].steps()
    assert (steps["batch_size"] == 2).all()


def test_leak_flags_are_recorded_in_the_config(scenario_runs):
    train = scenario_runs["leak"].manifest().config["train"]
    assert train["accumulate_loss_as_tensor"] is True
    assert train["keep_batch_history"] is True
