"""The system sampler: a daemon thread that records host and GPU state at ``sample_hz``.

Each tick appends one sample per visible GPU (one with ``gpu_index`` null when NVML is
unavailable), stamped with ``time.time()`` like the step records so the two join.

How DataLoader worker memory is counted: the workers are the trainer's child processes
(read from ``/proc/<pid>/task/*/children``, psutil as the fallback); each worker's RSS is
read separately and the sum is recorded as ``workers_rss_bytes``, next to, never added to,
the trainer's own RSS. Forked workers share copy-on-write pages with the trainer, so a
single "trainer + children" figure (memory_profiler's ``include_children``) counts those
pages twice, and under ``mprof run`` also counts the sampler's own process; a growing
worker figure is also a different diagnosis (per-worker copies, e.g. Python lists touched
by refcounts) from a growing trainer figure. Proportional or unique set sizes would avoid
the shared-page question entirely but cost a full ``smaps`` walk per worker per tick.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

Sink = Callable[[dict[str, Any]], None]
NoteSink = Callable[[str], None]


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid``: cheap per-task /proc files, else psutil's full scan."""
    pids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                pids.extend(int(p) for p in handle.read().split())
        return pids
    except OSError:
        with contextlib.suppress(psutil.Error):
            return [child.pid for child in psutil.Process(pid).children()]
        return []


class Nvml:
    """pynvml (from nvidia-ml-py) per visible GPU; ``available`` false with ``reason``."""

    def __init__(self) -> None:
        self.available = False
        self.reason = ""
        self._handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [
                pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
            ]
            self.available = bool(self._handles)
            self.reason = "" if self._handles else "NVML reports no GPU"
        except Exception as exc:  # no driver, no library, no GPU: all the same to us
            self.reason = f"{type(exc).__name__}: {exc}"

    def read(self) -> list[dict[str, Any]]:
        nv = self._nvml
        rows = []
        for index, handle in enumerate(self._handles):
            row: dict[str, Any] = {"gpu_index": index}
            # each query on its own: a GPU may not support one (power on some boards)
            with contextlib.suppress(Exception):
                row["gpu_util_pct"] = float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
            with contextlib.suppress(Exception):
                memory = nv.nvmlDeviceGetMemoryInfo(handle)
                row["gpu_mem_used_bytes"] = int(memory.used)
                row["gpu_mem_total_bytes"] = int(memory.total)
            with contextlib.suppress(Exception):
                row["gpu_power_w"] = nv.nvmlDeviceGetPowerUsage(handle) / 1000.0
            with contextlib.suppress(Exception):
                row["gpu_sm_clock_mhz"] = float(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM))
            with contextlib.suppress(Exception):
                row["gpu_temp_c"] = float(
                    nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)
                )
            rows.append(row)
        return rows

    def close(self) -> None:
        if self.available:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()


class NullSampler:
    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class SystemSampler(NullSampler):
    def __init__(self, sink: Sink, note: NoteSink, *, sample_hz: float, pid: int | None = None):
        self._sink = sink
        self._note = note
        self._interval_s = 1.0 / sample_hz
        self._pid = pid or os.getpid()
        self._process = psutil.Process(self._pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="system-sampler", daemon=True)
        self._workers: dict[int, psutil.Process] = {}
        # CPU seconds each process had used at the previous tick, and when that was
        self._cpu_seconds_then: dict[int, float] = {}
        self._tick_then: float | None = None
        self.samples_taken = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def _workers_usage(self) -> tuple[int, int, dict[int, float]]:
        """The workers' summed RSS, their count, and each one's CPU seconds so far."""
        live = set(child_pids(self._pid))
        for gone in set(self._workers) - live:
            del self._workers[gone]
        total = 0
        cpu_seconds: dict[int, float] = {}
        for pid in live:
            process = self._workers.get(pid)
            try:
                if process is None:
                    process = self._workers[pid] = psutil.Process(pid)
                rss = process.memory_info().rss
                cpu_seconds[pid] = _cpu_seconds(process)
            except psutil.Error:  # exited between the listing and the read
                rss = 0
            if rss == 0:  # gone, or a zombie not yet reaped: no memory, not a worker any more
                self._workers.pop(pid, None)
                cpu_seconds.pop(pid, None)
            total += rss
        return total, len(self._workers), cpu_seconds

    def _cpu_percents(self, workers_cpu: dict[int, float]) -> tuple[float | None, float | None]:
        """The training process's and its workers' CPU since the previous tick (100 = one
        core busy), so that the host's figure minus these is what other processes used.
        A worker first seen now was forked since the previous tick: all its CPU is new."""
        now = time.monotonic()
        try:
            trainer_cpu = _cpu_seconds(self._process)
        except psutil.Error:
            return None, None
        then, elapsed = self._cpu_seconds_then, None
        if self._tick_then is not None:
            elapsed = now - self._tick_then
        self._cpu_seconds_then = {self._pid: trainer_cpu, **workers_cpu}
        self._tick_then = now
        if elapsed is None or elapsed <= 0:
            return None, None
        trainer_pct = 100.0 * max(0.0, trainer_cpu - then.get(self._pid, trainer_cpu)) / elapsed
        workers_pct = (
            100.0
            * sum(max(0.0, used - then.get(pid, 0.0)) for pid, used in workers_cpu.items())
            / elapsed
        )
        return trainer_pct, workers_pct

    def sample(self, nvml: Nvml) -> list[dict[str, Any]]:
        workers_rss, worker_count, workers_cpu = self._workers_usage()
        trainer_cpu_pct, workers_cpu_pct = self._cpu_percents(workers_cpu)
        host = {
            "wall_time": time.time(),
            # summed over cores: 100 = one core fully busy, 100 x cores = the whole host
            "cpu_percent": float(sum(psutil.cpu_percent(percpu=True))),
            "trainer_cpu_percent": trainer_cpu_pct,
            "workers_cpu_percent": workers_cpu_pct,
            "trainer_rss_bytes": self._process.memory_info().rss,
            "workers_rss_bytes": workers_rss,
            "worker_count": worker_count,
        }
        gpus = nvml.read() if nvml.available else [{"gpu_index": None}]
        return [{**host, **gpu} for gpu in gpus]

    def _run(self) -> None:
        nvml = Nvml()
        if not nvml.available:
            self._note(f"NVML unavailable ({nvml.reason}): samples carry no GPU figures")
        psutil.cpu_percent(percpu=True)  # primes the counters: the first call returns 0
        self._cpu_percents(self._workers_usage()[2])  # and ours, over the same interval
        next_tick = time.monotonic() + self._interval_s
        try:
            while not self._stop.wait(max(0.0, next_tick - time.monotonic())):
                for row in self.sample(nvml):
                    self._sink(row)
                self.samples_taken += 1
                next_tick += self._interval_s
        except Exception as exc:  # the sampler must never take the run down with it
            self._note(f"system sampler stopped: {type(exc).__name__}: {exc}")
        finally:
            nvml.close()


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def make_sampler(sink: Sink, note: NoteSink, *, enabled: bool, sample_hz: float) -> NullSampler:
    if not enabled:
        return NullSampler()
    return SystemSampler(sink, note, sample_hz=sample_hz)
