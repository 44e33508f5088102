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

How other processes' CPU is told apart: what the host used less the training process and its
workers is other processes'; of that, the part used by processes at a lower priority than
the training process (``lower_priority_cpu_percent``) is not taken from a worker of the job,
because CFS shares a contended core in proportion to each thread's weight (the kernel's
``sched_prio_to_weight``): a nice-0 busy loop beside a job at nice -15 keeps 1024 / 29154 of
what it used, a nice-19 one beside a nice-0 job 15 / 1024. Each process's figure is weighed
by ``1 - min(1, its weight / the job's)``; real-time ones never yield, and every
other process yields to a real-time job. It takes reading every visible
``/proc/<pid>/stat`` (about 15 us each), so it is done once a second, not each tick;
processes in other containers are not visible and count as not yielding.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

Sink = Callable[[dict[str, Any]], None]
# the kernel's sched_prio_to_weight, nice -20 to 19: CFS's share of a contended core
NICE_WEIGHTS = (
    (88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916)
    + (9548, 7620, 6100, 4904, 3906, 3121, 2501, 1991, 1586, 1277)
    + (1024, 820, 655, 526, 423, 335, 272, 215, 172, 137)
    + (110, 87, 70, 56, 45, 36, 29, 23, 18, 15)
)
# SCHED_IDLE's weight (WEIGHT_IDLEPRIO), whatever the nice
IDLE_WEIGHT = 3
SCHED_IDLE = 5
# the priority scan reads every process's stat file: at most once in this many seconds
PRIORITY_SCAN_INTERVAL_S = 1.0
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


@dataclass(frozen=True)
class ProcessCpu:
    """One process's CPU seconds so far and its CFS weight (None: real-time, never yields)."""

    cpu_seconds: float
    weight: int | None


def read_process_cpu(pid: int, clock_ticks: float) -> ProcessCpu | None:
    """From ``/proc/<pid>/stat``; None where the process is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
        # the command name may hold spaces and parentheses: the fields start after the last ")"
        fields = data[data.rindex(b")") + 2 :].split()
        cpu_seconds = (int(fields[11]) + int(fields[12])) / clock_ticks
        priority, nice, policy = int(fields[15]), int(fields[16]), int(fields[38])
    except (OSError, ValueError, IndexError):
        return None
    if priority < 0:  # real-time: -1 - its rt priority
        return ProcessCpu(cpu_seconds, None)
    if policy == SCHED_IDLE:
        return ProcessCpu(cpu_seconds, IDLE_WEIGHT)
    return ProcessCpu(cpu_seconds, NICE_WEIGHTS[min(max(nice, -20), 19) + 20])


def yielding_share(weight: int | None, job_weight: int | None) -> float:
    """The part of a process's CPU a thread of the job would take from it on a contended
    core: none at the job's weight or above, nearly all far below it; a real-time job
    (``None``) takes it all from any process that is not real-time."""
    if weight is None:
        return 0.0
    if job_weight is None:
        return 1.0
    return 1.0 - min(1.0, weight / job_weight)


class PriorityScan:
    """Other processes' CPU that yields to the job: each visible process's CPU since the
    previous scan, weighed by ``yielding_share``, summed (100 = one core)."""

    def __init__(self, job_pid: int) -> None:
        self._job_pid = job_pid
        self._clock_ticks = float(os.sysconf("SC_CLK_TCK"))
        self._cpu_then: dict[int, float] = {}
        self._scan_then: float | None = None

    def due(self, now: float) -> bool:
        return self._scan_then is None or now - self._scan_then >= PRIORITY_SCAN_INTERVAL_S

    def scan(self, job_pids: set[int], now: float) -> float | None:
        """The yielding CPU % since the previous scan; None on the first, or where ``/proc``
        cannot be listed or the job's own priority read."""
        job = read_process_cpu(self._job_pid, self._clock_ticks)
        if job is None:
            return None
        try:
            names = os.listdir("/proc")
        except OSError:
            return None
        cpu_now: dict[int, float] = {}
        yielded_s = 0.0
        for name in names:
            if not name.isdigit() or int(name) in job_pids:
                continue
            process = read_process_cpu(int(name), self._clock_ticks)
            if process is None:
                continue
            cpu_now[int(name)] = process.cpu_seconds
            # a process first seen now started since the previous scan: all its CPU is new
            used = max(0.0, process.cpu_seconds - self._cpu_then.get(int(name), 0.0))
            yielded_s += used * yielding_share(process.weight, job.weight)
        then, self._cpu_then, self._scan_then = self._scan_then, cpu_now, now
        if then is None or now <= then:
            return None
        return 100.0 * yielded_s / (now - then)


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
        self._priority_scan = PriorityScan(self._pid)
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
        now = time.monotonic()
        lower_priority_pct = None
        if self._priority_scan.due(now):
            job_pids = {self._pid, os.getpid(), *workers_cpu}
            lower_priority_pct = self._priority_scan.scan(job_pids, now)
        host = {
            "wall_time": time.time(),
            # summed over cores: 100 = one core fully busy, 100 x cores = the whole host
            "cpu_percent": float(sum(psutil.cpu_percent(percpu=True))),
            "trainer_cpu_percent": trainer_cpu_pct,
            "workers_cpu_percent": workers_cpu_pct,
            # of other processes' CPU, what yields to the job (once a second; else null)
            "lower_priority_cpu_percent": lower_priority_pct,
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
        self._priority_scan.scan({self._pid, os.getpid()}, time.monotonic())
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
