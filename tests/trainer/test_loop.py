"""The training loop in-process: the leak flags, non-finite steps, the runtime budget."""

from __future__ import annotations

import math

import polars as pl
import pytest
import torch

from diagnostics.runs import RunFolder, RunWriter
from trainer.config import build_config
from trainer.loop import Trainer
from trainer.run_io import SafeWriter
from trainer.runtime import StopRequests, choose_threads

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = {
    "data.rows": 300,
    "data.num_workers": 0,
    "train.batch_size": 16,
    "train.pretrain_steps": 1,
    "instruments.enabled": False,
}


def _trainer(tmp_path, scenario, steps, **overrides):
    config = build_config(scenario, {**SMALL, **overrides}, steps=steps, device="cpu")
    writer = SafeWriter(RunWriter.create(tmp_path, config.to_dict(), {"device": "cpu"}))
    return Trainer(config, writer, device="cpu", cache_dir=tmp_path / "cache", stop=StopRequests())


def test_leak_flags_keep_graphs_and_batches(tmp_path):
    trainer = _trainer(tmp_path, "leak", steps=4)
    assert trainer.run().status == "completed"
    # `total_loss += loss` made the running total a tensor chained to every step's graph
    assert isinstance(trainer.total_loss, torch.Tensor)
    assert trainer.total_loss.grad_fn is not None
    # one history entry per optimiser step (1 masked-LM + 4 fine-tuning), each keeping its
    # batch and, for fine-tuning, the encoder output of 16 x 32 tokens x 192 floats
    assert len(trainer.batch_history) == 5
    _, hidden = trainer.batch_history[-1]
    assert hidden.shape == (16, 32, 192)


def test_healthy_keeps_a_plain_float_and_no_history(tmp_path):
    trainer = _trainer(tmp_path, "healthy", steps=2)
    trainer.run()
    assert isinstance(trainer.total_loss, float)
    assert trainer.batch_history == []


def test_unstable_records_non_finite_steps_and_carries_on(tmp_path):
    trainer = _trainer(tmp_path, "unstable", steps=60)
    outcome = trainer.run()
    assert outcome.status == "completed"
    trainer.writer.finalise("completed")
    steps = RunFolder(trainer.run_dir).steps()
    assert steps.height == 61  # every step recorded, the non-finite ones included
    bad = steps.filter(~pl.col("loss").is_finite() | ~pl.col("grad_norm").is_finite())
    assert bad.height == trainer.nonfinite_steps > 0
    first = bad["step"].min()
    assert first == trainer.first_nonfinite_step
    # spikes first: the gradient norm climbs by orders of magnitude before it overflows
    before = steps.filter(pl.col("step") < first)["grad_norm"]
    assert before.max() > 1000 * before[0]
    notes = RunFolder(trainer.run_dir).manifest().notes
    assert any(f"first at step {first}" in n for n in notes)
    assert any(f"{bad.height} of 61 steps had a non-finite" in n for n in notes)
    assert all(math.isfinite(e["category_accuracy"]) for e in trainer.evaluations)


def test_runtime_budget_stops_cleanly_with_a_checkpoint(tmp_path):
    trainer = _trainer(tmp_path, "healthy", steps=100_000, **{"train.max_runtime_s": 3.0})
    outcome = trainer.run()
    assert outcome.status == "cancelled"
    assert "train.max_runtime_s budget of 3 s reached" in outcome.reason
    assert 0 < outcome.steps_done < 100_001
    assert trainer.checkpoint_path(outcome.steps_done).exists()
    notes = RunFolder(trainer.run_dir).manifest().notes
    assert any(n.startswith("stopped early: train.max_runtime_s") for n in notes)


def test_threads_leave_cores_for_workers():
    config = build_config("healthy", {"data.num_workers": 1})
    # 2 cores, 1 worker: one intra-op thread for the trainer
    assert choose_threads(config, cores=2, device="cpu") == 1
    assert choose_threads(build_config("slow-loader"), cores=2, device="cpu") == 2
    # never below one, however many workers
    assert choose_threads(build_config("healthy", {"data.num_workers": 8}), 2, "cpu") == 1
    assert choose_threads(build_config("healthy", {"runtime.threads": 3}), 2, "cpu") == 3
