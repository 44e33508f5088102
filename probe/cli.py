"""``pipeline-doctor profile [options] train.py ARGS...``: any script, unmodified, measured.

This process is the launcher: it checks the command line (a usage error is one line and
exit 2, before anything is created), creates the run folder, starts the script's
process(es) -- ``python -m probe.child RUN_DIR``, or under torchrun with more than one --
and passes their output through, keeping a copy in the run's ``log.txt``. It keeps the
heartbeat, turns a ``cancel.request`` or its own SIGTERM/SIGINT into a cancel of the
script, then writes the run's status from the processes' own ends and prints the folder.
Its exit code is the script's. It imports no torch, so refusing a bad command is instant,
and no polars before the script's process has started: the parquet copies at the end need
it, so it is imported on a thread while the script runs (0.5-1 s the script's first line
no longer waits for, nor the end when the run outlasts the import).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, NoReturn

from diagnostics.runs import (
    CANCEL_FILE,
    HEARTBEAT_INTERVAL_S,
    LOG_FILE,
    RUN_ID_UNSAFE,
    RunFolder,
    RunWriter,
    default_runs_dir,
    new_run_id,
)
from probe.alert import RunAlert
from probe.overrides import as_patch, parse_override
from probe.wrapper_watch import WRAPPER_PID_ENV

PROJECT_ROOT = Path(__file__).resolve().parents[1]
STOP_GRACE_S = 20.0  # after SIGTERM, how long the script has to unwind before SIGKILL


class UsageError(Exception):
    """A bad command line: one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pipeline-doctor",
        description="Profile a PyTorch training script, serve the app over its runs, gate CI.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    # dispatched before parsing (main): listed here for --help
    sub.add_parser(
        "app",
        add_help=False,
        help="serve the app on http://127.0.0.1:8501 with this folder's ./runs "
        "(pipeline-doctor app --help)",
    )
    sub.add_parser(
        "gate", add_help=False, help="the CI regression gate (pipeline-doctor gate --help)"
    )
    profile = sub.add_parser(
        "profile",
        help="run a training script, unmodified, under the instruments",
        description="Runs SCRIPT with ARGS as `python SCRIPT ARGS` would, under the "
        "instruments, and writes one run folder (its path is printed last).",
    )
    profile.add_argument("--steps", type=int, help="stop the script after N steps")
    profile.add_argument(
        "--runs-dir", type=Path, default=None, help="default $PIPELINE_DOCTOR_RUNS_DIR or ./runs"
    )
    profile.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="dataloader.KEY=VALUE",
        help="change a DataLoader argument as the script builds it (num_workers, "
        "pin_memory, persistent_workers, prefetch_factor); repeatable",
    )
    profile.add_argument("--nproc-per-node", type=int, help="processes: torchrun when > 1")
    profile.add_argument("--nnodes", type=int, help="nodes of the job (torchrun; default 1)")
    profile.add_argument("--node-rank", type=int, default=0, help="this node's rank")
    profile.add_argument("--rdzv-endpoint", help="HOST:PORT of node 0, with --nnodes > 1")
    profile.add_argument("--run-id", help="folder name under the runs dir (default: generated)")
    profile.add_argument("--parent-run-id", help="the run this one re-runs with a fix")
    profile.add_argument(
        "--no-trace", action="store_true", help="no torch.profiler window (steps still timed)"
    )
    profile.add_argument("--sample-hz", type=float, default=10.0, help="system sampler rate")
    profile.add_argument(
        "--memory-snapshots",
        type=int,
        default=0,
        metavar="STEPS",
        help="CUDA: allocator history for STEPS steps from step 2, snapshots into memory/ "
        "(docs/MEMORY.md); an out-of-memory error is dumped either way",
    )
    profile.add_argument(
        "--memory-snapshot-stacks",
        choices=("python", "all"),
        default="python",
        help="what each allocation keeps: python frames, or all (C++ too: slow dumps)",
    )
    profile.add_argument(
        "--max-runtime-s",
        type=float,
        help="wall-time budget: past it the script is stopped as a cancel (the app sets it)",
    )
    profile.add_argument(
        "--alert-after-s",
        type=float,
        help="post once to $PIPELINE_DOCTOR_ALERT_WEBHOOK when the script has run this long "
        "(never stops it; the outcome goes to the run folder's alert.json)",
    )
    profile.add_argument("script", help="the training script")
    profile.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return parser


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _checked(args: argparse.Namespace) -> tuple[Path, dict[str, Any], int]:
    """The script, the overrides and the world size; UsageError for anything wrong."""
    script = Path(args.script)
    if not script.is_file():
        raise UsageError(f"script: {script} is not a file")
    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps: {args.steps} is not a positive number of steps")
    if args.memory_snapshots < 0:
        raise UsageError(f"--memory-snapshots: {args.memory_snapshots} is not 0 or more steps")
    overrides: dict[str, Any] = {}
    for text in args.override:
        try:
            key, value = parse_override(text)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        overrides[key] = value
    nproc = args.nproc_per_node or 1
    nnodes = args.nnodes or 1
    if nproc < 1 or nnodes < 1:
        raise UsageError("--nproc-per-node and --nnodes take 1 or more")
    if nnodes > 1 and not args.rdzv_endpoint:
        raise UsageError("--rdzv-endpoint: HOST:PORT of node 0 is needed with --nnodes > 1")
    if args.run_id is not None and (
        not args.run_id or RUN_ID_UNSAFE.search(args.run_id) or args.run_id.startswith(".")
    ):
        raise UsageError(
            f"--run-id: {args.run_id!r} is not a folder name of letters, digits, '.', '_' "
            "and '-' (not starting with '.')"
        )
    if not 0 < args.sample_hz <= 100:
        raise UsageError(f"--sample-hz: {args.sample_hz} is outside (0, 100]")
    if args.max_runtime_s is not None and not args.max_runtime_s > 0:
        raise UsageError(f"--max-runtime-s: {args.max_runtime_s} is not a positive number")
    if args.alert_after_s is not None and not args.alert_after_s > 0:
        raise UsageError(f"--alert-after-s: {args.alert_after_s} is not a positive number")
    return script, overrides, nproc * nnodes


