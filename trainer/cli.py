"""``python -m trainer``: run, resume, list.

Progress goes to stderr (and the run's log.txt); the run folder's path is the last line on
stdout. A bad value is one line ``error: <field>: <what>; allowed: ...`` with exit code 2,
and every check happens before the run folder is created, so a refused run leaves nothing.
A run folder that cannot be created (a full disk, no permission) is exit 2 too, and what
was made of it is removed. A run folder is written by one trainer at a time (run.lock,
trainer/run_lock.py): a second ``resume`` of a live run, or an id taken by a run started
at the same moment, is refused in one line with exit 2.

Exit codes: 0 completed, preempted or cancelled; 1 failed (a full disk mid-run included:
status ``failed``, reason ``disk full at step N``, the records up to step N kept);
2 bad input or a run folder that cannot be created or is in use.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import re
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

from trainer.config import (
    DISTRIBUTED_SCENARIOS,
    SCENARIOS,
    ConfigError,
    TrainerConfig,
    build_config,
    config_fields,
    parse_assignment,
)
from trainer.logs import setup_logging
from trainer.reproducibility import pin_math_libraries

# checked with fullmatch: "$" would also accept an id ending in a newline
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class UsageError(Exception):
    """One-line usage error (exit 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors, as one line
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m trainer", description="The reference trainer.")
    # _worker (one rank under torchrun) is internal: left out of the usage and the help
    sub = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="{run,resume,list}"
    )
    scenarios = "\n".join(f"  {name:14s} {text}" for name, text in SCENARIOS.items())
    scenarios += "\n  with --nproc-per-node 2 or more:\n" + "\n".join(
        f"  {name:14s} {text}" for name, text in DISTRIBUTED_SCENARIOS.items()
    )
    keys = "\n".join(f"  {f.key:34s} {f.allowed} (default {f.default})" for f in config_fields())
    run = sub.add_parser(
        "run",
        help="start a profiled run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"scenarios:\n{scenarios}\n\nconfig keys for --set:\n{keys}",
    )
    run.add_argument("--scenario", default="healthy", help="a preset (below); default healthy")
    run.add_argument("--steps", help="fine-tuning steps (train.steps)")
    run.add_argument(
        "--runs-dir", type=Path, default=None, help="default $PIPELINE_DOCTOR_RUNS_DIR or ./runs"
    )
    run.add_argument("--device", default=None, help="auto, cpu or cuda (default auto)")
    run.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key (repeatable; keys below)",
    )
    run.add_argument("--instruments", default="on", help="on or off (off: no profiler, no sampler)")
    run.add_argument("--memory-lines", action="store_true", help="line-level memory (slow)")
    run.add_argument(
        "--memory-snapshots",
        type=int,
        metavar="STEPS",
        help="CUDA: record allocator history for STEPS steps, snapshots into memory/",
    )
    run.add_argument("--run-id", help="folder name under the runs dir (default: generated)")
    run.add_argument("--parent-run-id", help="the run this one re-runs with a fix")
    run.add_argument("--patch-json", help="a fix's config_patch: JSON object of dotted keys")
    _distributed_args(run, new_run=True)
    resume = sub.add_parser("resume", help="continue a run from its last checkpoint")
    resume.add_argument("run_dir", type=Path)
    _distributed_args(resume, new_run=False)
    worker = sub.add_parser("_worker")  # one rank, started by torchrun (trainer/distributed.py)
    worker.add_argument("--run-dir", type=Path, required=True)
    worker.add_argument("--resume", action="store_true")
    listing = sub.add_parser("list", help="list runs")
    listing.add_argument("--runs-dir", type=Path, default=None)
    return parser


def _distributed_args(parser: argparse.ArgumentParser, *, new_run: bool) -> None:
    """torchrun's own job-shape options (see trainer/dist_launch.py)."""
    if new_run:
        parser.add_argument(
            "--nproc-per-node", type=int, help="processes on this node: a DDP job under torchrun"
        )
        parser.add_argument("--nnodes", type=int, help="nodes in the job (default 1)")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's rank (default 0)")
    parser.add_argument("--rdzv-endpoint", help="HOST:PORT of node 0, with --nnodes > 1")


