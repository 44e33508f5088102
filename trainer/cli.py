"""``python -m trainer``: run, resume, list.

Progress goes to stderr (and the run's log.txt); the run folder's path is the last line on
stdout. A bad value is one line ``error: <field>: <what>; allowed: ...`` with exit code 2,
and every check happens before the run folder is created, so a refused run leaves nothing.
Exit codes: 0 completed, preempted or cancelled; 1 failed; 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

from trainer.config import (
    SCENARIOS,
    ConfigError,
    TrainerConfig,
    build_config,
    config_fields,
    parse_assignment,
)

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CACHE_DIR_NAME = ".cache"  # under the runs directory: the tokenizer cache


def default_runs_dir() -> Path:
    return Path(os.environ.get("PIPELINE_DOCTOR_RUNS_DIR", "runs"))


class UsageError(Exception):
    """One-line usage error (exit 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors, as one line
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m trainer", description="The reference trainer.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    scenarios = "\n".join(f"  {name:14s} {text}" for name, text in SCENARIOS.items())
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
    except ValueError as exc:
        raise ConfigError("--patch-json", f"not JSON ({exc.msg})", "a JSON object") from None
    if not isinstance(patch, dict):
        raise ConfigError("--patch-json", "not a JSON object", '{"train.grad_clip": 1.0}')
    return patch


def config_from_args(args: argparse.Namespace) -> tuple[TrainerConfig, dict[str, Any] | None]:
    """The resolved config (and the applied patch) from ``run``'s arguments."""
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
    config = build_config(args.scenario, overrides, steps=args.steps, device=args.device)
    return config, patch


def _setup_logging(log_path: Path) -> None:
    logger = logging.getLogger("trainer")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
    for handler in (logging.StreamHandler(sys.stderr), logging.FileHandler(log_path)):
        handler.setFormatter(fmt)
        logger.addHandler(handler)


def _cmd_run(args: argparse.Namespace) -> int:
    config, patch = config_from_args(args)
    runs_dir = args.runs_dir or default_runs_dir()
    distributed = args.nproc_per_node is not None or args.nnodes is not None
    if args.run_id is not None and not RUN_ID_PATTERN.match(args.run_id):
        raise ConfigError("--run-id", f"{args.run_id!r}", "letters, digits, '.', '_', '-'")
    exists_ok = distributed and args.node_rank != 0  # node 0 creates it
    if args.run_id is not None and (runs_dir / args.run_id).exists() and not exists_ok:
        raise ConfigError("--run-id", f"{runs_dir / args.run_id} already exists", "a new id")
    if runs_dir.exists() and not runs_dir.is_dir():
        raise ConfigError("--runs-dir", f"{runs_dir} is not a directory", "a directory")
    if distributed:
        return _launch(args, config, patch, runs_dir)

    # torch only now: the checks above stay instant, and cuda is the last one needing it
    import torch

    from trainer.runtime import choose_threads, resolve_device, run_notes

    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "cuda requested but no CUDA device is available", "auto, cpu")
    device = resolve_device(config.device)
    from diagnostics.runs import RunWriter
    from trainer.run_io import cpu_count, environment

    threads = choose_threads(config, cpu_count(), device)
    torch.set_num_threads(threads)
    writer = RunWriter.create(
        runs_dir,
        config.to_dict(),
        environment(device, threads),
        run_id=args.run_id,
        parent_run_id=args.parent_run_id,
        applied_patch=patch,
        notes=run_notes(config, device),
        total_steps=config.train.pretrain_steps + config.train.steps,
    )
    return _train(writer, config, device, runs_dir, resume_from=None)


