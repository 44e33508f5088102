"""trainer.launch: start a detached run, see it active, cancel it, refuse bad forms."""

from __future__ import annotations

import time

import pytest
import torch

from diagnostics.runs import RunFolder
from tests.conftest import run_trainer_cli
from trainer import launch
from trainer.config import ConfigError

# real training jobs, tens of seconds: `-m 'not slow'` skips them while iterating
pytestmark = pytest.mark.slow

OVERRIDES = {
    "data.rows": 300,
    "data.num_workers": 0,
    "train.batch_size": 16,
    "train.pretrain_steps": 0,
    # slow enough that the run is still going when the cancel arrives
    "data.sample_latency_ms": 5.0,
}


def _wait(predicate, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_start_then_cancel_round_trip(tmp_path):
    started = launch.start_run(
        scenario="healthy",
        overrides=OVERRIDES,
        runs_dir=tmp_path,
        steps=400,
        device="cpu",
        instruments=False,
    )
    # the folder exists when start_run returns
    run = RunFolder(started.run_dir)
    assert started.run_dir == tmp_path / started.run_id
    assert run.manifest().config["data"]["num_workers"] == 0
    assert run.status().pid == started.pid
    assert [r.run_id for r in launch.active_runs(tmp_path)] == [started.run_id]
    assert _wait(lambda: run.status().step >= 1), "no step recorded"

    launch.cancel_run(started.run_dir)
    assert _wait(lambda: run.status().is_final), "the run did not stop"
    status = run.status()
    assert status.status == "cancelled"
    assert status.reason == "cancel requested"
    assert status.step < 400 + 0
    assert launch.active_runs(tmp_path) == []
    # records were finalised: parquet written, steps up to the cancel kept
    assert run.steps()["step"].to_list() == list(range(1, status.step + 1))
    assert (started.run_dir / "steps.parquet").exists()

    # resuming it from a checkpoint that cannot apply fails cleanly: status failed, reason,
    # exit 1. (An unreadable checkpoint no longer fails a resume: it is set aside for the
    # previous one, tests/trainer/test_checkpoint.py; a vocabulary that differs does.)
    steps_before = run.steps().height
    checkpoint = run.checkpoints()[-1]
    state = torch.load(checkpoint, weights_only=True)
    state["vocab_kept_ids"] = torch.arange(5)  # the run is not pruned: this cannot match
    torch.save(state, checkpoint)
    result = run_trainer_cli(["resume", str(started.run_dir)])
    assert result.returncode == 1
    assert result.stdout.strip().splitlines()[-1] == str(started.run_dir)
    failed = run.status()
    assert failed.status == "failed"
    assert failed.reason.startswith("ValueError: step_")
    assert "pruned vocabulary differs" in failed.reason
    assert run.steps().height == steps_before  # the records made before are kept
    assert "Traceback" in run.log_tail()
    assert "Traceback" not in result.stderr
    assert f"run failed: {failed.reason}" in result.stderr


def test_patch_and_parent_are_recorded(tmp_path, monkeypatch):
    # a relative runs dir means relative to the caller, whatever the child's cwd
    monkeypatch.chdir(tmp_path)
    started = launch.start_run(
        scenario="unstable",
        overrides={**OVERRIDES, "data.sample_latency_ms": 0.0},
        runs_dir="relative-runs",
        steps=2,
        device="cpu",
        instruments=False,
        parent_run_id="parent-1",
        applied_patch={"train.grad_clip": 1.0, "train.lr": 0.001},
    )
    assert started.run_dir == tmp_path / "relative-runs" / started.run_id
    manifest = RunFolder(started.run_dir).manifest()
    assert manifest.parent_run_id == "parent-1"
    assert manifest.applied_patch == {"train.grad_clip": 1.0, "train.lr": 0.001}
    # the patch wins over the scenario's preset
    assert manifest.config["train"]["grad_clip"] == 1.0
    assert manifest.config["train"]["lr"] == 0.001
    run = RunFolder(started.run_dir)
    assert _wait(lambda: run.status().is_final)
    assert run.status().status == "completed"


def test_bad_override_raises_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match="^data.num_workers: 'many' is not an integer"):
        launch.start_run(
            scenario="healthy", overrides={"data.num_workers": "many"}, runs_dir=tmp_path
        )
    with pytest.raises(ConfigError, match="^scenario: 'fast' is unknown"):
        launch.start_run(scenario="fast", overrides={}, runs_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_trainer_that_refuses_reports_its_error(tmp_path, no_cuda_for_children):
    with pytest.raises(launch.LaunchError, match="error: device: cuda requested but no CUDA") as e:
        launch.start_run(scenario="healthy", overrides={}, runs_dir=tmp_path, device="cuda")
    assert "\n" not in str(e.value)
    assert e.value.log_tail.endswith("allowed: auto, cpu")
    assert [p.name for p in tmp_path.iterdir()] == [".launch"]  # only the launcher's log


def test_form_helpers():
    assert set(launch.SCENARIOS) >= {"healthy", "leak"}
    keys = [f.key for f in launch.config_fields()]
    assert "data.num_workers" in keys and "train.grad_clip" in keys
    assert launch.validate_overrides({"train.amp": "fp8", "train.lr": 0.01}) == {
        "train.amp": "train.amp: 'fp8' is not one of the choices; allowed: off, bf16, fp16"
    }


def test_cancel_needs_a_run_folder(tmp_path):
    with pytest.raises(ValueError, match="not a run folder"):
        launch.cancel_run(tmp_path)


def _is_zombie_or_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return bool(handle.read())
    except FileNotFoundError:
        return False


def test_a_finished_run_is_reaped_not_left_a_zombie(tmp_path):
    started = launch.start_run(
        scenario="healthy",
        overrides={**OVERRIDES, "data.sample_latency_ms": 0.0},
        runs_dir=tmp_path,
        steps=2,
        device="cpu",
        instruments=False,
    )
    run = RunFolder(started.run_dir)
    assert _wait(lambda: run.status().is_final), "the run did not finish"
    # nothing else in this test waits on the child: only launch's reaper can collect it
    assert _wait(lambda: not _is_zombie_or_alive(started.pid), timeout_s=60.0), (
        f"pid {started.pid} is still in the process table after its run ended"
    )


def test_device_error_names_a_missing_cuda_before_anything_starts():
    assert launch.device_error("cpu") is None
    assert launch.device_error("auto") is None
    message = launch.device_error("cuda")
    if torch.cuda.is_available():
        assert message is None
    else:
        assert message is not None and message.startswith("CUDA was requested")
        assert "choose auto or cpu" in message
