"""Start a user's own script from the app: ``python -m probe profile ... SCRIPT ARGS``.

Imports no torch and no streamlit: the app's Launch page and Re-run with fix call it. A
served app runs whatever script it is told to, so only scripts under one folder that the
operator names (``PIPELINE_DOCTOR_SCRIPTS_DIR``, unset by default: script runs are off)
can be started; the path is resolved (symlinks and ``..``) before it is checked. The
arguments are split as a shell would split them but never given to a shell. The run gets
the same launch bounds as a trainer run (trainer.launch_bounds: steps, DataLoader workers,
processes, wall time) and the same one-run-at-a-time rule; it is cancelled the same way
(``trainer.launch.cancel_run``: the wrapper watches for the cancel request).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagnostics.runs import RunManifest, default_runs_dir, new_run_id
from probe.overrides import OVERRIDE_PREFIX, as_patch, from_patch
from trainer.launch import LAUNCH_LOG_DIR, PROJECT_ROOT, LaunchedRun, active_runs, spawn_run
from trainer.launch_bounds import BOUND_DEFAULTS, LaunchBounds

SCRIPTS_DIR_ENV = "PIPELINE_DOCTOR_SCRIPTS_DIR"
NOT_ENABLED = (
    f"Script runs are off on this server: serve the app with `pipeline-doctor app` from the "
    f"script's folder, or set {SCRIPTS_DIR_ENV} to the folder whose scripts may be launched "
    "and restart it."
)
STEPS_ENV, MAX_STEPS = BOUND_DEFAULTS["train.steps"]
WORKERS_ENV, MAX_WORKERS = BOUND_DEFAULTS["data.num_workers"]


class ScriptRefused(ValueError):
    """A script run that may not start here; ``str()`` is one line naming the field."""


@dataclass(frozen=True)
class ScriptRequest:
    """What the form (or a re-run) asks for; ``start_script_run`` checks all of it."""

    script: str  # as typed: relative to the scripts folder, or absolute
    arguments: tuple[str, ...] = ()
    steps: int | None = None  # None: as many as the script takes
    nproc_per_node: int = 1
    overrides: Mapping[str, Any] | None = None  # num_workers=4 (probe.overrides keys)
    alert_after_s: float | None = None  # the too-long-run alert (probe.alert); None: off
    # how it is measured: a re-run is measured as the run it re-runs was
    trace: bool = True  # a torch.profiler window (--no-trace when False)
    sample_hz: float | None = None  # None: the wrapper's default
    memory_snapshots: int = 0
    memory_snapshot_stacks: str = "python"


def scripts_dir(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The folder scripts may be launched from, resolved; None when script runs are off."""
    raw = environ.get(SCRIPTS_DIR_ENV, "").strip()
    if not raw:
        return None
    folder = Path(raw).expanduser().resolve()
    if not folder.is_dir():
        raise ScriptRefused(f"{SCRIPTS_DIR_ENV}: {raw} is not a folder")
    return folder


def resolve_script(path_text: str, environ: Mapping[str, str] = os.environ) -> Path:
    """The script's real path, when it is a file under the scripts folder; else one line.

    Relative paths are taken from the scripts folder. The check is on the path with every
    symlink and ``..`` resolved, so a link inside the folder to a file outside is refused.
    """
    folder = scripts_dir(environ)
    if folder is None:
        raise ScriptRefused(NOT_ENABLED)
    text = path_text.strip()
    if not text:
        raise ScriptRefused("script: give a path under the scripts folder")
    if "\x00" in text:
        raise ScriptRefused("script: the path holds a NUL character")
    resolved = (folder / Path(text).expanduser()).resolve()
    if not resolved.is_relative_to(folder):
        raise ScriptRefused(
            f"script: {text} is outside the scripts folder {folder} ({SCRIPTS_DIR_ENV}); "
            "only scripts under it may be launched"
        )
    if not resolved.is_file():
        raise ScriptRefused(f"script: {text} is not a file under {folder}")
    return resolved


def split_arguments(text: str) -> tuple[str, ...]:
    """The script's arguments as a POSIX shell splits them (quotes kept together), for a
    list given to exec, never to a shell: ``;`` or ``$(...)`` are plain characters."""
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:  # an unclosed quote
        raise ScriptRefused(f"arguments: {exc} in {text!r}") from None


