"""Thread-safe access to the run folder writer, the heartbeat thread and the environment."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import threading
from importlib import metadata
from pathlib import Path
from typing import Any

from diagnostics.runs import HEARTBEAT_INTERVAL_S, RunFolder, RunState, RunWriter
from trainer.reproducibility import REPRODUCIBLE_MATH

CACHE_DIR_NAME = ".cache"  # under the runs directory: the tokenizer cache


def os_error_behind(exc: BaseException) -> OSError | None:
    """The OSError an exception was raised while handling or from, if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class SafeWriter:
    """Serialises RunWriter calls from the training loop, the sampler and the heartbeat.

    status.json and run.json are rewritten through one temporary file name per process,
    so two threads rewriting at once could replace each other's file mid-write.
    """

    def __init__(self, writer: RunWriter):
        self.writer = writer
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self.writer.path

    def append_step(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.writer.append_step(record)

    def append_sample(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.writer.append_sample(record)

    def add_note(self, note: str) -> None:
        with self._lock:
            self.writer.add_note(note)

    def add_note_if_room(self, note: str) -> None:
        """For background threads: a note a full disk refuses is dropped, not raised.

        The training thread meets the same full disk at its next write and ends the run
        with "disk full at step N"; a thread's own traceback would only add noise.
        """
        with contextlib.suppress(OSError):
            self.add_note(note)

    def update_manifest(self, **fields: Any) -> None:
        with self._lock:
            self.writer.update_manifest(**fields)

    def heartbeat(self) -> None:
        with self._lock:
            self.writer.heartbeat()

    def update_environment(self, **fields: Any) -> None:
        """Adds keys to the manifest's ``environment``, keeping the ones already there."""
        with self._lock:
            environment = dict(RunFolder(self.writer.path).manifest().environment)
            environment.update(fields)
            self.writer.update_manifest(environment=environment)

    def write_memory_lines(self, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            self.writer.write_memory_lines(rows)

    def finalise(self, status: RunState, reason: str | None = None) -> None:
        with self._lock:
            self.writer.finalise(status, reason)


class Heartbeat:
    """Refreshes status.json's heartbeat well inside HEARTBEAT_INTERVAL_S, always on.

    Separate from the (optional) system sampler: a run with ``--instruments off`` or one
    busy building its corpus must not read as dead.
    """

    def __init__(self, writer: SafeWriter, interval_s: float = HEARTBEAT_INTERVAL_S / 2):
        self._writer = writer
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._writer.heartbeat()
            except Exception:  # a full disk must not kill the training thread's run
                continue


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask, not the host's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def environment(device: str, threads: int) -> dict[str, Any]:
    """Versions, device and the memory totals that the memory rules project against.

    ``memory_total_bytes`` is the host's RAM (psutil), not a container's cgroup limit;
    ``gpu_memory_bytes`` is the total of the GPU the run trains on (device 0).
    """
    import psutil
    import torch

    env: dict[str, Any] = {
        "python_version": platform.python_version(),
        "pytorch_version": torch.__version__,
        "transformers_version": _version("transformers"),
        "tokenizers_version": _version("tokenizers"),
        "polars_version": _version("polars"),
        "platform": platform.platform(),
        "executable": sys.executable,
        "device": device,
        "cpu_count": cpu_count(),
        "torch_threads": threads,
        "cuda_available": torch.cuda.is_available(),
        "gpu_name": None,
        "gpu_count": 0,
        "cuda_version": torch.version.cuda,
        "memory_total_bytes": int(psutil.virtual_memory().total),
        # what bitwise resume rests on (trainer/reproducibility.py): in the folder, so a
        # run that does not repeat itself shows whether the user overrode them
        "math_library_env": {name: os.environ.get(name) for name in REPRODUCIBLE_MATH},
    }
    if device == "cuda":
        env["gpu_memory_bytes"] = int(torch.cuda.get_device_properties(0).total_memory)
        env["gpu_name"] = torch.cuda.get_device_name(0)
        env["gpu_count"] = torch.cuda.device_count()
        major, minor = torch.cuda.get_device_capability(0)
        env["gpu_compute_capability"] = f"{major}.{minor}"
    return env