def _environment() -> dict[str, Any]:
    import psutil

    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return {
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "host": socket.gethostname(),
        "cwd": os.getcwd(),
        "cpu_count": cpus,
        "memory_total_bytes": int(psutil.virtual_memory().total),
    }


def _child_command(args: argparse.Namespace, run_dir: Path, world: int) -> list[str]:
    child = ["-m", "probe.child", str(run_dir)]
    if world == 1:
        return [sys.executable, *child]
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    torchrun += ["--nproc-per-node", str(args.nproc_per_node or 1)]
    torchrun += ["--nnodes", str(args.nnodes or 1), "--node-rank", str(args.node_rank)]
    if args.rdzv_endpoint:
        torchrun += ["--rdzv-backend", "c10d", "--rdzv-endpoint", args.rdzv_endpoint]
    else:
        torchrun += ["--standalone"]
    return [*torchrun, *child]


# log.txt keeps the first and the last LOG_KEEP_BYTES of a script's output each: a script
# that prints gigabytes must not fill the disk or the wrapper's memory
LOG_KEEP_BYTES = 4 << 20
_PIECE = 1 << 16


class _CappedLog:
    """``log.txt``: the output's head written as it comes, its tail kept in a ring, and,
    when the middle was cut, one line that says how much (written at the end)."""

    def __init__(self, handle: IO[bytes], keep: int = LOG_KEEP_BYTES):
        self._handle, self._keep = handle, keep
        self._head_left = keep
        self._tail = bytearray()
        self._dropped = 0
        self._lock = threading.Lock()

    def write(self, piece: bytes) -> None:
        with self._lock:
            if self._head_left > 0:
                head, piece = piece[: self._head_left], piece[self._head_left :]
                self._head_left -= len(head)
                with contextlib.suppress(OSError, ValueError):
                    self._handle.write(head)
                    self._handle.flush()
            if piece:
                self._tail += piece
                excess = len(self._tail) - self._keep
                if excess > 0:
                    del self._tail[:excess]
                    self._dropped += excess

    def close(self) -> None:
        with self._lock, contextlib.suppress(OSError, ValueError):
            if self._dropped:
                self._handle.write(
                    f"\n[pipeline-doctor: {self._dropped:,} bytes of output left out here: "
                    f"the log keeps the first and the last {self._keep:,} bytes]\n".encode()
                )
            self._handle.write(bytes(self._tail))
            self._handle.flush()
            self._tail.clear()