def _alive(pid: int | None, host: str | None) -> bool:
    """Whether the process that wrote a "running" status still exists.

    A killed run reads "running" until its heartbeat goes stale (15 s); on the same host
    the process table settles it at once. On another host, trust the heartbeat.
    """
    import socket

    import psutil

    if pid is None or host != socket.gethostname():
        return True
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cmd_resume(args: argparse.Namespace) -> int:
    from diagnostics.runs import RunFolder, RunFolderError

    run_dir: Path = args.run_dir
    if not RunFolder.is_run_folder(run_dir):
        raise ConfigError("RUN_DIR", f"{run_dir} is not a run folder (no run.json)", "a run folder")
    folder = RunFolder(run_dir)
    try:
        manifest = folder.manifest()
        status = folder.status()
    except RunFolderError as exc:
        raise ConfigError("RUN_DIR", str(exc)) from None
    if args.node_rank != 0 and manifest.extra.get("distributed"):
        pass  # node 0's launcher owns the status (it may already read running again)
    elif status.status == "running" and _alive(status.pid, status.host):
        raise ConfigError("RUN_DIR", f"{run_dir} is still running (pid {status.pid})")
    elif status.status == "completed":
        raise ConfigError("RUN_DIR", f"{run_dir} already completed")
    config = TrainerConfig.from_dict(manifest.config)
    if manifest.extra.get("distributed"):
        from trainer.dist_launch import launch_resume, spec_for_resume

        spec = spec_for_resume(manifest.extra["distributed"], args.node_rank, args.rdzv_endpoint)
        spec.validate(config, folder.run_id)
        ended, _ = launch_resume(run_dir, spec)
        print(run_dir, flush=True)
        return 1 if ended == "failed" else 0

    import torch

    from diagnostics.runs import RunWriter
    from trainer.run_io import cpu_count
    from trainer.runtime import choose_threads, latest_checkpoint, resolve_device

    device = resolve_device(config.device)
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "the run used cuda but no CUDA device is available")
    torch.set_num_threads(choose_threads(config, cpu_count(), device))
    writer = RunWriter.reopen(run_dir)
    (run_dir / "cancel.request").unlink(missing_ok=True)
    return _train(writer, config, device, run_dir.parent, resume_from=latest_checkpoint(run_dir))


def _train(writer: Any, config: TrainerConfig, device: str, runs_dir: Path, resume_from) -> int:
    from trainer.loop import Trainer
    from trainer.run_io import Heartbeat, SafeWriter
    from trainer.runtime import StopRequests

    safe = SafeWriter(writer)
    _setup_logging(writer.path / "log.txt")
    log = logging.getLogger("trainer")
    log.info("run %s: scenario %s on %s", writer.path.name, config.scenario, device)
    heartbeat = Heartbeat(safe)
    heartbeat.start()
    stop = StopRequests()
    stop.install()
    started = time.monotonic()
    try:
        trainer = Trainer(
            config, safe, device=device, cache_dir=runs_dir / CACHE_DIR_NAME, stop=stop
        )
        outcome = trainer.run(resume_from)
        status, reason = outcome.status, outcome.reason
    except Exception as exc:
        status, reason = "failed", f"{type(exc).__name__}: {exc}"
        # the traceback goes to log.txt only: the terminal gets the one-line reason
        with (writer.path / "log.txt").open("a") as handle:
            handle.write(traceback.format_exc())
        log.error("run failed: %s (traceback in %s)", reason, writer.path / "log.txt")
    finally:
        heartbeat.stop()
        stop.uninstall()
    safe.finalise(status, reason)  # type: ignore[arg-type]
    log.info(
        "%s after %.1f s%s", status, time.monotonic() - started, f": {reason}" if reason else ""
    )
    print(writer.path, flush=True)
    return 1 if status == "failed" else 0


def _launch(
    args: argparse.Namespace, config: TrainerConfig, patch: dict[str, Any] | None, runs_dir: Path
) -> int:
    from trainer.dist_launch import LaunchSpec, launch_run

    spec = LaunchSpec(
        nproc_per_node=args.nproc_per_node or 1,
        nnodes=args.nnodes or 1,
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


def _cmd_list(args: argparse.Namespace) -> int:
    from diagnostics.runs import list_runs

    runs_dir = args.runs_dir or default_runs_dir()
    listings = list_runs(runs_dir)
    for run in listings:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(run.created_at))
        steps = f"{run.status.step}/{run.status.total_steps or '?'}"
        print(
            f"{run.run_id}\t{run.scenario or '-'}\t{run.status.status}\t{steps}\t{created}"
            + (f"\t{run.status.reason}" if run.status.reason else "")
        )
    if not listings:
        print(f"no runs in {runs_dir}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        if args.command == "run":
            return _cmd_run(args)
        if args.command == "resume":
            return _cmd_resume(args)
        if args.command == "_worker":
            from trainer.distributed import worker_main

            return worker_main(args.run_dir, args.resume)
        return _cmd_list(args)
    except (ConfigError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
