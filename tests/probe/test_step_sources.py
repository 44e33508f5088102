"""Where a script run's steps come from: the training thread's optimizer, or its
``backward()`` when it builds no optimizer; never another thread's optimizer.

Real subprocesses of ``python -m probe profile``; scripts under tests/scripts.
"""

from __future__ import annotations

import re

from diagnostics.runs import RunFolder
from tests.probe.helpers import SCRIPTS, profile, run_folder


def _run(tmp_path, script, *args):
    result = profile(tmp_path / "runs", "--no-trace", str(SCRIPTS / script), *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, RunFolder(run_folder(result))


def test_a_teacher_trained_on_a_background_thread_is_not_the_runs_steps(tmp_path):
    """Before: 60 steps, the teacher's 30 first (the teacher's optimizer was the lead until
    it was garbage-collected)."""
    _, run = _run(tmp_path, "threads_train.py", "--teacher")
    steps = run.steps()
    assert steps.height == 30 and run.status().step == 30
    assert steps["loss"].null_count() == 0
    probe = run.manifest().extra["probe"]
    assert probe["steps_counted_by"] == "optimizer"
    assert probe["optimizers"] == [
        {"class": "SGD", "steps": 30, "thread": "background"},
        {"class": "SGD", "steps": 30, "thread": "training"},
    ]
    assert any("background thread" in note for note in run.manifest().notes)


def test_models_trained_only_on_threads_give_no_steps_and_say_why(tmp_path):
    """Before: 50-77 steps recorded with a null loss, from three threads' optimizers."""
    _, run = _run(tmp_path, "threads_train.py", "--only-threads")
    assert run.steps().height == 0 and run.status().step == 0
    probe = run.manifest().extra["probe"]
    assert [o["thread"] for o in probe["optimizers"]] == ["background"] * 3
    assert sum(o["steps"] for o in probe["optimizers"]) == 60
    notes = run.manifest().notes
    assert any("background thread" in note for note in notes)
    assert any("ended without a step" in note for note in notes)


def test_a_hand_written_update_counts_one_step_per_backward_with_its_loss(tmp_path):
    """Before: 0 steps and a note that no optimizer step was seen."""
    result, run = _run(tmp_path, "hand_written_update.py")
    printed = re.findall(r"^iteration \d+ loss (\S+) norm (\S+)$", result.stdout, re.M)
    steps = run.steps()
    assert steps["step"].to_list() == list(range(1, 26))
    # each step's loss is its backward()'s, and its norm the clip after that backward (the
    # step ends as the next iteration begins, not as backward() returns): to 6 decimals
    for (loss, norm), got_loss, got_norm in zip(
        printed, steps["loss"].to_list(), steps["grad_norm"].to_list(), strict=True
    ):
        assert abs(float(loss) - got_loss) < 1e-6 and abs(float(norm) - got_norm) < 1e-6
    assert run.manifest().extra["probe"]["steps_counted_by"] == "backward"
    assert any("steps counted by backward()" in note for note in run.manifest().notes)
