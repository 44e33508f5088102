"""Every scenario runs to completion through the CLI and leaves a complete run folder."""

from __future__ import annotations

import math

import pytest

from diagnostics.runs import RunFolder
from trainer.config import SCENARIOS, TrainerConfig

# real training jobs, tens of seconds: `-m 'not slow'` skips them while iterating
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(scenario_runs):
    """The session's one tiny run per scenario (tests/conftest.py), as run folders."""
    return {name: RunFolder(path) for name, path in scenario_runs.items()}


def _config(run) -> TrainerConfig:
    return TrainerConfig.from_dict(run.manifest().config)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario_completes_with_a_complete_folder(runs, scenario):
    run = runs[scenario]
    config = _config(run)
    total = config.train.pretrain_steps + config.train.steps
    assert config.scenario == scenario
    assert run.status().status == "completed"
    assert (run.status().step, run.status().total_steps) == (total, total)
    assert run.steps()["step"].to_list() == list(range(1, total + 1))
    assert run.steps()["loss"].null_count() == 0
    assert run.samples().height > 0
    assert len(run.trace_files()) == 1
    assert run.checkpoints()  # the final step is always checkpointed
    assert (run.path / "steps.parquet").exists() and (run.path / "samples.parquet").exists()
    assert (run.path / "tokenizer.json").exists() and "completed after" in run.log_tail()


def test_slow_loader_waits_at_least_its_simulated_latency(runs):
    # each sample sleeps data.sample_latency_ms (2 ms) in __getitem__ in the training
    # process (no workers): every step waits at least batch_size x 2 ms for its batch
    config = _config(runs["slow-loader"])
    assert (config.data.num_workers, config.data.sample_latency_ms) == (0, 2.0)
    waits = runs["slow-loader"].steps()["data_wait_ms"]
    assert waits.min() >= config.train.batch_size * 2.0
    healthy = runs["healthy"].steps()["data_wait_ms"]
    assert waits.median() > healthy.median()


def test_no_pin_memory_says_it_has_no_effect_on_cpu(runs):
    notes = runs["no-pin-memory"].manifest().notes
    assert any("pin_memory=false has no effect on CPU" in note for note in notes)
    assert runs["no-pin-memory"].manifest().config["data"]["pin_memory"] is False


def test_unstable_gradient_norm_climbs_without_clipping(runs):
    grad_norm = runs["unstable"].steps()["grad_norm"].to_list()
    # lr 1.0 x weight decay 2.3 scales every weight by -1.3 a step: within six steps the
    # norm is far above its start; nothing clips it. How far depends on the session's
    # tokenizer (WordPiece training breaks ties in hash order, so each fresh one numbers
    # tokens differently): 8x to 54x over six fresh tokenizers, while healthy's never
    # exceeds its first step's. 5x keeps that margin without depending on the draw.
    finite = [g for g in grad_norm if math.isfinite(g)]
    assert max(finite) > 5 * grad_norm[0]
    healthy = runs["healthy"].steps()["grad_norm"].to_list()
    assert max(finite) / grad_norm[0] > 2 * max(healthy) / healthy[0]
    assert runs["unstable"].manifest().config["train"]["grad_clip"] is None


def test_small_batch_trains_batches_of_two(runs):
    steps = runs["small-batch"].steps()
    assert (steps["batch_size"] == 2).all()


def test_leak_flags_are_recorded_in_the_config(runs):
    train = runs["leak"].manifest().config["train"]
    assert train["accumulate_loss_as_tensor"] is True
    assert train["keep_batch_history"] is True


def test_fp32_runs_on_cpu_without_amp(runs):
    # on CPU the fp32 scenario is the healthy run: no autocast, no scaler, no AMP note
    config = _config(runs["fp32"])
    assert (config.train.amp, config.train.tf32) == ("off", False)
    assert runs["fp32"].steps()["amp_scale"].null_count() == runs["fp32"].steps().height
    assert not any("train.amp" in note for note in runs["fp32"].manifest().notes)
    assert runs["fp32"].manifest().environment["fp32_matmul_precision"] is None  # CUDA only
