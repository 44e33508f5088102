"""Each way a script run can go wrong ends in one clear line, and keeps what was recorded.

Real subprocesses of ``python -m probe profile``; scripts under tests/scripts.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from diagnostics.analyze import analyze
from diagnostics.runs import CANCEL_FILE, RunFolder
from tests.probe.helpers import (
    SCRIPTS,
    SLOW_LOADER,
    child_env,
    profile,
    profile_command,
    run_folder,
)


def test_a_missing_script_is_one_line_and_exit_2_and_creates_nothing(tmp_path):
    runs = tmp_path / "runs"
    result = profile(runs, str(tmp_path / "nope.py"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: script: {tmp_path / 'nope.py'} is not a file"
    assert "Traceback" not in result.stderr
    assert not runs.exists()


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("dataloader.num_worker=4", "unknown key 'dataloader.num_worker'"),
        ("dataloader.num_workers=four", "num_workers takes a whole number"),
        ("dataloader.pin_memory=yes", "pin_memory takes true or false"),
        ("train.lr=1", "expected dataloader.KEY=VALUE"),
    ],
)
def test_a_bad_override_is_one_line_and_exit_2(tmp_path, override, says):
    result = profile(tmp_path / "runs", "--override", override, str(SLOW_LOADER))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and says in result.stderr
    assert not (tmp_path / "runs").exists()


def test_a_script_failing_at_import_is_failed_with_the_exceptions_last_line(tmp_path):
    result = profile(tmp_path / "runs", str(SCRIPTS / "fails_at_import.py"))
    assert result.returncode == 1
    status = RunFolder(run_folder(result)).status()
    assert status.status == "failed"
    assert (
        status.reason == "ModuleNotFoundError: No module named 'definitely_not_an_installed_module'"
    )
    # the traceback starts at the script, as python itself prints it
    assert 'File "' + str(SCRIPTS / "fails_at_import.py") + '", line 3' in result.stderr
    assert "probe/child.py" not in result.stderr


def test_a_script_that_never_steps_completes_with_a_note_and_no_steps(tmp_path):
    result = profile(tmp_path / "runs", str(SCRIPTS / "no_steps.py"))
    assert result.returncode == 0 and "parameters: 10" in result.stdout
    run = RunFolder(run_folder(result))
    assert run.status().status == "completed"
    assert any("ended without a step" in note for note in run.manifest().notes)
    analysis = analyze(run.path)
    assert analysis.summary["steps"] == 0
    assert any(w.startswith("no steps:") for w in analysis.warnings)
    assert analysis.findings == ()


def test_sys_exit_3_passes_on_and_fails_the_run_keeping_its_steps(tmp_path):
    args = ("--steps", "3", "--sleep-ms", "0", "--exit-code", "3")
    result = profile(tmp_path / "runs", str(SLOW_LOADER), *args)
    assert result.returncode == 3
    run = RunFolder(run_folder(result))
    assert (run.status().status, run.status().reason) == ("failed", "exit code 3")
    assert run.steps()["step"].to_list() == [1, 2, 3]


def test_an_exception_mid_run_fails_it_with_its_line_and_keeps_the_steps_before(tmp_path):
    result = profile(tmp_path / "runs", str(SLOW_LOADER), "--sleep-ms", "0", "--fail")
    assert result.returncode == 1
    run = RunFolder(run_folder(result))
    assert (run.status().status, run.status().reason) == ("failed", "ValueError: boom at step 3")
    assert run.steps()["step"].to_list() == [1, 2, 3]


def _wait_for_steps(runs, count, process, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for steps in runs.glob("*/steps.jsonl"):
            if len(steps.read_text().splitlines()) >= count:
                return steps.parent
        assert process.poll() is None, process.communicate()
        time.sleep(0.1)
    raise AssertionError("no steps recorded in time")


@pytest.mark.parametrize(
    ("how", "reason", "exit_code"),
    [
        ("SIGTERM", "SIGTERM received", 128 + signal.SIGTERM),
        ("SIGINT", "SIGINT received", 128 + signal.SIGINT),
        ("cancel.request", "cancel requested", 128 + signal.SIGTERM),  # the app's Cancel
    ],
)
def test_a_stopped_wrapper_cancels_the_run_and_keeps_its_records(tmp_path, how, reason, exit_code):
    runs = tmp_path / "runs"
    command = profile_command(
        runs, str(SLOW_LOADER), "--steps", "500", "--sleep-ms", "0", "--linger-s", "0.05"
    )
    process = subprocess.Popen(
        command, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        folder = _wait_for_steps(runs, 3, process)
        if how == "cancel.request":
            (folder / CANCEL_FILE).touch()
        else:
            process.send_signal(getattr(signal, how))
        stdout, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == exit_code
    assert stdout.strip().splitlines()[-1] == str(folder)
    run = RunFolder(folder)
    status = run.status()
    assert (status.status, status.reason) == ("cancelled", reason)
    steps = run.steps()["step"].to_list()
    assert len(steps) >= 3 and steps == list(range(1, len(steps) + 1))
    assert status.step == steps[-1]
    assert run.samples().height > 0  # the sampler's records too


def _ended(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie nobody reaped has: init may not reap)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("quiet", [False, True], ids=["printing", "quiet"])
def test_a_killed_wrapper_stops_the_script_and_the_run_ends_failed_with_its_records(
    tmp_path, quiet
):
    runs = tmp_path / "runs"
    command = profile_command(
        runs, str(SLOW_LOADER), "--steps", "500", "--sleep-ms", "0", "--linger-s", "0.05"
    )
    process = subprocess.Popen(
        command + (["--quiet"] if quiet else []),
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        folder = _wait_for_steps(runs, 3, process)
        process.kill()  # SIGKILL: the wrapper writes nothing more
        process.communicate(timeout=60)
        run = RunFolder(folder)
        deadline = time.monotonic() + 60
        while run.status().status == "running" and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        if process.poll() is None:
            process.kill()
    status = run.status()
    assert status.status == "failed", status
    # no wrapper was left to write that: the script's own process did, naming the wrapper
    assert status.reason.startswith(
        f"the pipeline-doctor wrapper (pid {process.pid}) died (killed?): the script "
    ), status.reason
    steps = run.steps()["step"].to_list()
    assert len(steps) >= 3 and steps == list(range(1, len(steps) + 1))
    assert status.step == steps[-1]
    if quiet:
        # nothing written to the dead pipe: the watch found the wrapper gone and stopped it
        assert status.reason.endswith(f"was stopped after step {steps[-1]}"), status.reason
    # the script trains on unwatched no more: its process has ended
    script_pid = run.rank_statuses()[0]["pid"]
    deadline = time.monotonic() + 30
    while not _ended(script_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ended(script_pid)
    assert (folder / "steps.parquet").exists()  # the end the wrapper would have written


# The wrapper, its supervision replaced: it reads three of the script's lines, closes its
# end of the script's stdout, and goes HOLD_S later writing nothing, as a SIGKILLed process
# closes its files before its children are handed on (that moment is under a millisecond
# when it is really killed: held open here, so the test does not depend on winning a race).
_WRAPPER_DYING_SLOWLY = """
import os, subprocess, sys, time
import probe.cli
from probe.wrapper_watch import WRAPPER_PID_ENV

