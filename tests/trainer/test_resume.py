"""kill -9 and SIGTERM mid-run, then resume: the records survive and the losses after the
checkpoint equal those of an uninterrupted run with the same seed, exactly (CPU).

These runs use ``data.num_workers=0``: with workers the batches are the same (data order is
a function of seed and epoch, and nothing in a worker draws from a global RNG) but the
worker count changes the trainer's torch thread count (cores left over by the workers),
and the reference, killed and resumed runs must all use the same one for bitwise-equal
floating point. 0 workers keeps that trivially true.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from diagnostics.runs import RunFolder
from tests.conftest import REPO_ROOT, run_trainer_cli

# real training jobs, tens of seconds: `-m 'not slow'` skips them while iterating
pytestmark = pytest.mark.slow

# 2 masked-LM + 12 fine-tuning steps, a checkpoint every 4; 5 ms simulated latency per
# sample (16 a batch: >= 80 ms a step) so a signal reliably lands mid-run
ARGS = [
    "--device",
    "cpu",
    "--steps",
    "12",
    "--instruments",
    "off",
    "--set",
    "data.rows=400",
    "--set",
    "data.num_workers=0",
    "--set",
    "data.sample_latency_ms=5",
    "--set",
    "train.batch_size=16",
    "--set",
    "train.pretrain_steps=2",
    "--set",
    "train.checkpoint_every=4",
]
TOTAL = 14


def _start(runs_dir: Path, run_id: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", *ARGS, "--runs-dir", str(runs_dir)]
        + ["--run-id", run_id],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout_s=240.0) -> int:
    deadline = time.monotonic() + timeout_s
    lines = run_dir / "steps.jsonl"
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        if lines.exists():
            done = [json.loads(x)["step"] for x in lines.read_text().splitlines() if x.strip()]
            if done and max(done) >= step:
                return max(done)
        time.sleep(0.02)
    raise AssertionError(f"no step {step} within {timeout_s} s")


def _losses(run: RunFolder) -> dict[int, float]:
    steps = run.steps()
    return dict(zip(steps["step"].to_list(), steps["loss"].to_list(), strict=True))


def _numerics(run: RunFolder) -> dict:
    """What bitwise equality rests on, for the failure message: a mismatch then says
    whether the two processes ran with the same threads and math-library settings."""
    env = run.manifest().environment
    return {k: env.get(k) for k in ("torch_threads", "cpu_count", "math_library_env")}


def _assert_same_losses(run: RunFolder, reference: RunFolder) -> None:
    got, want = _losses(run), _losses(reference)
    differing = [step for step in want if got.get(step) != want[step]]
    assert got == want, (
        f"losses differ first at step {differing[0] if differing else '?'}: "
        f"{run.path.name} {_numerics(run)} against {reference.path.name} {_numerics(reference)}"
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted reference, a run killed with SIGKILL and one sent SIGTERM."""
    runs_dir = tmp_path_factory.mktemp("resume")
    reference = _start(runs_dir, "reference")
    killed = _start(runs_dir, "killed")
    # the first checkpoint is at step 4; wait for step 6 so there is work to redo
    _wait_for_step(runs_dir / "killed", 6, killed)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    after_kill = {
        "steps": RunFolder(runs_dir / "killed").steps()["step"].to_list(),
        "status": RunFolder(runs_dir / "killed").status().status,
        "checkpoints": [p.name for p in RunFolder(runs_dir / "killed").checkpoints()],
    }
    termed = _start(runs_dir, "termed")
    at_term = _wait_for_step(runs_dir / "termed", 6, termed)
    termed.send_signal(signal.SIGTERM)
    out, err = termed.communicate(timeout=60)
    # a copy to break: its newest checkpoint torn, a crafted one beside it (below)
    shutil.copytree(runs_dir / "termed", runs_dir / "termed-corrupt")
    after_term = {
        "returncode": termed.returncode,
        "stdout": out,
        "status": RunFolder(runs_dir / "termed").status(),
        "checkpoints": [p.name for p in RunFolder(runs_dir / "termed").checkpoints()],
        "at_term": at_term,
    }
    ref_out, ref_err = reference.communicate(timeout=240)
    assert reference.returncode == 0, ref_err[-3000:]
    return {
        "dir": runs_dir,
        "reference": RunFolder(runs_dir / "reference"),
        "after_kill": after_kill,
        "after_term": after_term,
    }


