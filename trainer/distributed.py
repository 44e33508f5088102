"""One rank of a distributed run, started by torchrun (``python -m trainer _worker``).

The launcher (trainer/dist_launch.py) creates the run folder and starts torchrun; each
worker reads the config from that folder's manifest, joins the process group (``gloo`` on
CPU, ``nccl`` on CUDA) and trains its shard of the data under DistributedDataParallel.

Files per rank: rank 0 keeps the single-process names (``steps.jsonl``, ``samples.jsonl``,
``log.txt``) so every reader sees a distributed run's first rank as it sees any run; rank k
> 0 writes ``steps.rank<k>.jsonl``, ``samples.rank<k>.jsonl`` and ``log.rank<k>.txt``.
Every rank writes ``status.rank<k>.json`` when it ends; the launcher aggregates those into
``status.json``. Traces are named ``<run>.rank<k>.*.pt.trace.json.gz`` and carry torch's
``distributedInfo``, so the trace loader groups them by rank.

Agreement: every step, each rank's stop wish (cancel file, SIGTERM, SIGINT, the runtime
budget) is all-reduced with MAX, so all ranks stop after the same step; only rank 0 writes
checkpoints (the model and optimiser are replicated, and every rank's RNG stream is the
same: same seed, same ops on equally sized batches), so rank 0's checkpoint resumes all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from diagnostics.runs import (
    RANK_STATUS_FILE,
    SAMPLES_LINES,
    STEPS_LINES,
    RunFolder,
    RunWriter,
    _atomic_write_json,
    _LineAppender,
    rank_file,
)
from trainer.stopping import AGREED, Stop, StopKind

log = logging.getLogger("trainer")

PROCESS_GROUP_TIMEOUT = timedelta(minutes=5)  # a peer that never arrives fails the run


@dataclass
class DistContext:
    """This process's place in the job, read from torchrun's environment."""

    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    backend: str
    stop_group: Any = None  # gloo group for the stop flag (nccl would need a device sync)
    ddp: Any = None  # not on the model: a module attribute there would make a cycle
    sync_after_backward: bool = False
    model_params: list[Any] = field(default_factory=list)

    @property
    def is_primary(self) -> bool:
        return self.rank == 0

    def attach(self, trainer: Any) -> None:
        """Gradient sync around the trainer's model, checkpoints from rank 0 only, and the
        straggler scenario's slower data path on its rank."""
        settings = trainer.config.distributed
        self.model_params = list(trainer.model.parameters())
        if settings.sync == "overlap":
            self.ddp = wrap_model(trainer.model, trainer.device, settings.bucket_cap_mb)
        else:
            # no DDP: the ranks start from rank 0's weights and after_backward averages
            for tensor in trainer.model.state_dict().values():
                dist.broadcast(tensor, src=0)
            self.sync_after_backward = True
        if not self.is_primary:
            # rank 0's checkpoint resumes every rank; the others still bring their step
            # files up to the checkpoint's step, as a checkpoint does
            trainer.save_checkpoint = trainer.pending.flush
        if settings.straggler_rank == self.rank and settings.straggler_delay_ms:
            # in __getitem__, where a slow read really is: the trace shows it as data wait
            per_sample_s = settings.straggler_delay_ms / 1e3 / trainer.config.train.batch_size
            trainer.train_set.sample_latency_s += per_sample_s
            log.info("straggler: %.0f ms more data loading a batch", settings.straggler_delay_ms)

    def after_backward(self) -> None:
        """``distributed.sync=after-backward``: one blocking all-reduce per gradient, after
        the whole backward, so none of it overlaps compute (what DDP's buckets avoid)."""
        if not self.sync_after_backward:
            return
        for param in self.model_params:
            if param.grad is not None:
                dist.all_reduce(param.grad)
                param.grad.div_(self.world_size)

    def agree_stop(self, local: Stop | None) -> Stop | None:
        """Every rank's stop wish all-reduced (MAX of the kinds' priorities): all ranks stop
        after the same step, for the most urgent reason any of them had."""
        flag = torch.tensor([int(local.kind) if local else 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.stop_group)
        agreed = int(flag.item())
        if agreed == 0:
            return None
        if local is not None and int(local.kind) == agreed:
            return local
        return AGREED[StopKind(agreed)]


_CONTEXT: DistContext | None = None


def current_context() -> DistContext | None:
    """The process's distributed context; None in a single-process run."""
    return _CONTEXT


def worker_name(run_dir: Path) -> str:
    """The profiler's file-name stem: the rank in distributed runs, else the pid."""
    if _CONTEXT is None:
        return f"{run_dir.name}.{os.getpid()}"
    return f"{run_dir.name}.rank{_CONTEXT.rank}"


class _Entry(torch.nn.Module):
    """Routes every call of the model through one forward, so DDP sees each step."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, method: str, *args: Any) -> Any:
        return getattr(type(self.model), method)(self.model, *args)


def wrap_model(
    model: torch.nn.Module, device: torch.device, bucket_cap_mb: float = 25.0
) -> torch.nn.Module:
    """Wraps ``model`` in DDP in place: its ``forward`` and ``mlm_loss`` go through DDP.

    DDP synchronises gradients only for calls made through its own forward; the loop calls
    ``model(...)`` and ``model.mlm_loss(...)``, so both are rebound on the instance to go
    through the wrapper. The model object (its state_dict, parameters, checkpoints) stays
    the plain module. Pre-training leaves the task heads unused and fine-tuning the masked-
    LM head, hence ``find_unused_parameters``.
    """
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(
        _Entry(model),
        device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=True,
        bucket_cap_mb=bucket_cap_mb,
        broadcast_buffers=False,  # no buffers are trained; evaluation then needs no peers
    )
    model.forward = lambda *args: ddp("forward", *args)  # type: ignore[method-assign]
    model.mlm_loss = lambda *args: ddp("mlm_loss", *args)  # type: ignore[method-assign]
    return ddp


class RankWriter:
    """The writer interface the loop uses (see trainer/run_io.SafeWriter), for one rank.

    Only rank 0 edits run.json (notes, manifest fields): two processes rewriting it would
    lose each other's updates. The other ranks log what they would have noted.
    """

    def __init__(self, path: Path, rank: int):
        self.path = path
        self.rank = rank
        self._manifest = RunWriter(path=path)
        self._lock = threading.Lock()  # the sampler thread notes too
        self._steps = _LineAppender(path / rank_file(STEPS_LINES, rank))
        self._samples = _LineAppender(path / rank_file(SAMPLES_LINES, rank))

    def append_step(self, record: dict[str, Any]) -> None:
        self._steps.append(record)

    def append_sample(self, record: dict[str, Any]) -> None:
        self._samples.append(record)

    def add_note(self, note: str) -> None:
        if self.rank == 0:
            with self._lock:
                self._manifest.add_note(note)
        else:
            log.info("note: %s", note)

    def add_note_if_room(self, note: str) -> None:
        """As SafeWriter's: a note a full disk refuses is dropped (the loop then fails)."""
        with contextlib.suppress(OSError):
            self.add_note(note)

    def update_manifest(self, **fields: Any) -> None:
        if self.rank == 0:
            with self._lock:
                self._manifest.update_manifest(**fields)

    def update_environment(self, **fields: Any) -> None:
        if self.rank == 0:
            environment = dict(RunFolder(self.path).manifest().environment)
            environment.update(fields)
            self.update_manifest(environment=environment)

    def heartbeat(self) -> None:  # the launcher keeps status.json's heartbeat
        return None

    def write_memory_lines(self, rows: list[dict[str, Any]]) -> None:
        if self.rank == 0:
            self._manifest.write_memory_lines(rows)

    def finalise(self, status: str, reason: str | None, step: int) -> None:
        for appender in (self._steps, self._samples):
            appender.close()
        _atomic_write_json(
            self.path / RANK_STATUS_FILE.format(rank=self.rank),
            {
                "rank": self.rank,
                "status": status,
                "reason": reason,
                "step": step,
                "ended_at": time.time(),
                "pid": os.getpid(),
                "host": socket.gethostname(),
            },
        )


def rank_threads(config: Any, device: str) -> int:
    """Torch threads per rank: runtime.threads, else one on CPU (the ranks already fill the
    cores) and two beside a GPU."""
    return config.runtime.threads or (1 if device == "cpu" else 2)


def init_rank(config: Any) -> tuple[DistContext, str]:
    global _CONTEXT
    from trainer.runtime import resolve_device

    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_rank = int(env["LOCAL_RANK"])
    device = resolve_device(config.device)
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
        backend = "nccl"
    else:
        backend = "gloo"
    torch.set_num_threads(rank_threads(config, device))
    dist.init_process_group(backend, timeout=PROCESS_GROUP_TIMEOUT)
    stop_group = dist.new_group(backend="gloo") if backend == "nccl" else None
    _CONTEXT = DistContext(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        node_rank=int(env.get("GROUP_RANK", 0)),
        backend=backend,
        stop_group=stop_group,
    )
    return _CONTEXT, device


def record_ranks(ctx: DistContext, run_dir: Path) -> None:
    """Rank 0 writes every rank's place (node, local rank, host, pid) into the manifest."""
    me = {
        "rank": ctx.rank,
        "local_rank": ctx.local_rank,
        "node_rank": ctx.node_rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, me, group=ctx.stop_group)
    if ctx.is_primary:
        manifest = RunFolder(run_dir).manifest()
        info = dict(manifest.extra.get("distributed") or {})
        info.update(world_size=ctx.world_size, backend=ctx.backend, ranks=everyone)
        RunWriter(path=run_dir).update_manifest(distributed=info)
