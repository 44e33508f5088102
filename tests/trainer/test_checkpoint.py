"""Checkpoints load with weights_only=True: RNG states as tensors and plain types, a crafted
file runs no code, an unusable newest file is set aside for the one before it."""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from diagnostics.runs import RunFolder, RunWriter
from tests.conftest import REPO_ROOT, run_trainer_cli
from trainer import checkpoint
from trainer.config import build_config


class _Payload:
    """Unpickling this calls os.system: what a crafted step_*.pt in a run folder does."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _malicious(path: Path, marker: Path, *, zip_format: bool) -> Path:
    payload = {"format": checkpoint.CHECKPOINT_FORMAT, "model": _Payload(marker)}
    if zip_format:  # torch.save's own layout, as a real checkpoint looks
        torch.save(payload, path)
    else:  # a bare pickle: torch.load reads the legacy format too
        path.write_bytes(pickle.dumps(payload, protocol=2))
    return path


@pytest.mark.parametrize("zip_format", [True, False])
def test_a_crafted_checkpoint_runs_no_code_when_loaded(tmp_path, zip_format):
    marker = tmp_path / "pwned"
    path = _malicious(tmp_path / "step_00000009.pt", marker, zip_format=zip_format)
    with pytest.raises(checkpoint.CheckpointError, match=r"^step_00000009.pt: not loadable"):
        checkpoint.load(path)
    assert not marker.exists()
    # the file is really hostile: the loader the trainer used before runs it
    code = f"import torch; torch.load({str(path)!r}, weights_only=False)"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=False)
    assert marker.exists()


def test_rng_states_round_trip_through_a_weights_only_load(tmp_path):
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    random.gauss(0, 1)  # a cached Gaussian in both generators: part of their state
    np.random.standard_normal()
    torch.save({"rng": checkpoint.capture_rng(cuda=False)}, tmp_path / "rng.pt")
    expected = (random.random(), random.gauss(0, 1), np.random.rand(3), torch.rand(3))
    checkpoint.restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True)["rng"], cuda=False)
    again = (random.random(), random.gauss(0, 1), np.random.rand(3), torch.rand(3))
    assert again[:2] == expected[:2]
    assert np.array_equal(again[2], expected[2]) and torch.equal(again[3], expected[3])


def _state(step: int) -> dict:
    return {
        "format": checkpoint.CHECKPOINT_FORMAT,
        "position": {"step": step, "phase": "finetune", "epoch": 0, "batch_in_epoch": step},
        "model": {"w": torch.full((2,), float(step))},
        "optimizer": {"state": {}, "param_groups": []},
        "scaler": {},
        "rng": checkpoint.capture_rng(cuda=False),
        "total_loss": 1.5,
        "nonfinite_steps": 0,
        "first_nonfinite_step": None,
        "evaluations": [],
    }


def test_unusable_newer_checkpoints_are_set_aside_for_the_previous_one(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    for step in (4, 8):
        torch.save(_state(step), checkpoint.checkpoint_path(tmp_path, step))
    newest = checkpoint.checkpoint_path(tmp_path, 8)
    newest.write_bytes(newest.read_bytes()[:1000])  # torn
    foreign = checkpoint.checkpoint_path(tmp_path, 12)
    torch.save({"format": 1, "rng": {}}, foreign)  # the old pickled format
    notes: list[str] = []
    restored = checkpoint.load_latest_intact(tmp_path, "cpu", notes.append)
    assert restored.path == checkpoint.checkpoint_path(tmp_path, 4)
    assert restored.state["position"]["step"] == 4
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step_00000004.pt",
        "step_00000008.pt.corrupt",
        "step_00000012.pt.corrupt",
    ]
    assert [note.split(":")[0] for note in notes] == [
        "checkpoint step_00000012.pt",
        "checkpoint step_00000008.pt",
    ]
    assert "format 1, this trainer reads 2" in notes[0]
    assert "set aside as step_00000008.pt.corrupt" in notes[1]


TINY = {
    "data.rows": 200,
    "train.pretrain_steps": 0,
    "data.num_workers": 0,
    "runtime.threads": 1,
    "instruments.enabled": False,
}


def test_resume_with_a_crafted_checkpoint_refuses_it_and_runs_no_code(tmp_path):
    """The reproduction from the report: a step_*.pt dropped into a preempted run."""
    config = build_config("healthy", TINY, steps=2, device="cpu")
    writer = RunWriter.create(tmp_path, config.to_dict(), {}, run_id="preempted", total_steps=2)
    writer.finalise("preempted", "SIGTERM received: checkpointed for resume")
    marker = tmp_path / "pwned"
    _malicious(checkpoint.checkpoint_path(writer.path, 1), marker, zip_format=True)
    result = run_trainer_cli(["resume", str(writer.path)], timeout_s=240)
    assert not marker.exists()
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    run = RunFolder(writer.path)
    status = run.status()
    assert status.status == "completed"
    # nothing intact to resume from: it started over, and says what it set aside
    assert status.reason.startswith("resumed from the start (no intact checkpoint); set aside")
    assert run.steps()["step"].to_list() == [1, 2]
    assert (writer.path / "checkpoints" / "step_00000001.pt.corrupt").exists()
    notes = json.loads((writer.path / "run.json").read_text())["notes"]
    assert any(note.startswith("checkpoint step_00000001.pt: not loadable") for note in notes)
    assert "set aside as step_00000001.pt.corrupt" in run.log_tail()


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"total_loss": "1.5"}, "total_loss is str, expected a number"),
        ({"position": {"step": 8}}, "position is dict, expected the training position's fields"),
        ({"evaluations": None}, "evaluations is NoneType, expected a list"),
        ({"optimizer": {"state": {}}}, "optimizer is dict, expected a state dict"),
    ],
)
def test_a_newest_checkpoint_whose_fields_cannot_apply_is_set_aside(tmp_path, change, problem):
    (tmp_path / "checkpoints").mkdir()
    torch.save(_state(4), checkpoint.checkpoint_path(tmp_path, 4))
    torch.save({**_state(8), **change}, checkpoint.checkpoint_path(tmp_path, 8))
    notes: list[str] = []
    restored = checkpoint.load_latest_intact(tmp_path, "cpu", notes.append)
    assert restored.state["position"]["step"] == 4
    assert restored.set_aside == (f"step_00000008.pt: {problem}",)


def test_a_checkpoint_that_does_not_fit_the_model_is_set_aside():
    """check_fits against a real model and optimiser: what load_state_dict would refuse
    half-way through (it copies the matching tensors before it raises)."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    trainer = type("T", (), {"model": model, "optimizer": torch.optim.SGD(model.parameters())})
    good = {"model": model.state_dict(), "optimizer": trainer.optimizer.state_dict()}
    assert checkpoint.check_fits(trainer, good) is None
    wide = {**good, "model": {**good["model"], "0.weight": torch.zeros(4, 3)}}
    assert (
        checkpoint.check_fits(trainer, wide)
        == "model parameter 0.weight is (4, 3), the model's is (2, 3)"
    )
    fewer = {**good, "model": {k: v for k, v in good["model"].items() if k != "1.bias"}}
    assert checkpoint.check_fits(trainer, fewer).startswith("model parameters differ (1.bias")
    groups = {**good, "optimizer": {"state": {}, "param_groups": [{"params": [0, 1]}]}}
    assert (
        checkpoint.check_fits(trainer, groups)
        == "optimizer parameter groups differ from the model's"
    )