def supervise(writer, command, world, max_runtime_s=None):
    env = {**os.environ, WRAPPER_PID_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1"}
    script = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    for _ in range(3):
        script.stdout.readline()
    script.stdout.close()
    print(writer.path, flush=True)
    time.sleep(float(os.environ["HOLD_S"]))
    os._exit(137)

probe.cli._supervise = supervise
sys.exit(probe.cli.main(sys.argv[1:]))
"""


def test_a_script_whose_print_meets_the_dying_wrappers_closed_pipe_writes_the_runs_end(
    tmp_path,
):
    """The script's next print fails on the closed pipe while the wrapper is still its
    parent: its end waits for the wrapper to go, then writes the run's end (before, it took
    the wrapper for alive, wrote only its own rank's, and the run read "dead")."""
    runs = tmp_path / "runs"
    hold_s = 1.5
    arguments = ["profile", "--runs-dir", str(runs), "--no-trace", str(SLOW_LOADER)]
    arguments += ["--steps", "500", "--sleep-ms", "0", "--linger-s", "0.05"]
    wrapper = subprocess.Popen(
        [sys.executable, "-c", _WRAPPER_DYING_SLOWLY, *arguments],
        env={**child_env(), "HOLD_S": str(hold_s)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = wrapper.communicate(timeout=240)
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
    assert wrapper.returncode == 137, stderr[-2000:]
    run = RunFolder(stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 60
    while run.status().status == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    status = run.status()
    assert status.status == "failed", status
    steps = run.steps()["step"].to_list()
    assert len(steps) >= 3 and steps == list(range(1, len(steps) + 1))
    assert status.step == steps[-1]
    assert status.reason == (
        f"the pipeline-doctor wrapper (pid {wrapper.pid}) died (killed?): the script ended "
        f"failed after step {steps[-1]} (BrokenPipeError: [Errno 32] Broken pipe)"
    )
    assert status.pid == run.rank_statuses()[0]["pid"]  # written by the script's process


def test_a_killed_wrappers_run_stays_alive_while_its_script_unwinds_slowly(tmp_path):
    """The wrapper's heartbeat dies with it: the script's process keeps it until its end is
    written, so a slow unwinding (a checkpoint saved on the way out) never reads dead."""
    runs = tmp_path / "runs"
    cleanup_s = 6.0
    command = profile_command(
        runs,
        *("--no-trace", str(SLOW_LOADER), "--steps", "500", "--sleep-ms", "0"),
        *("--linger-s", "0.05", "--quiet", "--cleanup-s", str(cleanup_s)),
    )
    process = subprocess.Popen(
        command, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        folder = _wait_for_steps(runs, 3, process)
        process.kill()
        killed_at = time.time()
        process.communicate(timeout=60)
        run = RunFolder(folder)
        beats = []  # (heartbeat, pid) while the status file still says running
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            raw = json.loads((folder / "status.json").read_text())
            if raw["status"] != "running":
                break
            beats.append((raw["heartbeat"], raw["pid"]))
            time.sleep(0.2)
    finally:
        if process.poll() is None:
            process.kill()
    script_pid = run.rank_statuses()[0]["pid"]
    status = run.status()
    assert status.status == "failed", status
    assert status.reason.endswith(f"was stopped after step {status.step}"), status.reason
    assert status.pid == script_pid
    assert status.ended_at - killed_at >= cleanup_s - 1.5  # the unwinding took its time
    # kept by the script's process while it unwound, not only as its end was written
    kept = [
        beat
        for beat, pid in beats
        if pid == script_pid and killed_at + 2.0 < beat < status.ended_at - 2.0
    ]
    assert len(kept) >= 2, (killed_at, status.ended_at, beats[-8:])


def test_a_script_that_forks_keeps_its_own_steps_once_and_notes_the_copys(tmp_path):
    runs = tmp_path / "runs"
    result = profile(runs, "--no-trace", str(SCRIPTS / "forking_loop.py"))
    # the copy's sys.exit(5) is the copy's: the script's own process completed
    assert result.returncode == 0, result.stderr[-2000:]
    assert "the forked copy trained 12 steps" in result.stdout
    assert "the copy exited with 5" in result.stdout
    run = RunFolder(run_folder(result))
    assert run.status().status == "completed"
    # six steps, each once: the copy wrote neither its own steps nor its copy of the
    # script's unwritten ones (before: steps 1..6 twice)
    assert run.steps()["step"].to_list() == [1, 2, 3, 4, 5, 6]
    assert run.rank_statuses()[0]["step"] == 6
    forked = [n for n in run.manifest().notes if n.startswith("a process the script forked")]
    assert len(forked) == 1 and forked[0].endswith(
        "ran training steps: they are not recorded; the run's steps are the script's own process's"
    ), run.manifest().notes
    assert not list(run.path.glob("forked_steps.*"))  # the copy's marker, read and removed


def test_a_script_that_spawns_its_own_training_processes_is_told_how_to_profile_them(
    tmp_path,
):
    runs = tmp_path / "runs"
    result = profile(runs, "--no-trace", str(SCRIPTS / "spawns_its_own.py"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "worker 0 trained 5 steps" in result.stdout
    assert "worker 1 trained 5 steps" in result.stdout
    run = RunFolder(run_folder(result))
    assert run.status().status == "completed"
    assert run.steps().height == 0  # their steps ran in processes the probe never saw
    notes = run.manifest().notes
    started = [n for n in notes if n.startswith("the script started 2 process(es)")]
    assert len(started) == 1, notes
    # the function the script spawned, not torch's wrapper around it, and the way out
    assert "running train_worker:" in started[0]
    assert "pipeline-doctor profile --nproc-per-node 2 SCRIPT" in started[0]
    assert run.manifest().extra["probe"]["processes_started"] == {"train_worker": 2}


def test_a_dataloaders_own_workers_are_not_processes_the_script_started(tmp_path):
    runs = tmp_path / "runs"
    result = profile(runs, "--no-trace", str(SLOW_LOADER), "--steps", "4", "--num-workers", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    run = RunFolder(run_folder(result))
    assert run.steps()["step"].to_list() == [1, 2, 3, 4]
    assert run.manifest().extra["probe"]["processes_started"] == {}
    assert run.manifest().extra["probe"]["dataloaders_built"] == 1


def test_two_processes_under_torchrun_write_one_folder_with_both_ranks(tmp_path):
    result = profile(tmp_path / "runs", "--nproc-per-node", "2", str(SCRIPTS / "ddp_tiny.py"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0 of 2 done" in result.stdout and "rank 1 of 2 done" in result.stdout
    run = RunFolder(run_folder(result))
    assert run.status().status == "completed"
    assert run.world_size() == 2
    per_rank = run.rank_steps().group_by("rank").len().sort("rank")
    # 64 samples, two ranks, batches of 8: four optimizer steps each
    assert per_rank.rows() == [(0, 4), (1, 4)]
    assert {s["status"] for s in run.rank_statuses().values()} == {"completed"}
    (loader,) = run.dataloaders()  # rank 0's
    assert loader.batch_size == 8 and loader.site == "ddp_tiny.py:14"


def test_probe_step_and_record_mark_steps_the_hooks_cannot_see(tmp_path):
    result = profile(tmp_path / "runs", str(SCRIPTS / "manual_steps.py"))
    assert result.returncode == 0, result.stderr[-2000:]
    run = RunFolder(run_folder(result))
    steps = run.steps()
    # loss of step k: 3 x (0 - k)^2 on the first step, then with the weights moved by hand;
    # the printed values are the oracle
    printed = [
        float(line.rsplit(" ", 1)[1])
        for line in result.stdout.splitlines()
        if line.startswith("manual step")
    ]
    assert printed[0] == 3.0
    assert steps["loss"].to_list() == pytest.approx(printed, rel=1e-5)  # printed to 6 digits
    assert steps["batch_size"].to_list() == [2] * 5
    assert run.manifest().extra["probe"]["steps_counted_by"] == "explicit"


def test_the_same_script_runs_unchanged_without_the_wrapper(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "manual_steps.py")],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.count("manual step") == 5


def test_amp_records_the_unscaled_loss_the_scale_and_the_skipped_step(tmp_path):
    result = profile(tmp_path / "runs", str(SCRIPTS / "amp_cpu.py"))
    assert result.returncode == 0, result.stderr[-2000:]
    run = RunFolder(run_folder(result))
    steps = run.steps()
    printed = [
        float(line.rsplit(" ", 1)[1]) for line in result.stdout.splitlines() if " loss " in line
    ]
    assert steps["loss"].to_list()[:2] == pytest.approx(printed[:2], rel=1e-5)
    assert steps["loss"].to_list()[3:] == pytest.approx(printed[3:], rel=1e-5)
    # GradScaler halves its scale after the inf at step 3 (backoff_factor 0.5)
    assert steps["amp_scale"].to_list() == [65536.0] * 3 + [32768.0] * 3
    assert steps["marks"].to_list()[2].split(",")[0] == "amp_skipped"
    amp = run.manifest().extra["amp"]
    assert amp == {"autocast_dtypes": ["cpu:bfloat16"], "grad_scaler": True, "skipped_steps": 1}
    assert "final scale 32768" in result.stdout


def test_an_override_a_loader_without_workers_refuses_is_noted_not_fatal(tmp_path):
    args = ("--steps", "2", "--sleep-ms", "0")
    result = profile(
        tmp_path / "runs", "--override", "dataloader.prefetch_factor=4", str(SLOW_LOADER), *args
    )
    assert result.returncode == 0, result.stderr[-2000:]
    run = RunFolder(run_folder(result))
    (loader,) = run.dataloaders()
    assert (loader.prefetch_factor, loader.overridden) == (None, {})
    assert any(
        note.startswith("--override dataloader.prefetch_factor=4 not applied to slow_loader.py:")
        for note in run.manifest().notes
    )
