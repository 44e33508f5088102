"""A full disk, for real: a small tmpfs mounted for the test. Root mounts it where the tests
run; anyone else gets each test run again in a private user and mount namespace
(``unshare -rm``, where they are root of their own mounts), whose result stands for the
test. Never skipped: a host where neither works fails these tests, saying why.

At creation: exit 2, one line, no run folder, no .tmp. Mid-run: status failed with
"disk full at step N", the records up to N kept, no .tmp, no traceback on the terminal.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from diagnostics.runs import RunFolder
from tests.conftest import REPO_ROOT, run_trainer_cli

ARGS = [
    "--device",
    "cpu",
    "--instruments",
    "off",
    "--set",
    "data.rows=200",
    "--set",
    "train.pretrain_steps=0",
    "--set",
    "data.num_workers=0",
    "--set",
    "runtime.threads=1",
]


# Set in the re-run inside the namespace, so that a failed mount there fails, not recurses.
IN_MOUNT_NAMESPACE = "PIPELINE_DOCTOR_TEST_IN_MOUNT_NAMESPACE"


def mounts_a_tmpfs(test: Callable[..., None]) -> Callable[..., None]:
    """Runs the test where it may mount: here as root, else in ``unshare -rm``."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        if os.geteuid() == 0:
            test(*args, **kwargs)
            return
        if os.environ.get(IN_MOUNT_NAMESPACE):
            pytest.fail("unshare -rm gave no root of the namespace (uid is not 0 inside)")
        _rerun_in_a_mount_namespace(test.__name__)

    return run


def _rerun_in_a_mount_namespace(test_name: str) -> None:
    node = f"{Path(__file__).relative_to(REPO_ROOT)}::{test_name}"
    with tempfile.TemporaryDirectory(prefix="disk-full-") as base:
        command = ["unshare", "-rm", sys.executable, "-m", "pytest", "-q"]
        # the namespace's root does not own this user's pytest temp folder: a fresh one
        command += ["-p", "no:cacheprovider", "--basetemp", str(Path(base) / "tmp"), node]
        done = subprocess.run(
            command,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, IN_MOUNT_NAMESPACE: "1"},
        )
    assert done.returncode == 0, (
        f"{node} in a private mount namespace (unshare -rm): exit {done.returncode}\n"
        + (done.stdout + done.stderr)[-3000:]
    )


def _mount(path: Path, size: str, *, read_only: bool = False) -> None:
    path.mkdir()
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.fail(f"root (of this host or of its namespace) cannot mount a tmpfs: {done.stderr}")


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path | None]:
    """A 20 MiB tmpfs: room for the run's files and one 12 MB checkpoint, not two. None where
    this user may not mount: @mounts_a_tmpfs runs the test in a namespace instead."""
    if os.geteuid() != 0:
        yield None
        return
    disk = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
    _mount(disk, "20m")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path) -> None:
    """Writes a filler file until not even one more byte fits."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                continue
    finally:
        os.close(fd)


def _tmp_files(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*.tmp")]


@mounts_a_tmpfs
def test_a_full_disk_at_creation_is_one_line_exit_2_and_leaves_nothing(small_disk):
    _fill(small_disk)
    runs_dir = small_disk / "runs"
    result = run_trainer_cli(["run", *ARGS, "--steps", "2", "--runs-dir", str(runs_dir)])
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr == (
        f"error: --runs-dir: cannot create a run folder in {runs_dir}: No space left on device\n"
    )
    assert result.stdout == ""
    assert not runs_dir.exists()  # neither the run folder nor the runs dir made for it
    assert _tmp_files(small_disk) == []


@mounts_a_tmpfs
def test_a_read_only_runs_dir_is_one_line_exit_2(tmp_path):
    disk = tmp_path / "ro"
    # read-only from the start: a remount to ro is refused inside a user namespace
    _mount(disk, "1m", read_only=True)
    try:
        result = run_trainer_cli(["run", *ARGS, "--steps", "2", "--runs-dir", str(disk)])
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    assert result.returncode == 2
    assert result.stderr == (
        f"error: --runs-dir: cannot create a run folder in {disk}: Read-only file system\n"
    )


@mounts_a_tmpfs
def test_a_disk_filling_up_mid_run_fails_the_run_at_that_step_and_keeps_its_records(
    small_disk,
):
    runs_dir = small_disk / "runs"
    result = run_trainer_cli(
        ["run", *ARGS, "--steps", "8", "--set", "train.checkpoint_every=2"]
        + ["--runs-dir", str(runs_dir), "--run-id", "full"]
    )
    # the step-2 checkpoint fits, the step-4 one does not
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "Logging error" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "run failed: disk full at step 4" in errors[0]
    run = RunFolder(runs_dir / "full")
    status = run.status()
    assert (status.status, status.reason, status.step) == ("failed", "disk full at step 4", 4)
    assert run.steps()["step"].to_list() == [1, 2, 3, 4]
    assert [p.name for p in run.checkpoints()] == ["step_00000002.pt"]
    assert _tmp_files(small_disk) == []
    assert not (runs_dir / "full" / "run.lock").exists()


@mounts_a_tmpfs
def test_a_disk_filled_by_something_else_still_gets_the_final_status(small_disk):
    """Nothing of the run's own to free: the final status is written in place. With the
    instruments on, so the sampler thread and the profiler meet the full disk too."""
    runs_dir = small_disk / "runs"
    instruments_on = [arg for arg in ARGS if arg not in ("--instruments", "off")]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer",
            "run",
            *instruments_on,
            "--steps",
            "60",
            "--set",
            "data.sample_latency_ms=2",
            "--set",
            "train.checkpoint_every=100000",
            "--runs-dir",
            str(runs_dir),
            "--run-id",
            "filled",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = runs_dir / "filled" / "steps.jsonl"
    try:
        for _ in range(3000):
            if lines.exists() and lines.read_text().count("\n") >= 2:
                break
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.1)
        _fill(small_disk)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-2000:]
    assert "Traceback" not in err and "Logging error" not in err, err[-3000:]
    assert "Exception in thread" not in err
    assert len([line for line in err.splitlines() if " ERROR " in line]) == 1
    status = json.loads((runs_dir / "filled" / "status.json").read_text())
    assert status["status"] == "failed"
    assert status["reason"].startswith(f"disk full at step {status['step']}")
    steps = RunFolder(runs_dir / "filled").steps()["step"].to_list()
    assert steps == list(range(1, status["step"] + 1))
    assert _tmp_files(small_disk) == []