def test_killed_run_is_readable_with_its_records_up_to_the_kill(runs):
    after = runs["after_kill"]
    # steps 1..k, no gap, k at least the step the test waited for
    assert after["steps"] == list(range(1, len(after["steps"]) + 1))
    assert len(after["steps"]) >= 6
    # a SIGKILLed run cannot say so: it reads "running" until its heartbeat goes stale
    assert after["status"] in ("running", "dead")
    assert "step_00000004.pt" in after["checkpoints"]


def test_resume_after_kill_matches_the_uninterrupted_losses_exactly(runs):
    run_dir = runs["dir"] / "killed"
    # the resumed run must use the run's own tokenizer, not the shared cache (tokenizer
    # training is not deterministic, so a retrained one would number tokens differently)
    shutil.rmtree(runs["dir"] / ".cache")
    result = run_trainer_cli(["resume", str(run_dir)], timeout_s=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == str(run_dir)
    run = RunFolder(run_dir)
    assert run.status().status == "completed"
    assert list(_losses(run)) == list(range(1, TOTAL + 1))
    # bitwise: the steps redone after the last checkpoint and all later ones
    _assert_same_losses(run, runs["reference"])
    assert "resumed from step_" in run.log_tail()


def test_sigterm_preempts_with_a_checkpoint_and_exit_0(runs):
    after = runs["after_term"]
    assert after["returncode"] == 0
    assert after["stdout"].strip().splitlines()[-1] == str(runs["dir"] / "termed")
    status = after["status"]
    assert status.status == "preempted"
    assert "SIGTERM" in status.reason
    # checkpointed at the step it stopped after
    assert f"step_{status.step:08d}.pt" in after["checkpoints"]
    assert status.step >= after["at_term"]


def test_resume_after_sigterm_completes_with_the_same_losses(runs):
    run_dir = runs["dir"] / "termed"
    result = run_trainer_cli(["resume", str(run_dir)], timeout_s=240)
    assert result.returncode == 0, result.stderr[-3000:]
    run = RunFolder(run_dir)
    assert run.status().status == "completed"
    _assert_same_losses(run, runs["reference"])


def test_a_preempted_run_with_a_torn_newest_checkpoint_resumes_from_the_one_before(runs):
    """The newest checkpoint torn and a crafted newer one dropped in: both are set aside,
    the run continues from the previous intact checkpoint, still bit-exact, and stays a
    resumable run rather than turning "failed"."""
    run_dir = runs["dir"] / "termed-corrupt"
    saved = sorted((run_dir / "checkpoints").glob("step_*.pt"))
    assert len(saved) == 2  # the step-4 one and the one written at SIGTERM
    intact, newest = saved
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    marker = runs["dir"] / "pwned"
    crafted = run_dir / "checkpoints" / "step_99999999.pt"
    crafted.write_bytes(pickle.dumps(_Payload(marker), protocol=2))
    # two that load but cannot be applied: a field apply() reads is gone, a tensor has
    # another shape (applied, either would fail the run or leave a half-restored model)
    state = torch.load(intact, weights_only=True)
    without_loss = {k: v for k, v in state.items() if k != "total_loss"}
    torch.save(without_loss, run_dir / "checkpoints" / "step_99999990.pt")
    name, tensor = next(iter(state["model"].items()))
    misshaped = {**state, "model": {**state["model"], name: tensor.reshape(-1)[:-1]}}
    torch.save(misshaped, run_dir / "checkpoints" / "step_99999991.pt")
    result = run_trainer_cli(["resume", str(run_dir)], timeout_s=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not marker.exists()
    run = RunFolder(run_dir)
    status = run.status()
    assert status.status == "completed"
    assert status.reason.startswith(f"resumed from {intact.name}; set aside as unreadable: ")
    assert f"resumed from {intact.name} at step 4" in run.log_tail()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if "corrupt" in p.name) == [
        f"{newest.name}.corrupt",
        "step_99999990.pt.corrupt",
        "step_99999991.pt.corrupt",
        "step_99999999.pt.corrupt",
    ]
    notes = json.loads((run_dir / "run.json").read_text())["notes"]
    assert any("step_99999990.pt: missing total_loss" in note for note in notes), notes
    assert any(f"step_99999991.pt: model parameter {name} is" in note for note in notes), notes
    _assert_same_losses(run, runs["reference"])


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))
