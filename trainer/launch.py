"""Start, cancel and list trainer runs as subprocesses. Imports no torch: the app uses it.

A run is ``python -m trainer run ... --run-id ID`` in its own session (so it outlives the
app's request and a Ctrl-C in the app's terminal does not reach it). Its stdout/stderr go
to ``<runs_dir>/.launch/<run_id>.log``: the run folder does not exist until the trainer
creates it (it refuses to start into an existing folder); the trainer writes its own
``log.txt`` inside the folder.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagnostics.runs import (
    CANCEL_FILE,
    MANIFEST_FILE,
    STATUS_FILE,
    RunFolder,
    RunListing,
    default_runs_dir,
    list_runs,
    new_run_id,
)
from trainer.config import DISTRIBUTED_SCENARIOS, SCENARIOS, FieldInfo, build_config
from trainer.config import config_fields as _config_fields
from trainer.config import validate_overrides as _validate_overrides
from trainer.launch_bounds import LaunchBounds

LAUNCH_LOG_DIR = ".launch"
PROJECT_ROOT = Path(__file__).resolve().parents[1]

__all__ = [
    "DISTRIBUTED_SCENARIOS",
    "SCENARIOS",
    "LaunchError",
    "LaunchedRun",
    "active_runs",
    "cancel_run",
    "config_fields",
    "device_error",
    "job_arguments",
    "other_node_command",
    "spawn_run",
    "start_run",
    "validate_overrides",
]


class LaunchError(RuntimeError):
    """The trainer refused the run or died before creating its folder.

    ``str()`` is one line (the trainer's last line: its own one-line error, or the
    exception of a crash); ``log_tail`` holds the last lines of its output.
    """

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message)
        self.log_tail = log_tail


@dataclass(frozen=True)
class LaunchedRun:
    run_id: str
    run_dir: Path
    pid: int
    command: tuple[str, ...] = ()  # as started (other nodes of a job run it with their rank)


def config_fields() -> list[FieldInfo]:
    """Every config key with type, default, allowed values and help (for the form)."""
    return _config_fields()


def validate_overrides(
    overrides: Mapping[str, object], scenario: str = "healthy"
) -> dict[str, str]:
    """Field -> one-line error for each bad override or value above this server's launch
    bounds (trainer.launch_bounds); empty when the form is fine."""
    errors = _validate_overrides(overrides, scenario)
    if errors:
        return errors
    try:
        return LaunchBounds.from_environ().check(build_config(scenario, dict(overrides)))
    except ValueError as exc:  # a bound set to something that is not a number
        return {"": str(exc)}


# The probe imports torch in a child (this module must not import it: the app uses it).
_CUDA_PROBE = (
    "import torch; print(int(torch.cuda.is_available()), torch.cuda.device_count() "
    "if torch.cuda.is_available() else 0)"
)
CUDA_PROBE_TIMEOUT_S = 120.0


@functools.lru_cache(maxsize=1)
def _cuda_devices() -> int | None:
    """How many CUDA devices torch sees here (0: none); None when torch cannot say.

    Cached for the process: drivers and GPUs do not come and go under a running app.
    """
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CUDA_PROBE],
            capture_output=True,
            text=True,
            timeout=CUDA_PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = done.stdout.split()
    if done.returncode != 0 or len(fields) != 2:
        return None
    return int(fields[1]) if fields[0] == "1" else 0


def device_error(device: str) -> str | None:
    """Why the trainer could not run on ``device`` here (one line for the Device field), or
    None. "auto" and "cpu" always run; "cuda" needs a device torch can use."""
    if not str(device).startswith("cuda"):
        return None
    count = _cuda_devices()
    if count is None:
        return "could not check for CUDA here (torch did not answer); try auto or cpu"
    if count == 0:
        return (
            "CUDA was requested but this machine has no CUDA device torch can use "
            "(torch.cuda.is_available() is False); choose auto or cpu"
        )
    return None


def _reap(process: subprocess.Popen[bytes]) -> None:
    # The run outlives the request that started it; without a wait() its exit would leave
    # a zombie in the app's process table until the app exits.
    threading.Thread(target=process.wait, name=f"reap-{process.pid}", daemon=True).start()


def _format_value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def job_arguments(
    nproc_per_node: int = 1, nnodes: int = 1, rdzv_endpoint: str | None = None
) -> list[str]:
    """The trainer's torchrun options for a job shape ([] for one process on one node).

    Raises ValueError for a shape the trainer would refuse, so the form says it first.
    """
    if nproc_per_node < 1 or nnodes < 1:
        raise ValueError("processes per node and nodes: 1 or more")
    if nproc_per_node == 1 and nnodes == 1:
        return []
    arguments = ["--nproc-per-node", str(nproc_per_node)]
    if nnodes > 1:
        host, _, port = (rdzv_endpoint or "").rpartition(":")
        if not host or not port.isdigit():
            raise ValueError("rendezvous endpoint: HOST:PORT of node 0, reachable by every node")
        # node 0's command; other_node_command gives each other node its own rank
        arguments += ["--nnodes", str(nnodes), "--node-rank", "0"]
        arguments += ["--rdzv-endpoint", str(rdzv_endpoint)]
    return arguments


def other_node_command(command: list[str], node_rank: int) -> str:
    """The command another node runs to join a multi-node job started with ``command``:
    the same arguments (run id, runs dir on the shared file system) and its own node rank."""
    joined = list(command)
    joined[joined.index("--node-rank") + 1] = str(node_rank)
    joined[0] = "python"  # the other node's interpreter, not this one's path
    return shlex.join(joined)


def start_run(
    *,
    scenario: str,
    overrides: Mapping[str, object],
    runs_dir: str | os.PathLike[str] | None = None,
    steps: int | None = None,
    device: str = "auto",
    instruments: bool = True,
    parent_run_id: str | None = None,
    applied_patch: Mapping[str, Any] | None = None,
    memory_lines: bool = False,
    timeout_s: float = 90.0,
    nproc_per_node: int = 1,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
) -> LaunchedRun:
    """Starts a detached trainer; returns once its run.json and status.json exist.

    Raises ``trainer.config.ConfigError`` (a ValueError) for a bad override or one above the
    launch bounds (before anything starts) and ``LaunchError``
    when the trainer exits or stays silent without creating its folder (with its log tail).
    """
    # the same checks the trainer makes, here, so a bad form never starts a process; then
    # this server's launch bounds, whatever the caller (form, re-run) checked before
    config = build_config(scenario, dict(overrides), steps=steps, device=device)
    bounds = LaunchBounds.from_environ()
    too_big = bounds.check(config)
    job = job_arguments(nproc_per_node, nnodes, rdzv_endpoint)
    too_big.update(bounds.check_processes(nproc_per_node))
    if scenario in DISTRIBUTED_SCENARIOS and nproc_per_node * nnodes < 2:
        raise ValueError(f"{scenario} needs two or more processes")
    if applied_patch:
        too_big.update(bounds.check(build_config(scenario, {**overrides, **applied_patch})))
    if too_big:
        raise ValueError("; ".join(too_big.values()))
    # every launched run stops cleanly at the wall-time bound (the trainer's own budget)
    runtime_s = bounds.runtime_s(config.train.max_runtime_s)
    overrides = {**overrides, "train.max_runtime_s": runtime_s}
    # absolute: the child runs with the project root as its working directory
    root = Path(default_runs_dir() if runs_dir is None else runs_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    run_id = new_run_id(scenario)
    while (root / run_id).exists():  # two starts in the same millisecond
        time.sleep(0.002)
        run_id = new_run_id(scenario)
    run_dir = root / run_id
    command = [sys.executable, "-m", "trainer", "run", "--scenario", scenario]
    command += ["--runs-dir", str(root), "--run-id", run_id, "--device", device]
    if steps is not None:
        command += ["--steps", str(steps)]
    for key, value in overrides.items():
        command += ["--set", f"{key}={_format_value(value)}"]
    if not instruments:
        command += ["--instruments", "off"]
    if memory_lines:
        command.append("--memory-lines")
    if parent_run_id:
        command += ["--parent-run-id", parent_run_id]
    if applied_patch:
        command += ["--patch-json", json.dumps(dict(applied_patch))]
    command += job

    log_dir = root / LAUNCH_LOG_DIR
    log_dir.mkdir(exist_ok=True)
    # the child must import this checkout's trainer whatever the caller's cwd
    pythonpath = [str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in pythonpath if p)}
    return spawn_run(
        command, run_dir, log_dir / f"{run_id}.log", cwd=PROJECT_ROOT, env=env, timeout_s=timeout_s
    )


def spawn_run(
    command: list[str],
    run_dir: Path,
    log_path: Path,
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    what: str = "trainer",
) -> LaunchedRun:
    """Starts ``command`` in its own session, its output appended to ``log_path``, and
    returns once it has created ``run_dir`` with run.json and status.json; LaunchError
    (with the log's tail) when it exits or stays silent before that."""
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env),
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run_dir / MANIFEST_FILE).is_file() and (run_dir / STATUS_FILE).is_file():
            _reap(process)  # only now: a thread already waiting would make poll() see None
            return LaunchedRun(
                run_id=run_dir.name, run_dir=run_dir, pid=process.pid, command=tuple(command)
            )
        code = process.poll()
        if code is not None:
            tail = _tail(log_path)
            raise LaunchError(
                f"{what} exited with code {code} before creating {run_dir}: "
                + (tail.splitlines()[-1] if tail else "no output"),
                tail,
            )
        time.sleep(0.05)
    _reap(process)
    tail = _tail(log_path)
    raise LaunchError(
        f"{what} (pid {process.pid}) did not create {run_dir} within {timeout_s:g} s "
        f"(still starting? see {log_path})",
        tail,
    )


def cancel_run(run_dir: str | os.PathLike[str]) -> None:
    """Asks a run to stop: the trainer checks for this file every step."""
    path = Path(run_dir)
    if not RunFolder.is_run_folder(path):
        raise ValueError(f"{path}: not a run folder")
    (path / CANCEL_FILE).touch()


def active_runs(runs_dir: str | os.PathLike[str] | None = None) -> list[RunListing]:
    """Runs whose status is running with a live heartbeat, newest first."""
    found = list_runs(default_runs_dir() if runs_dir is None else runs_dir)
    return [run for run in found if run.status.is_active]