def _patch(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        patch = json.loads(text)
    except RecursionError:
        raise ConfigError("--patch-json", "JSON nested too deeply", "a flat JSON object") from None
    except ValueError as exc:
        raise ConfigError("--patch-json", f"not JSON ({exc.msg})", "a JSON object") from None
    if not isinstance(patch, dict):
        raise ConfigError("--patch-json", "not a JSON object", '{"train.grad_clip": 1.0}')
    return patch


def config_from_args(
    args: argparse.Namespace, resolved_device: str | None = None
) -> tuple[TrainerConfig, dict[str, Any] | None]:
    """The config (and the applied patch) from ``run``'s arguments; with
    ``resolved_device``, ``model.size=auto`` becomes that device's size preset."""
    if args.instruments not in ("on", "off"):
        raise ConfigError("--instruments", f"{args.instruments!r}", "on, off")
    overrides: list[tuple[str, Any]] = [parse_assignment(item) for item in args.sets]
    patch = _patch(args.patch_json)
    # the fix is applied last: it must win over the scenario and any --set it corrects
    overrides.extend((patch or {}).items())
    if args.instruments == "off":
        overrides.append(("instruments.enabled", False))
    if args.memory_lines:
        overrides.append(("instruments.memory_lines", True))
    if args.memory_snapshots is not None:
        overrides.append(("instruments.memory_snapshot_steps", args.memory_snapshots))
    config = build_config(
        args.scenario,
        overrides,
        steps=args.steps,
        device=args.device,
        resolved_device=resolved_device,
    )
    return config, patch


def check_run_id(flag: str, value: str | None) -> None:
    if value is not None and not RUN_ID_PATTERN.fullmatch(value):
        raise ConfigError(flag, f"{value!r}", "letters, digits, '.', '_', '-' (at most 128)")


def _alive(pid: int | None, host: str | None) -> bool:
    from trainer.run_lock import holder_alive  # not at import: usage errors stay instant

    return holder_alive(pid, host)


def _os_problem(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _cmd_run(args: argparse.Namespace) -> int:
    check_run_id("--run-id", args.run_id)
    check_run_id("--parent-run-id", args.parent_run_id)
    config, patch = config_from_args(args)
    unresolved = config
    from diagnostics.runs import LOG_FILE, RunWriter, default_runs_dir

    runs_dir = args.runs_dir or default_runs_dir()
    distributed = args.nproc_per_node is not None or args.nnodes is not None
    exists_ok = distributed and args.node_rank != 0  # node 0 creates it
    try:
        if args.run_id is not None and (runs_dir / args.run_id).exists() and not exists_ok:
            raise ConfigError("--run-id", f"{runs_dir / args.run_id} already exists", "a new id")
        if runs_dir.exists() and not runs_dir.is_dir():
            raise ConfigError("--runs-dir", f"{runs_dir} is not a directory", "a directory")
    except OSError as exc:
        raise ConfigError("--runs-dir", f"{runs_dir}: {_os_problem(exc)}") from None
    if distributed:
        return _launch(args, config, patch, runs_dir)
    if config.scenario in DISTRIBUTED_SCENARIOS:
        raise ConfigError(
            "--scenario", f"{config.scenario} needs two or more ranks", "--nproc-per-node 2"
        )

    # torch only now: the checks above stay instant, and cuda is the last one needing it
    import torch

    from trainer.runtime import checked_device, choose_threads, run_notes

    device = checked_device(config.device)
    # the size preset follows the device, known only now (still before the run folder exists)
    config, patch = config_from_args(args, resolved_device=device)
    requested_size = "auto" if unresolved.model.size == "auto" else config.model.size
    from trainer.run_io import cpu_count, environment

    threads = choose_threads(config, cpu_count(), device)
    torch.set_num_threads(threads)
    runs_dir_existed = runs_dir.is_dir()
    try:
        writer = RunWriter.create(
            runs_dir,
            config.to_dict(),
            {
                **environment(device, threads),
                # the preset the run got, and what was asked for (auto follows the device)
                "model_size": config.model.size,
                "model_size_requested": requested_size,
            },
            run_id=args.run_id,
            parent_run_id=args.parent_run_id,
            applied_patch=patch,
            notes=run_notes(config, device),
            total_steps=config.train.pretrain_steps + config.train.steps,
        )
    except FileExistsError as exc:  # the same id, started at the same moment, won the mkdir
        raise ConfigError("--run-id", f"{exc.filename} already exists", "a new id") from None
    except OSError as exc:  # RunWriter.create removed the run folder it began
        if not runs_dir_existed:
            with contextlib.suppress(OSError):
                runs_dir.rmdir()  # only if empty: a runs dir made just now for this run
        raise ConfigError(
            "--runs-dir", f"cannot create a run folder in {runs_dir}: {_os_problem(exc)}"
        ) from None
    lock = _lock_new_run(writer.path)
    try:
        setup_logging(writer.path / LOG_FILE)
    except OSError as exc:
        lock.release()
        shutil.rmtree(writer.path, ignore_errors=True)
        raise ConfigError(
            "--runs-dir", f"cannot create a run folder in {runs_dir}: {_os_problem(exc)}"
        ) from None
    return _train(writer, lock, config, device, runs_dir, resume=False)


def _lock_new_run(path: Path) -> Any:
    from trainer.run_lock import RunLock, RunLocked

    try:
        return RunLock.acquire(path)
    except (RunLocked, OSError) as exc:
        shutil.rmtree(path, ignore_errors=True)
        raise ConfigError("--runs-dir", f"cannot lock the new run folder: {exc}") from None


def _cmd_resume(args: argparse.Namespace) -> int:
    from diagnostics.runs import RunFolder
    from trainer.run_lock import RunLock, RunLocked

    run_dir: Path = args.run_dir
    if not RunFolder.is_run_folder(run_dir):
        raise ConfigError("RUN_DIR", f"{run_dir} is not a run folder (no run.json)", "a run folder")
    if args.node_rank != 0:  # node 0's launcher holds the lock and owns the status
        return _resume_other_node(run_dir, args)
    # the lock first: of two resumes started at once, one gets it and the other stops here
    try:
        lock = RunLock.acquire(run_dir)
    except RunLocked as exc:
        raise ConfigError("RUN_DIR", str(exc)) from None
    except OSError as exc:
        raise ConfigError("RUN_DIR", f"{run_dir}: cannot lock: {_os_problem(exc)}") from None
    try:
        return _resume_locked(run_dir, lock, args)
    except BaseException:
        lock.release()
        raise


def _resume_locked(run_dir: Path, lock: Any, args: argparse.Namespace) -> int:
    from diagnostics.runs import (
        CANCEL_FILE,
        LOG_FILE,
        MANIFEST_FILE,
        RunFolder,
        RunFolderError,
        RunWriter,
    )

    folder = RunFolder(run_dir)
    try:
        manifest = folder.manifest()
        status = folder.status()
    except RunFolderError as exc:
        raise ConfigError("RUN_DIR", str(exc)) from None
    # a writer that predates run.lock (or one that lost it) still shows in its status
    if status.status == "running" and _alive(status.pid, status.host):
        raise ConfigError("RUN_DIR", f"{run_dir} is still running (pid {status.pid})")
    elif status.status == "completed":
        raise ConfigError("RUN_DIR", f"{run_dir} already completed")
    try:
        config = TrainerConfig.from_dict(manifest.config)
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError("RUN_DIR", f"{run_dir / MANIFEST_FILE}: config: {exc}") from None
    if manifest.extra.get("distributed"):
        return _resume_distributed(run_dir, manifest.extra["distributed"], config, lock, args)

    import torch

    from trainer.run_io import cpu_count
    from trainer.runtime import choose_threads, resolve_device

    device = resolve_device(config.device)
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "the run used cuda but no CUDA device is available")
    torch.set_num_threads(choose_threads(config, cpu_count(), device))
    try:
        writer = RunWriter.reopen(run_dir)
        (run_dir / CANCEL_FILE).unlink(missing_ok=True)
        setup_logging(writer.path / LOG_FILE)
    except OSError as exc:
        raise ConfigError("RUN_DIR", f"{run_dir}: cannot reopen: {_os_problem(exc)}") from None
    return _train(writer, lock, config, device, run_dir.parent, resume=True)


def _failure(exc: BaseException, step: int) -> str:
    """The run's one-line reason; a full disk says so and at which step."""
    from probe.memory_snapshots import OutOfMemoryRecorded
    from trainer.run_io import os_error_behind

    if isinstance(exc, OutOfMemoryRecorded):
        return str(exc)  # "out of memory at step N: snapshot in PATH"
    cause = os_error_behind(exc)
    if cause is not None and cause.errno in DISK_FULL_ERRNOS:
        where = f" ({cause.filename})" if cause.filename else ""
        return f"disk full at step {step}{where}"
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _train(
    writer: Any, lock: Any, config: TrainerConfig, device: str, runs_dir: Path, resume: bool
) -> int:
    try:
        return _train_locked(writer, config, device, runs_dir, resume)
    finally:
        lock.release()


def _train_locked(
    writer: Any, config: TrainerConfig, device: str, runs_dir: Path, resume: bool
) -> int:
    from diagnostics.runs import LOG_FILE
    from trainer.loop import Trainer
    from trainer.run_io import CACHE_DIR_NAME, Heartbeat, SafeWriter
    from trainer.runtime import StopRequests

    safe = SafeWriter(writer)
    log = logging.getLogger("trainer")
    log.info("run %s: scenario %s on %s", writer.path.name, config.scenario, device)
    heartbeat = Heartbeat(safe)
    heartbeat.start()
    stop = StopRequests()
    stop.install()
    started = time.monotonic()
    trainer = None
    try:
        trainer = Trainer(
            config, safe, device=device, cache_dir=runs_dir / CACHE_DIR_NAME, stop=stop
        )
        outcome = trainer.run(resume_latest=resume)
        status, reason = outcome.status, outcome.reason
    except Exception as exc:
        status, reason = "failed", _failure(exc, writer.last_step)
        # the traceback goes to log.txt only (if the disk takes it): the terminal gets the
        # one-line reason
        with contextlib.suppress(OSError), (writer.path / LOG_FILE).open("a") as handle:
            handle.write(traceback.format_exc())
        log.error("run failed: %s (details in %s)", reason, writer.path / LOG_FILE)
    finally:
        heartbeat.stop()
        stop.uninstall()
    if reason is None and trainer is not None and trainer.resume_note:
        reason = trainer.resume_note  # a completed resume still says what it set aside
    try:
        safe.finalise(status, reason)
    except OSError as exc:
        log.error("could not record the final status: %s", _failure(exc, writer.last_step))
        status = "failed"
    log.info(
        "%s after %.1f s%s", status, time.monotonic() - started, f": {reason}" if reason else ""
    )
    print(writer.path, flush=True)
    return 1 if status == "failed" else 0


def _launch(
    args: argparse.Namespace, config: TrainerConfig, patch: dict[str, Any] | None, runs_dir: Path
) -> int:
    from trainer.dist_launch import LaunchSpec, launch_run
    from trainer.runtime import checked_device

    # the ranks' size preset follows the device too (model.size=auto), as for one process
    config, patch = config_from_args(args, resolved_device=checked_device(config.device))
    spec = LaunchSpec(
        nproc_per_node=1 if args.nproc_per_node is None else args.nproc_per_node,
        nnodes=1 if args.nnodes is None else args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
    )
    run_dir, status, _ = launch_run(
        spec,
        config,
        runs_dir,
        run_id=args.run_id,
        parent_run_id=args.parent_run_id,
        patch=patch,
    )
    print(run_dir, flush=True)
    return 1 if status == "failed" else 0


def _resume_distributed(
    run_dir: Path, info: dict[str, Any], config: TrainerConfig, lock: Any, args: argparse.Namespace
) -> int:
    from trainer.dist_launch import launch_resume, spec_for_resume

    try:
        spec = spec_for_resume(info, args.node_rank, args.rdzv_endpoint)
        spec.validate(config, run_dir.name)
        ended, _ = launch_resume(run_dir, spec)
    finally:
        lock.release()
    print(run_dir, flush=True)
    return 1 if ended == "failed" else 0


def _resume_other_node(run_dir: Path, args: argparse.Namespace) -> int:
    from diagnostics.runs import RunFolder, RunFolderError
    from trainer.dist_launch import launch_resume, spec_for_resume

    try:
        manifest = RunFolder(run_dir).manifest()
        config = TrainerConfig.from_dict(manifest.config)
    except (RunFolderError, TypeError, ValueError, KeyError) as exc:
        raise ConfigError("RUN_DIR", f"{run_dir}: {exc}") from None
    info = manifest.extra.get("distributed")
    if not info:
        raise ConfigError("--node-rank", f"{run_dir} is a single-process run", "0")
    spec = spec_for_resume(info, args.node_rank, args.rdzv_endpoint)
    spec.validate(config, run_dir.name)
    ended, _ = launch_resume(run_dir, spec)
    print(run_dir, flush=True)
    return 1 if ended == "failed" else 0


def _cmd_list(args: argparse.Namespace) -> int:
    from diagnostics.runs import default_runs_dir, list_runs

    runs_dir = args.runs_dir or default_runs_dir()
    listings = list_runs(runs_dir)
    if listings:  # tab-separated, one run a line under one header line
        print("run\tscenario\tstatus\tsteps\tcreated (UTC)\treason")
    for run in listings:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(run.created_at))
        steps = f"{run.status.step}/{run.status.total_steps or '?'}"
        what = run.scenario or (f"script {run.script}" if run.script else "-")
        print(
            f"{run.run_id}\t{what}\t{run.status.status}\t{steps}\t{created}"
            + (f"\t{run.status.reason}" if run.status.reason else "")
        )
    if not listings:
        print(f"no runs in {runs_dir}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    # before the first matmul of this process and of every rank or worker it starts
    pin_math_libraries()
    try:
        args = _parser().parse_args(argv)
        if args.command == "run":
            return _cmd_run(args)
        if args.command == "resume":
            return _cmd_resume(args)
        if args.command == "_worker":
            from trainer.worker import worker_main

            return worker_main(args.run_dir, args.resume)
        return _cmd_list(args)
    except (ConfigError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
