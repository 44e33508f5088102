"""The system sampler splits the host's CPU: the training process's, its DataLoader
workers' (its child processes) and, by difference, other processes'."""

from __future__ import annotations

import multiprocessing
import time

from probe.system import Nvml, SystemSampler


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _sampler() -> SystemSampler:
    return SystemSampler(lambda row: None, lambda note: None, sample_hz=10.0)


def test_a_busy_child_counts_as_the_workers_and_a_busy_trainer_as_the_trainer():
    sampler = _sampler()
    nvml = Nvml.__new__(Nvml)
    nvml.available = False  # the host's figures only

    (first,) = sampler.sample(nvml)
    # the first tick has no previous one to measure from: unknown, not zero
    assert first["trainer_cpu_percent"] is None
    assert first["workers_cpu_percent"] is None

    child = multiprocessing.get_context("fork").Process(target=_spin, args=(3.0,))
    child.start()
    try:
        time.sleep(0.2)
        sampler.sample(nvml)  # sees the child: its CPU from here on is the workers'
        time.sleep(0.6)  # the child spins, the trainer sleeps
        (idle_trainer,) = sampler.sample(nvml)
        _spin(0.6)  # the trainer spins too
        (busy_trainer,) = sampler.sample(nvml)
        tracked = set(sampler._workers)
    finally:
        child.join()

    # a spinning process gets at least a fifth of a core even on a loaded 2-core host
    assert idle_trainer["workers_cpu_percent"] > 20.0
    assert idle_trainer["trainer_cpu_percent"] < busy_trainer["trainer_cpu_percent"]
    assert busy_trainer["trainer_cpu_percent"] > 20.0
    # (other children a test session left behind may be counted beside it)
    assert child.pid in tracked
