"""Per-step timing and memory for the step records.

On CUDA the copy, compute and optimiser phases and the step itself are timed with CUDA
events, read back on later steps without blocking: host clocks only measure how long it
took to *queue* the kernels. On CPU every op runs synchronously, so host clocks are the
truth. The data wait is always a host clock: it is the time the training process sat
blocked in ``next()`` on the DataLoader.

Each step also records how long the training thread was ready to run but had no CPU
(``cpu_wait_ms``: its run-queue wait, from Linux's ``/proc/thread-self/schedstat``). On a
shared host that is the one part of a slow step that comes from outside the job; the
step-time-outliers rule leaves such steps out instead of blaming the pipeline.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import psutil
import torch

PHASES = ("start", "copied", "computed", "optimised")
SCHEDSTAT = "/proc/thread-self/schedstat"


def _waited_ns(raw: bytes) -> int:
    # "<ns on a CPU> <ns waiting on a run queue> <time slices>"
    return int(raw.split()[1])


def run_queue_wait_ns() -> int | None:
    """Nanoseconds the calling thread has spent runnable but waiting for a CPU, since it
    started; None where the kernel does not say (not Linux, or no schedstats)."""
    try:
        with open(SCHEDSTAT, "rb") as stats:
            return _waited_ns(stats.read())
    except (OSError, ValueError, IndexError):
        return None


class RunQueueWait:
    """``run_queue_wait_ns`` for the step clock's thread, twice a step: the file is opened
    once, by that thread on its first read (/proc/thread-self is whoever opens it), and
    re-read in place, which costs a microsecond where an open and close costs about 18."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._unavailable = False

    def read(self) -> int | None:
        if self._unavailable:
            return None
        try:
            if self._fd is None:
                self._fd = os.open(SCHEDSTAT, os.O_RDONLY)
            return _waited_ns(os.pread(self._fd, 128, 0))
        except (OSError, ValueError, IndexError):
            self._unavailable = True
            return None

    def __del__(self) -> None:
        if self._fd is not None:
            os.close(self._fd)


def rss_bytes(process: psutil.Process | None = None) -> int:
    return (process or psutil.Process(os.getpid())).memory_info().rss


class RssReader:
    """This process's resident set size, every step: ``/proc/self/statm`` opened once and
    re-read in place (about 2 us, where psutil opens and parses the file each call);
    psutil where /proc is not there."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._process = psutil.Process(os.getpid())

    def read(self) -> int:
        try:
            if self._fd is None:
                self._fd = os.open("/proc/self/statm", os.O_RDONLY)
            return int(os.pread(self._fd, 128, 0).split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            return self._process.memory_info().rss

    def __del__(self) -> None:
        if self._fd is not None:
            os.close(self._fd)


class HostStepClock:
    """Host-clock marks: the CPU's clock, where every op runs synchronously."""

    deferred = False

    def __init__(self) -> None:
        self._marks: dict[str, float] = {}
        self._waited_ns: int | None = None
        self._aside_ns = 0
        self._run_queue = RunQueueWait()

    def begin(self) -> None:
        # the wait is read inside the clock's marks (after "begin", before "end"), so a
        # preemption between a mark and a read can only shorten the wait, never make it
        # longer than the step
        self._marks = {"begin": time.perf_counter()}
        self._aside_ns = 0
        self._waited_ns = self._run_queue.read()

    @contextlib.contextmanager
    def set_aside(self) -> Iterator[None]:
        """Work inside a step's span that is not the step (an evaluation at an epoch
        boundary, between "fetched" and "start"): its run-queue wait is left out of the
        step's, as its time is left out of the step time. Two reads, only when it runs."""
        before = self._run_queue.read()
        try:
            yield
        finally:
            after = self._run_queue.read()
            if before is not None and after is not None:
                self._aside_ns += after - before

    def mark(self, name: str) -> None:
        self._marks[name] = time.perf_counter()

    def finish(self) -> dict[str, float]:
        """Milliseconds per phase. Call after the step's results are on the host."""
        waited_ns = self._run_queue.read()
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
            # over the step time's own span: an evaluation's wait set aside (set_aside),
            # or a step could wait longer than it lasted
            "cpu_wait_ms": (
                (waited_ns - self._waited_ns - self._aside_ns) / 1e6
                if waited_ns is not None and self._waited_ns is not None
                else None
            ),
        }