class _Tee:
    """Copies a child's stream to ours and to the run's log, in pieces as they come (not
    lines: output without a newline must not pile up in the wrapper's memory)."""

    def __init__(self, source: IO[bytes], target: IO[bytes], log: _CappedLog):
        self._thread = threading.Thread(target=self._run, args=(source, target, log), daemon=True)
        self._thread.start()

    @staticmethod
    def _run(source: IO[bytes], target: IO[bytes], log: _CappedLog) -> None:
        read = getattr(source, "read1", source.read)
        for piece in iter(lambda: read(_PIECE), b""):
            with contextlib.suppress(OSError, ValueError):
                target.write(piece)
                target.flush()
            log.write(piece)

    def join(self) -> None:
        self._thread.join(timeout=10.0)


def _aggregate(run: RunFolder, world: int, returncode: int, signalled: str | None):
    """(status, reason, exit code) from the processes' own ends and the launcher's view."""
    statuses = run.rank_statuses()
    ends = {rank: s for rank, s in statuses.items() if s}
    for state in ("failed", "cancelled"):
        for rank, end in ends.items():
            if end.get("status") == state:
                prefix = f"rank {rank}: " if world > 1 else ""
                code = end.get("exit_code")
                return state, prefix + str(end.get("reason")), int(code) if code else 1
    # the shell's convention: a process ended by signal N exits 128 + N (the child's
    # negative return code, passed through, read as 247 for SIGKILL)
    exit_code = 128 - returncode if returncode < 0 else returncode
    if signalled is not None:
        return "cancelled", f"{signalled} received", exit_code or 1
    if len(ends) < world or returncode != 0:
        how = (
            f"killed by {signal.Signals(-returncode).name}"
            if returncode < 0
            else f"exit code {returncode}"
        )
        missing = sorted(set(range(world)) - set(ends))
        where = f" (no end recorded by rank {', '.join(map(str, missing))})" if missing else ""
        return "failed", f"the script's process ended: {how}{where}", exit_code or 1
    return "completed", None, 0


def profile(args: argparse.Namespace, argv: list[str]) -> int:
    script, overrides, world = _checked(args)
    runs_dir = args.runs_dir or default_runs_dir()
    if runs_dir.exists() and not runs_dir.is_dir():
        raise UsageError(f"--runs-dir: {runs_dir} is not a directory")
    if args.run_id is not None and (runs_dir / args.run_id).exists():
        raise UsageError(f"--run-id: {runs_dir / args.run_id} already exists")
    resolved = script.resolve()
    config = {
        "scenario": None,
        "script": str(resolved),
        "args": list(args.args),
        "steps": args.steps,
        "dataloader": overrides,
        "nproc_per_node": args.nproc_per_node or 1,
        "nnodes": args.nnodes or 1,
        "profiler": {"enabled": not args.no_trace},
        "sample_hz": args.sample_hz,
        "alert_after_s": args.alert_after_s,
        "memory_snapshots": {"steps": args.memory_snapshots, "stacks": args.memory_snapshot_stacks},
        "device": None,
    }
    # in the first manifest: the app lists a folder as soon as it exists, and one read
    # between a create and a later update showed a script run as the trainer's
    script_fields = {
        "kind": "script",
        "command": ["pipeline-doctor", *argv],
        "script": {
            "path": str(resolved),
            "sha256": _sha256(resolved),
            "args": list(args.args),
            "as_given": args.script,
        },
        **({"distributed": {"world_size": world}} if world > 1 else {}),
    }
    try:
        writer = RunWriter.create(
            runs_dir,
            config,
            _environment(),
            run_id=args.run_id or new_run_id(f"script-{resolved.stem}"[:40]),
            parent_run_id=args.parent_run_id,
            applied_patch=as_patch(overrides) or None,
            total_steps=args.steps,
            extra=script_fields,
        )
    except FileExistsError as exc:
        raise UsageError(f"--run-id: {exc.filename} already exists") from None
    except OSError as exc:
        raise UsageError(
            f"--runs-dir: cannot create a run folder in {runs_dir}: {exc.strerror}"
        ) from None
    alert = None
    if args.alert_after_s is not None:
        run = RunFolder(writer.path)
        alert = RunAlert(
            writer.path,
            args.alert_after_s,
            step=run.last_step,
            total_steps=lambda: args.steps,
            environ=os.environ,
        )
        alert.start()
    try:
        command = _child_command(args, writer.path, world)
        return _supervise(writer, command, world, args.max_runtime_s)
    finally:
        if alert is not None:
            alert.close()


