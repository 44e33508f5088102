"""The system sampler splits the host's CPU: the training process's, its DataLoader
workers' (its child processes) and, by difference, other processes'.

Checked in CPU seconds, not shares: each busy process spins until it has used a fixed
amount of CPU time, and a tick's share times the wall time since the previous tick must add
up to it, however loaded the host is (a share of a core depends on the load; the seconds
used do not)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from probe.system import NICE_WEIGHTS, Nvml, PriorityScan, SystemSampler, yielding_share

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


# a process that spins for BUSY_CPU_S of CPU, says so on stdout, then sleeps until killed
SPINNER = f"""
import sys, time
start = time.process_time()
while time.process_time() - start < {BUSY_CPU_S}:
    pass
print("done", flush=True)
time.sleep(60)
"""


def _yielded_cpu_seconds(spinner_nice: int) -> float:
    """CPU seconds the priority scan counts as yielding to a sleeping nice-0 job while a
    process beside it (not one of its workers) spins at ``spinner_nice``. Only the spinner
    is measured: every other process on the host is passed as one of the job's, since under
    xdist other tests run nice-19 work of their own in the same window."""
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    scan = PriorityScan(job.pid)
    spinner = None
    try:
        assert scan.scan({job.pid, os.getpid()}, time.monotonic()) is None  # primes
        start = time.monotonic()
        spinner = subprocess.Popen(
            [sys.executable, "-c", SPINNER],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: os.nice(spinner_nice),
        )
        assert spinner.stdout.readline().strip() == "done"
        now = time.monotonic()
        others = {int(name) for name in os.listdir("/proc") if name.isdigit()} - {spinner.pid}
        return scan.scan({job.pid, os.getpid()} | others, now) / 100.0 * (now - start)
    finally:
        for process in (job, spinner):
            if process is not None:
                process.kill()
                process.wait()


def test_a_busy_process_of_lower_priority_yields_to_the_job_and_one_of_its_own_does_not():
    # nice 19 beside a nice-0 job: CFS leaves it 15 / 1024 of a contended core
    below = _yielded_cpu_seconds(19)
    assert below >= 0.8 * BUSY_CPU_S * (1 - 15 / 1024), below
    # the same spin at the job's priority takes nothing from it
    same = _yielded_cpu_seconds(0)
    assert same == 0.0, (same, below)


def test_the_yielding_share_follows_the_schedulers_weights():
    nice = {n: NICE_WEIGHTS[n + 20] for n in (-15, 0, 1, 19)}
    assert yielding_share(nice[0], nice[-15]) == pytest.approx(1 - 1024 / 29154)
    assert yielding_share(nice[19], nice[0]) == pytest.approx(1 - 15 / 1024)
    # one step of nice is a quarter less weight, not a process that steps aside
    assert yielding_share(nice[1], nice[0]) == pytest.approx(1 - 820 / 1024)
    assert yielding_share(nice[-15], nice[0]) == 0.0 == yielding_share(nice[0], nice[0])
    assert yielding_share(None, nice[0]) == 0.0  # real-time: never yields
    # a real-time job preempts every process that is not real-time, and no real-time one
    assert yielding_share(nice[-15], None) == 1.0 and yielding_share(None, None) == 0.0
