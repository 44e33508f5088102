"""``python -m trainer run --nproc-per-node N [--nnodes M ...]``: a job under torchrun.

The launcher is torchrun itself (``torch.distributed.run.main``, called in this process):
it starts the ranks (``python -m trainer _worker``), restarts none, and on SIGTERM passes
the signal to every rank and waits for them. Around it, node 0's launcher creates the run
folder (so it exists before any rank joins the rendezvous), keeps status.json's
heartbeat, and when torchrun returns aggregates the ranks' own statuses: ``completed``
only when every rank completed; a rank that failed or vanished makes the run ``failed``
with that rank's reason.

Several nodes share one run folder: it must be on a file system every node sees (as
Slurm clusters' home or scratch are), and every node is given the same ``--run-id``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagnostics.runs import CANCEL_FILE, LOG_FILE, RANK_STATUS_FILE, TOKENIZER_FILE, RunFolder
from trainer.config import DISTRIBUTED_SCENARIOS, ConfigError, TrainerConfig

log = logging.getLogger("trainer")


@dataclass(frozen=True)
class LaunchSpec:
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def validate(self, config: TrainerConfig, run_id: str | None) -> None:
        if self.nproc_per_node < 1:
            raise ConfigError("--nproc-per-node", f"{self.nproc_per_node}", "1 or more")
        if self.nnodes < 1:
            raise ConfigError("--nnodes", f"{self.nnodes}", "1 or more")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError("--node-rank", f"{self.node_rank}", f"0..{self.nnodes - 1}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ConfigError("--rdzv-endpoint", "missing with --nnodes > 1", "HOST:PORT")
        if self.rdzv_endpoint is not None:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError("--rdzv-endpoint", f"{self.rdzv_endpoint!r}", "HOST:PORT")
        if self.nnodes > 1 and run_id is None:
            raise ConfigError("--run-id", "missing with --nnodes > 1", "the same id on every node")
        if config.scenario in DISTRIBUTED_SCENARIOS and self.world_size < 2:
            raise ConfigError(
                "--scenario", f"{config.scenario} needs two or more ranks", "--nproc-per-node 2"
            )
        straggler = config.distributed.straggler_rank
        if straggler is not None and straggler >= self.world_size:
            raise ConfigError(
                "distributed.straggler_rank",
                f"{straggler} is not a rank of a job of {self.world_size}",
                f"0..{self.world_size - 1}",
            )
        if config.data.dataset == "sharded" and self.world_size > 1:
            raise ConfigError(
                "data.dataset",
                "sharded cannot be split across ranks (an iterable dataset)",
                "map",
            )

    def torchrun_args(self, run_dir: Path, resume: bool) -> list[str]:
        if self.nnodes == 1 and self.rdzv_endpoint is None:
            where = ["--standalone"]
        else:
            # static: node ranks are the given ones, so node 0 is the one with the folder
            where = ["--rdzv-backend", "static", "--rdzv-endpoint", str(self.rdzv_endpoint)]
            where += ["--node-rank", str(self.node_rank)]
        return [
            *where,
            "--nnodes",
            str(self.nnodes),
            "--nproc-per-node",
            str(self.nproc_per_node),
            "--max-restarts",
            "0",
            "--module",
            "trainer",
            "_worker",
            "--run-dir",
            str(run_dir),
            *(["--resume"] if resume else []),
        ]


def _failure_text(failure: Any) -> str:
    if failure.exitcode is not None and failure.exitcode < 0:
        return f"killed by signal {failure.signal_name()}"
    return f"exit code {failure.exitcode}"


# what torchrun's own teardown of the surviving ranks looks like in its failures
LAUNCHER_STOP = "killed by signal SIGTERM"


def aggregate(
    statuses: dict[int, dict[str, Any] | None], failures: dict[int, str]
) -> tuple[str, str | None]:
    """The job's (status, reason) from each rank's own status and torchrun's failures.

    A rank with no status file died without a word (SIGKILL, the OOM killer): it is the
    likeliest cause, since the others fail only after it, on a broken connection (or die of
    torchrun's SIGTERM to the survivors, which makes them silent too). Else
    the earliest failure is the cause; the others' errors are its echo.
    """
    silent = [rank for rank, status in statuses.items() if status is None]
    if silent:
        # torchrun stops the survivors with SIGTERM once a rank dies, and under load one may
        # die of it before writing a status: that death is the echo, not the cause
        order = [r for r in failures if r in silent] + [r for r in silent if r not in failures]
        rank = next((r for r in order if failures.get(r) != LAUNCHER_STOP), order[0])
        how = failures.get(rank, "no status written (the process was killed?)")
        return "failed", f"rank {rank} died: {how}"
    failed = [(s["ended_at"], r, s) for r, s in statuses.items() if s and s["status"] == "failed"]
    if failed:
        _, rank, status = min(failed)
        return "failed", f"rank {rank}: {status['reason']}"
    ends = {s["status"] for s in statuses.values() if s}
    for state in ("preempted", "cancelled"):
        if state in ends:
            first = next(s for s in statuses.values() if s and s["status"] == state)
            return state, first["reason"]
    if failures:
        rank, how = next(iter(failures.items()))
        return "failed", f"rank {rank}: {how}"
    return "completed", None


def _run_torchrun(argv: list[str]) -> dict[int, str]:
    """torchrun in this process; the failed ranks, first failure first."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(argv)
    except ChildFailedError as exc:
        ordered = sorted(exc.failures.items(), key=lambda item: item[1].timestamp)
        return {rank: _failure_text(failure) for rank, failure in ordered}
    except SignalException as exc:
        # torchrun already passed the signal to the ranks and waited for them
        log.warning("launcher got %s: the ranks were told to stop", exc.sigval)
    return {}


def supervise(
    run_dir: Path, spec: LaunchSpec, writer: Any | None, *, resume: bool
) -> tuple[str, str | None]:
    """Runs the job; node 0 (``writer`` given) keeps the heartbeat and writes the status."""
    from trainer.run_io import Heartbeat

    heartbeat = None
    if writer is not None:
        for stale in run_dir.glob(RANK_STATUS_FILE.format(rank="*")):
            stale.unlink()  # a resumed job's ranks write theirs anew
        heartbeat = Heartbeat(_ProgressWriter(writer))
        heartbeat.start()
    started = time.monotonic()
    try:
        failures = _run_torchrun(spec.torchrun_args(run_dir, resume))
    finally:
        if heartbeat is not None:
            heartbeat.stop()
    if writer is None:  # another node: node 0 writes the job's status
        return ("failed", next(iter(failures.values()))) if failures else ("completed", None)
    status, reason = aggregate(RunFolder(run_dir).rank_statuses(), failures)
    writer.finalise(status, reason)
    log.info(
        "%s after %.1f s%s", status, time.monotonic() - started, f": {reason}" if reason else ""
    )
    return status, reason


class _ProgressWriter:
    """The heartbeat, carrying rank 0's latest step into status.json."""

    def __init__(self, writer: Any):
        self._writer = writer

    def heartbeat(self) -> None:
        step = RunFolder(self._writer.path).last_step()
        if step is not None:
            self._writer.set_step(step)
        self._writer.heartbeat()


def _environment_and_tokenizer(config: TrainerConfig, run_dir: Path, runs_dir: Path) -> None:
    """The tokenizer, trained once here: the ranks then all load the run's own file."""
    from trainer.data import load_corpus
    from trainer.run_io import CACHE_DIR_NAME

    load_corpus(config.data, config.seed, runs_dir / CACHE_DIR_NAME, run_dir / TOKENIZER_FILE)


def launch_run(
    spec: LaunchSpec,
    config: TrainerConfig,
    runs_dir: Path,
    *,
    run_id: str | None,
    parent_run_id: str | None,
    patch: dict[str, Any] | None,
) -> tuple[Path, str, str | None]:
    """A new distributed run: node 0 creates the folder, every node runs its ranks."""
    spec.validate(config, run_id)  # before torch: a refused shape answers at once
    import torch

    from diagnostics.runs import RunWriter, new_run_id
    from trainer.distributed import rank_threads
    from trainer.run_io import environment
    from trainer.runtime import checked_device, run_notes

    device = checked_device(config.device)
    if device == "cuda" and torch.cuda.device_count() < spec.nproc_per_node:
        raise ConfigError(
            "--nproc-per-node",
            f"{spec.nproc_per_node} but this node has {torch.cuda.device_count()} GPUs",
            "one process per GPU",
        )
    run_id = run_id or new_run_id(config.scenario)
    run_dir = runs_dir / run_id
    if spec.node_rank != 0:
        return run_dir, *supervise(run_dir, spec, None, resume=False)
    env = environment(device, rank_threads(config, device))
    writer = RunWriter.create(
        runs_dir,
        config.to_dict(),
        env,
        run_id=run_id,
        parent_run_id=parent_run_id,
        applied_patch=patch,
        notes=run_notes(config, device),
        total_steps=config.train.pretrain_steps + config.train.steps,
    )
    writer.update_manifest(
        distributed={
            "world_size": spec.world_size,
            "nnodes": spec.nnodes,
            "nproc_per_node": spec.nproc_per_node,
            "backend": "nccl" if device == "cuda" else "gloo",
            "rdzv_endpoint": spec.rdzv_endpoint,
            "launcher": "torch.distributed.run",
        }
    )
    from trainer.run_lock import RunLock

    lock = RunLock.acquire(writer.path)  # the launcher is the folder's one writer
    try:
        _setup_launcher_logging(writer.path)
        try:
            _environment_and_tokenizer(config, writer.path, runs_dir)
        except Exception as exc:
            writer.finalise("failed", f"{type(exc).__name__}: {exc}")
            return writer.path, "failed", f"{type(exc).__name__}: {exc}"
        log.info("run %s: %d ranks on %d node(s)", run_id, spec.world_size, spec.nnodes)
        return writer.path, *supervise(writer.path, spec, writer, resume=False)
    finally:
        lock.release()


def launch_resume(run_dir: Path, spec: LaunchSpec) -> tuple[str, str | None]:
    """Resumes every rank of a distributed run from rank 0's last checkpoint."""
    from diagnostics.runs import RunWriter

    if spec.node_rank != 0:
        return supervise(run_dir, spec, None, resume=True)
    writer = RunWriter.reopen(run_dir)
    (run_dir / CANCEL_FILE).unlink(missing_ok=True)
    _setup_launcher_logging(run_dir)
    return supervise(run_dir, spec, writer, resume=True)


def spec_for_resume(info: dict[str, Any], node_rank: int, rdzv_endpoint: str | None) -> LaunchSpec:
    """The recorded job shape: a resumed job keeps its world size (its data shards)."""
    nnodes = int(info.get("nnodes") or 1)
    return LaunchSpec(
        nproc_per_node=int(info.get("nproc_per_node") or info.get("world_size") or 1),
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint or (info.get("rdzv_endpoint") if nnodes > 1 else None),
    )


def _setup_launcher_logging(run_dir: Path) -> None:
    from trainer.logs import setup_logging

    setup_logging(run_dir / LOG_FILE, role="launcher")