def check_request(
    request: ScriptRequest, environ: Mapping[str, str] = os.environ
) -> tuple[Path, dict[str, Any]]:
    """The resolved script and parsed overrides, or ScriptRefused naming what is wrong
    (the scripts folder, a bad override, a value above this server's launch bounds)."""
    script = resolve_script(request.script, environ)
    try:
        overrides = from_patch(as_patch(dict(request.overrides or {})))
        bounds = LaunchBounds.from_environ(environ)
    except ValueError as exc:
        raise ScriptRefused(str(exc)) from None
    problems = list(bounds.check_processes(request.nproc_per_node).values())
    if request.nproc_per_node < 1:
        problems.append("processes per node: 1 or more")
    if request.alert_after_s is not None and not request.alert_after_s > 0:
        problems.append(f"alert after: {request.alert_after_s:g} s is not a positive number")
    if request.steps is not None:
        _, max_steps = bounds.limits["train.steps"]
        if request.steps < 1:
            problems.append("steps: 1 or more (or leave it to the script)")
        elif request.steps > max_steps:
            problems.append(
                f"steps: {request.steps:,} is above this server's launch limit "
                f"(<= {max_steps:,}, {STEPS_ENV})"
            )
    _, max_workers = bounds.limits["data.num_workers"]
    workers = overrides.get("num_workers")
    if workers is not None and workers > max_workers:
        problems.append(
            f"{OVERRIDE_PREFIX}num_workers: {workers:,} is above this server's launch limit "
            f"(<= {max_workers:,}, {WORKERS_ENV})"
        )
    if problems:
        raise ScriptRefused("; ".join(problems))
    return script, overrides


def script_command(
    script: Path,
    request: ScriptRequest,
    overrides: Mapping[str, Any],
    *,
    runs_dir: Path,
    run_id: str,
    max_runtime_s: float,
    parent_run_id: str | None = None,
) -> list[str]:
    """The wrapper's command line: an absolute script path, so no argument after it can be
    read as one of the wrapper's own options."""
    command = [sys.executable, "-m", "probe", "profile", "--runs-dir", str(runs_dir)]
    command += ["--run-id", run_id, "--max-runtime-s", f"{max_runtime_s:g}"]
    if request.steps is not None:
        command += ["--steps", str(request.steps)]
    if request.alert_after_s is not None:
        command += ["--alert-after-s", f"{request.alert_after_s:g}"]
    for key, value in overrides.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        command += ["--override", f"{OVERRIDE_PREFIX}{key}={text}"]
    if request.nproc_per_node > 1:
        command += ["--nproc-per-node", str(request.nproc_per_node)]
    if not request.trace:
        command.append("--no-trace")
    if request.sample_hz is not None:
        command += ["--sample-hz", f"{request.sample_hz:g}"]
    if request.memory_snapshots > 0:
        command += ["--memory-snapshots", str(request.memory_snapshots)]
        command += ["--memory-snapshot-stacks", request.memory_snapshot_stacks]
    if parent_run_id:
        command += ["--parent-run-id", parent_run_id]
    return [*command, str(script), *request.arguments]


