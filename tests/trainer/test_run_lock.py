"""One trainer per run folder: run.lock (O_EXCL, pid and host), stale locks recovered,
and two real processes racing for one folder: one proceeds, the other gets one line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diagnostics.runs import HEARTBEAT_STALE_AFTER_S, LOCK_FILE, RunFolder, RunWriter
from tests.conftest import start_trainer_cli
from trainer.config import build_config
from trainer.run_lock import RunLock, RunLocked

# a short CPU run whose loader is slow enough (10 ms a sample) to outlast the other
# process's start-up, so the two really overlap
TINY = {
    "data.rows": 200,
    "data.num_workers": 0,
    "data.sample_latency_ms": 10,
    "train.pretrain_steps": 0,
    "train.batch_size": 16,
    "runtime.threads": 1,
    "instruments.enabled": False,
}
TINY_ARGS = [item for key, value in TINY.items() for item in ("--set", f"{key}={value}")]


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def _write_lock(run_dir: Path, pid: int, host: str) -> None:
    (run_dir / LOCK_FILE).write_text(json.dumps({"pid": pid, "host": host, "at": time.time()}))


def test_a_held_lock_refuses_a_second_holder_until_released(tmp_path):
    lock = RunLock.acquire(tmp_path)
    holder = json.loads((tmp_path / LOCK_FILE).read_text())
    assert (holder["pid"], holder["host"]) == (os.getpid(), socket.gethostname())
    with pytest.raises(RunLocked, match=rf"locked by a running trainer \(pid {os.getpid()} on "):
        RunLock.acquire(tmp_path)
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()
    RunLock.acquire(tmp_path).release()


def test_a_lock_whose_process_is_gone_on_this_host_is_recovered(tmp_path):
    _write_lock(tmp_path, _dead_pid(), socket.gethostname())
    lock = RunLock.acquire(tmp_path)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


def test_a_lock_from_another_host_is_trusted_while_the_run_beats(tmp_path):
    writer = RunWriter.create(tmp_path, {"scenario": "healthy"}, {}, run_id="elsewhere")
    _write_lock(writer.path, 12345, "another-host")
    with pytest.raises(RunLocked, match=r"pid 12345 on another-host"):
        RunLock.acquire(writer.path)
    # the other host's writer went silent: its heartbeat is stale, as status() reads it
    status = json.loads((writer.path / "status.json").read_text())
    status["heartbeat"] = time.time() - HEARTBEAT_STALE_AFTER_S - 5
    (writer.path / "status.json").write_text(json.dumps(status))
    RunLock.acquire(writer.path).release()


def _one_winner(procs: list[subprocess.Popen[str]]) -> tuple[tuple[str, str], tuple[str, str]]:
    """(stdout, stderr) of the process that ran and of the one refused."""
    results = [(proc.wait(timeout=300), *proc.communicate()) for proc in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], [(code, err[-1500:]) for code, _, err in results]
    won = next((out, err) for code, out, err in results if code == 0)
    lost = next((out, err) for code, out, err in results if code == 2)
    return won, lost


def test_two_resumes_of_one_run_at_once_one_runs_the_other_is_refused(tmp_path):
    config = build_config("healthy", TINY, steps=4, device="cpu")
    writer = RunWriter.create(tmp_path, config.to_dict(), {}, run_id="twice", total_steps=4)
    writer.finalise("preempted", "SIGTERM received: checkpointed for resume")
    _write_lock(writer.path, _dead_pid(), socket.gethostname())  # left by a kill -9
    procs = [start_trainer_cli(["resume", str(writer.path)]) for _ in range(2)]
    (won_out, _), (lost_out, lost_err) = _one_winner(procs)
    assert won_out.strip().splitlines()[-1] == str(writer.path)
    assert lost_out == ""
    assert lost_err.startswith(f"error: RUN_DIR: {writer.path} is locked by a running trainer")
    assert lost_err.count("\n") == 1
    run = RunFolder(writer.path)
    assert run.status().status == "completed"
    # one writer: each step recorded once, not interleaved from two trainers
    lines = [json.loads(x)["step"] for x in (writer.path / "steps.jsonl").read_text().splitlines()]
    assert lines == [1, 2, 3, 4]
    assert not (writer.path / LOCK_FILE).exists()


def test_the_same_run_id_started_twice_at_once_one_runs_the_other_is_refused(tmp_path):
    args = ["run", "--runs-dir", str(tmp_path), "--run-id", "dup", "--device", "cpu"]
    args += ["--steps", "2", *TINY_ARGS]
    procs = [start_trainer_cli(args) for _ in range(2)]
    (won_out, _), (lost_out, lost_err) = _one_winner(procs)
    assert won_out.strip().splitlines()[-1] == str(tmp_path / "dup")
    assert lost_out == ""
    assert lost_err == f"error: --run-id: {tmp_path / 'dup'} already exists; allowed: a new id\n"
    assert RunFolder(tmp_path / "dup").status().status == "completed"