class Resolved:
    """A value already on the host: the CPU's step times and step scalars."""

    def __init__(self, value: Any):
        self._value = value

    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        pass

    def get(self) -> Any:
        return self._value


# the marks a CUDA step records as events: "begin" and "fetched" bound the data wait on the
# device's own timeline, so the step time needs no host clock (which only sees queueing)
CUDA_MARKS = ("begin", "fetched", *PHASES)


class PendingCudaTimes:
    """One step's CUDA events; resolved when its last event has run on the device."""

    def __init__(
        self, host: dict[str, float], events: dict[str, Any], pool: list[Any], fetched: bool
    ):
        self._host = host
        self._events = events
        self._pool = pool
        self._fetched = fetched

    def ready(self) -> bool:
        # cudaEventQuery: never blocks, and elapsed_time is only valid once this is true
        return bool(self._events["optimised"].query())

    def wait(self) -> None:
        self._events["optimised"].synchronize()

    def get(self) -> dict[str, float]:
        ev = self._events
        # begin -> fetched and start -> end on the device: an evaluation between fetched
        # and start (epoch boundary) belongs to neither the data wait nor the step
        times = {
            **self._host,
            "h2d_ms": ev["start"].elapsed_time(ev["copied"]),
            "compute_ms": ev["copied"].elapsed_time(ev["computed"]),
            "optimizer_ms": ev["computed"].elapsed_time(ev["optimised"]),
            "step_time_ms": (ev["begin"].elapsed_time(ev["fetched"]) if self._fetched else 0.0)
            + ev["start"].elapsed_time(ev["optimised"]),
        }
        self._pool.append(ev)  # every event of the set has run: safe to record again
        return times


class CudaStepClock(HostStepClock):
    """CUDA events at each phase boundary, never waited on during the step.

    ``finish`` returns a ``PendingCudaTimes``; the loop asks it ``ready()`` on later steps
    (``Event.query()``, which does not block) and writes the record once it is. A step
    ending in a device synchronisation would cost every step the launch latency of the
    next one: 5 % at the default size on an H200 (issue 9). The step time is device time
    from the step's first event to its last: when the device is behind, "begin" runs as
    the previous step's work ends; when it waits for data, as the host gets there; either
    way it is the step's real period, which host clocks cannot see without a sync.
    """

    deferred = True

    def __init__(self) -> None:
        super().__init__()
        self._pool: list[dict[str, Any]] = []
        self._events: dict[str, Any] = {}

    def _event_set(self) -> dict[str, Any]:
        if self._pool:
            return self._pool.pop()
        return {name: torch.cuda.Event(enable_timing=True) for name in CUDA_MARKS}

    def begin(self) -> None:
        super().begin()
        self._events = self._event_set()
        self._events["begin"].record()

    def mark(self, name: str) -> None:
        super().mark(name)
        if name in self._events:
            self._events[name].record()

    def finish(self) -> PendingCudaTimes:  # type: ignore[override]
        self._events["optimised"].record()
        fetched = "fetched" in self._marks
        host = super().finish()
        return PendingCudaTimes(host, self._events, self._pool, fetched)


def cuda_memory(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {}
    return {
        "cuda_allocated_bytes": torch.cuda.memory_allocated(device),
        "cuda_reserved_bytes": torch.cuda.memory_reserved(device),
        "cuda_peak_bytes": torch.cuda.max_memory_allocated(device),
    }


def make_step_clock(device: torch.device) -> HostStepClock:
    """CUDA events on CUDA, instruments on or off: with no sync in the step, a host clock
    there would time the queueing of kernels, not the step."""
    if device.type == "cuda":
        return CudaStepClock()
    return HostStepClock()