BUDGET_REASON = "wall-time budget"


def _import_for_the_end() -> None:
    with contextlib.suppress(Exception):  # the end imports it again, and says what fails
        import polars  # noqa: F401


def _supervise(
    writer: RunWriter, command: list[str], world: int, max_runtime_s: float | None = None
) -> int:
    run = RunFolder(writer.path)
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"  # the script's prints reach the log as they happen
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    env[WRAPPER_PID_ENV] = str(os.getpid())  # the script stops if this process dies
    signalled: list[str] = []
    with (writer.path / LOG_FILE).open("ab") as log:
        log.write(f"$ {shlex.join(command)}\n".encode())
        capped = _CappedLog(log)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        threading.Thread(target=_import_for_the_end, daemon=True).start()

        def forward(signum: int, frame: Any) -> None:
            if not signalled:
                signalled.append(signal.Signals(signum).name)
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)  # SIGINT stays SIGINT: KeyboardInterrupt there

        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        tees = [
            _Tee(process.stdout, sys.stdout.buffer, capped),  # type: ignore[arg-type]
            _Tee(process.stderr, sys.stderr.buffer, capped),  # type: ignore[arg-type]
        ]
        deadline = None
        budget_ends = None if max_runtime_s is None else time.monotonic() + max_runtime_s
        while True:
            try:
                returncode = process.wait(timeout=HEARTBEAT_INTERVAL_S / 2)
                break
            except subprocess.TimeoutExpired:
                pass
            if (writer.path / CANCEL_FILE).exists() and not signalled:
                signalled.append("cancel request")
                process.send_signal(signal.SIGTERM)
            if budget_ends is not None and time.monotonic() > budget_ends and not signalled:
                signalled.append(BUDGET_REASON)
                process.send_signal(signal.SIGTERM)
            if signalled and deadline is None:
                deadline = time.monotonic() + STOP_GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                process.kill()
            step = run.last_step()
            if step is not None:
                writer.set_step(step)
            with contextlib.suppress(OSError):
                writer.heartbeat()
        for tee in tees:
            tee.join()
        capped.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    reason_signal = signalled[0] if signalled else None
    status, reason, code = _aggregate(run, world, returncode, reason_signal)
    if reason_signal is not None and status == "cancelled":
        # the launcher's own reason: the script only saw the signal it was passed
        if reason_signal == "cancel request":
            reason, code = "cancel requested", 128 + signal.SIGTERM
        elif reason_signal == BUDGET_REASON:
            reason = f"{BUDGET_REASON} of {max_runtime_s:g} s reached"
            code = 128 + signal.SIGTERM
        else:
            reason, code = f"{reason_signal} received", 128 + signal.Signals[reason_signal]
    step = run.last_step()
    if step is not None:
        writer.set_step(step)
    writer.finalise(status, reason)  # type: ignore[arg-type]
    if reason_signal is not None:
        # a stopped script can be cut off mid-line (a print the signal interrupted): the
        # folder, the wrapper's last line of stdout, still gets a line of its own
        print()
    print(writer.path)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["gate"]:  # the CI gate is the analyser's (docs/GATE.md)
        from diagnostics.gate.cli import main as gate_main

        return gate_main(argv[1:])
    if argv[:1] == ["app"]:  # the app, serving this folder's runs (scripts/serve.py decides)
        serve = str(PROJECT_ROOT / "scripts" / "serve.py")
        os.execv(sys.executable, [sys.executable, serve, "--from-folder", os.getcwd(), *argv[1:]])
    try:
        args = _parser().parse_args(argv)
        return profile(args, argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
