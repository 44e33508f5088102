"""Per-step timing and memory for the step records.

On CUDA the copy, compute and optimiser phases are timed with CUDA events: host clocks
only measure how long it took to *queue* the kernels. On CPU every op runs synchronously,
so host clocks are the truth. The data wait is always a host clock: it is the time the
training process sat blocked in ``next()`` on the DataLoader.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psutil
import torch

PHASES = ("start", "copied", "computed", "optimised")


def rss_bytes(process: psutil.Process | None = None) -> int:
    return (process or psutil.Process(os.getpid())).memory_info().rss


class HostStepClock:
    """Host-clock marks; the variant used on CPU and whenever instruments are off."""

    def __init__(self) -> None:
        self._marks: dict[str, float] = {}

    def begin(self) -> None:
        self._marks = {"begin": time.perf_counter()}

    def mark(self, name: str) -> None:
        self._marks[name] = time.perf_counter()

    def finish(self) -> dict[str, float]:
        """Milliseconds per phase. Call after the step's results are on the host."""
        self._marks["end"] = time.perf_counter()
        m = self._marks
        # between "fetched" and "start" the loop may evaluate at an epoch boundary: that
        # time belongs to neither the data wait nor the step
        fetched = m.get("fetched", m["start"])
        return {
            "data_wait_ms": (fetched - m["begin"]) * 1e3,
            "h2d_ms": (m["copied"] - m["start"]) * 1e3,
            "compute_ms": (m["computed"] - m["copied"]) * 1e3,
            "optimizer_ms": (m["end"] - m["computed"]) * 1e3,
            "step_time_ms": (m["end"] - m["begin"] - (m["start"] - fetched)) * 1e3,
        }


class CudaStepClock(HostStepClock):
    """CUDA events at each phase boundary; waits for the last one when the step ends."""

    def __init__(self) -> None:
        super().__init__()
        self._events = {name: torch.cuda.Event(enable_timing=True) for name in PHASES}

    def mark(self, name: str) -> None:
        super().mark(name)
        if name in self._events:
            self._events[name].record()

    def finish(self) -> dict[str, float]:
        self._events["optimised"].record()
        # one sync per step: the price of true GPU times (the host ones would be queue times)
        self._events["optimised"].synchronize()
        host = super().finish()
        ev = self._events
        return {
            **host,
            "h2d_ms": ev["start"].elapsed_time(ev["copied"]),
            "compute_ms": ev["copied"].elapsed_time(ev["computed"]),
            "optimizer_ms": ev["computed"].elapsed_time(ev["optimised"]),
        }


def cuda_memory(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {}
    return {
        "cuda_allocated_bytes": torch.cuda.memory_allocated(device),
        "cuda_reserved_bytes": torch.cuda.memory_reserved(device),
        "cuda_peak_bytes": torch.cuda.max_memory_allocated(device),
    }


def make_step_clock(device: torch.device, *, instruments: bool) -> HostStepClock:
    if instruments and device.type == "cuda":
        return CudaStepClock()
    return HostStepClock()
