"""Process-level choices for a run: device, threads, signals, notes."""

from __future__ import annotations

import random
import signal
from typing import Any

import numpy as np
import torch

from trainer.config import ConfigError, TrainerConfig


class StopRequests:
    """SIGTERM/SIGINT handlers that only set flags: the loop stops between steps."""

    def __init__(self) -> None:
        self.sigterm = False
        self.sigint = False
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, _frame: Any) -> None:
        if signum == signal.SIGTERM:
            self.sigterm = True
        else:
            self.sigint = True


def choose_threads(config: TrainerConfig, cores: int, device: str) -> int:
    """torch intra-op threads: the cores DataLoader workers leave free (at least one).

    torch's default (one thread per core) plus busy workers oversubscribes the CPU; the
    threads then preempt each other in the middle of every matmul. On CUDA the host does
    little math, so a couple of threads suffice.
    """
    if config.runtime.threads is not None:
        return config.runtime.threads
    if device == "cuda":
        return max(1, min(4, cores - config.data.num_workers))
    return max(1, cores - config.data.num_workers)


def resolve_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def checked_device(requested: str) -> str:
    """The device a run gets ("cpu"/"cuda"); ConfigError when cuda is asked for and absent."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "cuda requested but no CUDA device is available", "auto, cpu")
    return resolve_device(requested)


def run_notes(config: TrainerConfig, device: str) -> list[str]:
    """What the config means on this device, said up front in the manifest."""
    notes = []
    if device == "cpu" and not config.data.pin_memory:
        notes.append(
            "data.pin_memory=false has no effect on CPU: there is no host-to-device copy "
            "for pinned memory to speed up"
        )
    if device == "cpu" and config.train.amp != "off":
        notes.append(f"train.amp={config.train.amp} applies on CUDA only: this CPU run is fp32")
    if config.data.dataset == "sharded" and config.data.persistent_workers:
        notes.append(
            "data.persistent_workers is ignored for the sharded dataset: its shard order "
            "changes each epoch, so each epoch gets fresh workers"
        )
    if config.train.amp == "fp16" and device == "cuda" and not config.train.grad_scaler:
        notes.append("fp16 without GradScaler: small gradients underflow to zero")
    return notes


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_tf32(enabled: bool) -> str:
    """TF32 for fp32 matmuls and cuDNN convolutions on or off; returns the matmul setting.

    The ``fp32_precision`` attributes are PyTorch 2.9+'s API; older releases have only the
    ``allow_tf32`` flags. Mixing the two in one process is an error in current releases
    (get_float32_matmul_precision refuses to answer), so only one of them is ever set.
    """
    mode = "tf32" if enabled else "ieee"
    matmul = torch.backends.cuda.matmul
    try:
        matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode  # type: ignore[attr-defined]
        torch.backends.cudnn.rnn.fp32_precision = mode  # type: ignore[attr-defined]
        return str(matmul.fp32_precision)
    except AttributeError:  # PyTorch before 2.9
        matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled
        return mode