def start_script_run(
    request: ScriptRequest,
    *,
    runs_dir: str | os.PathLike[str] | None = None,
    parent_run_id: str | None = None,
    environ: Mapping[str, str] = os.environ,
    timeout_s: float = 90.0,
) -> LaunchedRun:
    """Starts ``pipeline-doctor profile`` detached; returns once its run folder exists.

    Raises ScriptRefused (one line) before anything starts, and trainer.launch.LaunchError
    when the wrapper exits or stays silent without creating its folder.
    """
    script, overrides = check_request(request, environ)
    root = Path(default_runs_dir() if runs_dir is None else runs_dir).resolve()
    busy = active_runs(root)
    if busy:
        raise ScriptRefused(
            f"{busy[0].run_id} is using the device; one run at a time: wait for it or cancel it"
        )
    root.mkdir(parents=True, exist_ok=True)
    run_id = new_run_id(f"script-{script.stem}"[:40])
    while (root / run_id).exists():  # two starts in the same millisecond
        time.sleep(0.002)
        run_id = new_run_id(f"script-{script.stem}"[:40])
    max_runtime_s = float(LaunchBounds.from_environ(environ).max_runtime_s)
    command = script_command(
        script,
        request,
        overrides,
        runs_dir=root,
        run_id=run_id,
        max_runtime_s=max_runtime_s,
        parent_run_id=parent_run_id,
    )
    (root / LAUNCH_LOG_DIR).mkdir(exist_ok=True)
    pythonpath = [str(PROJECT_ROOT), environ.get("PYTHONPATH", "")]
    env = {**environ, "PYTHONPATH": os.pathsep.join(p for p in pythonpath if p)}
    # the script's own folder, as `cd scripts && python train.py` would: relative data paths
    return spawn_run(
        command,
        root / run_id,
        root / LAUNCH_LOG_DIR / f"{run_id}.log",
        cwd=script.parent,
        env=env,
        timeout_s=timeout_s,
        what="the profile wrapper",
    )


def rerun_request(manifest: RunManifest, patch: Mapping[str, Any]) -> ScriptRequest:
    """The same script, arguments, steps and processes as a script run, with its own
    overrides and a finding's ``dataloader.*`` patch on top. ScriptRefused when the run is
    not a script run or the patch has keys the wrapper cannot apply."""
    if manifest.kind != "script":
        raise ScriptRefused(f"{manifest.run_id}: not a script run")
    script = manifest.extra.get("script") or {}
    path = script.get("path")
    if not isinstance(path, str):
        raise ScriptRefused(f"{manifest.run_id}: run.json records no script path")
    try:
        overrides = {**(manifest.config.get("dataloader") or {}), **from_patch(dict(patch))}
    except ValueError as exc:
        raise ScriptRefused(f"the fix's patch: {exc}") from None
    config = manifest.config
    steps = config.get("steps")
    alert_after_s = config.get("alert_after_s")
    sample_hz = config.get("sample_hz")
    snapshots = config.get("memory_snapshots") or {}
    return ScriptRequest(
        script=path,
        arguments=tuple(str(a) for a in script.get("args") or ()),
        steps=int(steps) if steps else None,
        nproc_per_node=int(config.get("nproc_per_node") or 1),
        overrides=overrides,
        alert_after_s=float(alert_after_s) if alert_after_s else None,
        trace=(config.get("profiler") or {}).get("enabled") is not False,
        sample_hz=float(sample_hz) if isinstance(sample_hz, int | float) else None,
        memory_snapshots=int(snapshots.get("steps") or 0),
        memory_snapshot_stacks=str(snapshots.get("stacks") or "python"),
    )


def rerun_blocker(manifest: RunManifest, environ: Mapping[str, str] = os.environ) -> str | None:
    """Why Re-run with fix cannot start this script run here (one line), or None: script
    runs off, the script no longer under the scripts folder, or changed since (a re-run of
    another file would not prove the fix)."""
    try:
        request = rerun_request(manifest, {})
        script = resolve_script(request.script, environ)
    except ScriptRefused as exc:
        return str(exc)
    recorded = (manifest.extra.get("script") or {}).get("sha256")
    if recorded != hashlib.sha256(script.read_bytes()).hexdigest():
        return (
            f"script: {script} changed since {manifest.run_id} ran (its sha256 differs); "
            "a re-run would not measure the same script"
        )
    return None


def start_rerun(
    manifest: RunManifest,
    patch: Mapping[str, Any],
    *,
    runs_dir: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> LaunchedRun:
    """Re-run with fix for a script run: the same script, unedited, with the patch as
    ``--override`` on the run's own overrides, linked to the run it re-runs. ScriptRefused
    (``rerun_blocker``'s line, or a patch the wrapper cannot apply) before anything starts."""
    blocker = rerun_blocker(manifest, environ)
    if blocker is not None:
        raise ScriptRefused(blocker)
    return start_script_run(
        rerun_request(manifest, patch),
        runs_dir=runs_dir,
        parent_run_id=manifest.run_id,
        environ=environ,
    )
