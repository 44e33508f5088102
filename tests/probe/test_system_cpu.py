"""The system sampler splits the host's CPU: the training process's, its DataLoader
workers' (its child processes) and, by difference, other processes'.

Checked in CPU seconds, not shares: each busy process spins until it has used a fixed
amount of CPU time, and a tick's share times the wall time since the previous tick must add
up to it, however loaded the host is (a share of a core depends on the load; the seconds
used do not)."""

from __future__ import annotations

import multiprocessing
import time

from probe.system import Nvml, SystemSampler

BUSY_CPU_S = 0.3


def _spin_for_cpu(seconds: float, done=None) -> None:
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
    if done is not None:
        done.set()
        time.sleep(60)  # alive, idle, until the test ends it: a worker between batches


def _host_only() -> Nvml:
    nvml = Nvml.__new__(Nvml)
    nvml.available = False
    return nvml


def test_a_busy_child_counts_as_the_workers_and_a_busy_trainer_as_the_trainer():
    sampler = SystemSampler(lambda row: None, lambda note: None, sample_hz=10.0)
    nvml = _host_only()

    (first,) = sampler.sample(nvml)
    # the first tick has no previous one to measure from: unknown, not zero
    assert first["trainer_cpu_percent"] is None
    assert first["workers_cpu_percent"] is None
    tick = time.monotonic()

    def cpu_seconds(row, key: str) -> float:
        """The row's share (100 = one core) over the wall time since the previous tick."""
        nonlocal tick
        now, elapsed = time.monotonic(), time.monotonic() - tick
        tick = now
        return row[key] / 100.0 * elapsed

    context = multiprocessing.get_context("fork")
    done = context.Event()
    child = context.Process(target=_spin_for_cpu, args=(BUSY_CPU_S, done))
    child.start()
    try:
        (seen,) = sampler.sample(nvml)  # the child's CPU so far is new: it was just forked
        workers_s = cpu_seconds(seen, "workers_cpu_percent")
        assert done.wait(120)
        time.sleep(0.05)
        (spun,) = sampler.sample(nvml)  # the trainer slept meanwhile
        workers_s += cpu_seconds(spun, "workers_cpu_percent")
        tracked = set(sampler._workers)
    finally:
        child.kill()
        child.join()
    _spin_for_cpu(BUSY_CPU_S)  # now the trainer spins
    (busy,) = sampler.sample(nvml)

    # (other children a test session left behind may be counted beside it)
    assert child.pid in tracked
    # the child's spin, give or take the ticks' clock reads
    assert workers_s >= 0.8 * BUSY_CPU_S, workers_s
    trainer_busy_s = cpu_seconds(busy, "trainer_cpu_percent")
    assert trainer_busy_s >= 0.8 * BUSY_CPU_S, trainer_busy_s
    assert spun["trainer_cpu_percent"] < busy["trainer_cpu_percent"]
