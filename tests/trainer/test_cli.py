"""python -m trainer: one-line errors with exit 2 and no run folder; list."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from diagnostics.runs import RunWriter
from tests.conftest import run_trainer_cli
from trainer.cli import _alive
from trainer.config import build_config


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--set", "data.num_workers=x"],
            "error: data.num_workers: 'x' is not an integer; allowed: integer from 0 to 64",
        ),
        (
            ["--scenario", "nope"],
            "error: scenario: 'nope' is unknown; allowed: healthy, slow-loader, no-pin-memory, "
            "unstable, leak, small-batch",
        ),
        (["--steps", "0"], "error: train.steps: '0' is out of range; allowed: integer >= 1"),
        (["--device", "tpu"], "error: device: 'tpu' is not one of the choices; allowed: auto"),
        (["--set", "train.amp=fp8"], "error: train.amp: 'fp8' is not one of the choices"),
        (["--set", "train.lr"], "error: --set: 'train.lr' is not key=value"),
        (["--instruments", "maybe"], "error: --instruments: 'maybe'; allowed: on, off"),
        (["--patch-json", "[1]"], "error: --patch-json: not a JSON object"),
        (["--patch-json", "{"], "error: --patch-json: not JSON"),
        (["--patch-json", '{"train.grad_clip": "big"}'], "error: train.grad_clip: 'big' is not"),
        (["--run-id", "../escape"], "error: --run-id: '../escape'; allowed: letters, digits"),
        (["--frobnicate"], "error: unrecognized arguments: --frobnicate"),
        # a full match: "$" in the old pattern let an id ending in a newline through
        (["--run-id", "run\n"], "error: --run-id: 'run\\n'; allowed: letters, digits"),
        (["--parent-run-id", "x\n"], "error: --parent-run-id: 'x\\n'; allowed: letters"),
        (["--parent-run-id", "[a](http://x)"], "error: --parent-run-id: '[a](http://x)'"),
        (["--parent-run-id", "../up"], "error: --parent-run-id: '../up'; allowed: letters"),
        (["--set", f"seed={2**32}"], "error: seed: '4294967296' is out of range; allowed: "),
        (["--set", "runtime.threads=100000"], "error: runtime.threads: '100000' is out of"),
        (
            ["--patch-json", "[" * 30_000 + "]" * 30_000],
            "error: --patch-json: JSON nested too deeply",
        ),
        (
            ["--patch-json", '{"a":' * 20_000 + "1" + "}" * 20_000],  # argv holds 128 KiB,
            "error: --patch-json: JSON nested too deeply",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_leaves_no_folder(tmp_path, args, message):
    runs_dir = tmp_path / "runs"
    result = run_trainer_cli(["run", "--runs-dir", str(runs_dir), *args])
    assert result.returncode == 2
    assert result.stderr.startswith(message), result.stderr
    assert result.stderr.count("\n") == 1  # one line, no traceback
    assert result.stdout == ""
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def test_cuda_requested_without_cuda_is_refused_before_the_folder(tmp_path, no_cuda_for_children):
    result = run_trainer_cli(["run", "--runs-dir", str(tmp_path), "--device", "cuda"])
    assert result.returncode == 2
    assert result.stderr == (
        "error: device: cuda requested but no CUDA device is available; allowed: auto, cpu\n"
    )
    assert not any(tmp_path.iterdir())


def test_existing_run_id_is_refused(tmp_path):
    (tmp_path / "taken").mkdir()
    result = run_trainer_cli(["run", "--runs-dir", str(tmp_path), "--run-id", "taken"])
    assert result.returncode == 2
    assert "error: --run-id:" in result.stderr and "already exists" in result.stderr


def test_resume_refuses_what_is_not_a_resumable_run(tmp_path, tiny_run):
    result = run_trainer_cli(["resume", str(tmp_path)])
    assert result.returncode == 2
    assert result.stderr == (
        f"error: RUN_DIR: {tmp_path} is not a run folder (no run.json); allowed: a run folder\n"
    )
    done = run_trainer_cli(["resume", str(tiny_run)])
    assert done.returncode == 2
    assert done.stderr == f"error: RUN_DIR: {tiny_run} already completed\n"


def test_list_shows_runs_with_status_and_steps(tiny_run):
    result = run_trainer_cli(["list", "--runs-dir", str(tiny_run.parent)])
    assert result.returncode == 0
    header, row = result.stdout.strip().splitlines()
    assert header.split("\t") == ["run", "scenario", "status", "steps", "created (UTC)", "reason"]
    fields = row.split("\t")
    # id, scenario, status, steps done/total (8 fine-tuning + 2 pre-training), created
    assert fields[:4] == [tiny_run.name, "healthy", "completed", "10/10"]


def test_help_lists_the_public_commands_only():
    result = run_trainer_cli(["--help"])
    assert result.returncode == 0
    assert "{run,resume,list}" in result.stdout and "_worker" not in result.stdout


def test_list_of_an_empty_dir_says_so(tmp_path):
    result = run_trainer_cli(["list", "--runs-dir", str(tmp_path)])
    assert (result.returncode, result.stdout) == (0, "")
    assert result.stderr == f"no runs in {tmp_path}\n"


def test_resume_refuses_a_live_run_but_not_a_killed_one(tmp_path):
    writer = RunWriter.create(tmp_path, build_config().to_dict(), {})
    # RunWriter recorded this (live) test process as the run's pid
    result = run_trainer_cli(["resume", str(writer.path)])
    assert result.returncode == 2
    assert result.stderr == f"error: RUN_DIR: {writer.path} is still running (pid {os.getpid()})\n"
    # a killed trainer's status still says "running" for 15 s; its pid is gone
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not _alive(gone.pid, socket.gethostname())
    assert _alive(os.getpid(), socket.gethostname())
    assert _alive(gone.pid, "another-host")  # elsewhere only the heartbeat can tell


def test_largest_seed_is_accepted_before_any_folder():
    assert build_config("healthy", {"seed": 2**32 - 1}).seed == 2**32 - 1


def test_a_runs_dir_that_cannot_hold_folders_is_one_line_exit_2():
    result = run_trainer_cli(["run", "--runs-dir", "/proc/self", "--run-id", "x"])
    assert result.returncode == 2
    assert result.stderr == (
        "error: --runs-dir: cannot create a run folder in /proc/self: No such file or directory\n"
    )
    assert run_trainer_cli(["list", "--runs-dir", "/proc/self"]).stderr == "no runs in /proc/self\n"


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("status.json", "[1, 2]", "unreadable (a JSON list, not an object)"),
        ("run.json", "[1, 2]", "unreadable (a JSON list, not an object)"),
        ("run.json", "[" * 100_000 + "]" * 100_000, "unreadable (JSON nested too deeply)"),
    ],
)
def test_a_malformed_run_is_listed_unreadable_and_refused_by_resume(tmp_path, name, text, problem):
    good = RunWriter.create(tmp_path, build_config().to_dict(), {}, run_id="good")
    good.finalise("completed")
    bad = RunWriter.create(tmp_path, build_config().to_dict(), {}, run_id="bad")
    bad.finalise("preempted")
    (bad.path / name).write_text(text)
    listed = run_trainer_cli(["list", "--runs-dir", str(tmp_path)])
    assert listed.returncode == 0, listed.stderr
    rows = {line.split("\t")[0]: line.split("\t") for line in listed.stdout.splitlines()[1:]}
    assert rows["good"][2] == "completed"
    assert rows["bad"][2] == "unreadable"
    assert rows["bad"][-1] == f"{bad.path / name}: {problem}"
    resumed = run_trainer_cli(["resume", str(bad.path)])
    assert resumed.returncode == 2
    assert resumed.stderr == f"error: RUN_DIR: {bad.path / name}: {problem}\n"
