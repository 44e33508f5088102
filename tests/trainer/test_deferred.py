"""Step records written in order once their figures reach the host (probe/deferred).

The CUDA handles (events, pinned copies) need a GPU: tests/trainer/test_gpu.py runs them.
Here a handle that becomes ready when the test says so stands in for a CUDA event, to pin
the queue's order and flush rules, which are the same on both devices.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from probe.deferred import PendingSteps
from probe.steps import HostStepClock, Resolved, run_queue_wait_ns
from tests.cpu_contention import one_core_beside_a_busy_rival, spin


class Later:
    """A value that arrives when ``arrive()`` is called (as a CUDA event completes)."""

    def __init__(self, value):
        self.value = value
        self.arrived = False
        self.waited = False

    def arrive(self) -> None:
        self.arrived = True

    def ready(self) -> bool:
        return self.arrived

    def wait(self) -> None:
        self.waited = True
        self.arrived = True

    def get(self):
        assert self.arrived, "read before it arrived"
        return self.value


def _complete(record, times, values):
    return {**record, **times, **values}


def _queue():
    written: list[dict] = []
    return PendingSteps(written.append, _complete), written


def test_resolved_values_are_written_at_once():
    queue, written = _queue()
    queue.push({"step": 1}, Resolved({"step_time_ms": 5.0}), Resolved({"loss": 2.0}))
    assert written == [{"step": 1, "step_time_ms": 5.0, "loss": 2.0}]
    assert len(queue) == 0


def test_records_wait_for_both_times_and_scalars_and_keep_step_order():
    queue, written = _queue()
    handles = []
    for step in (1, 2, 3):
        times, scalars = Later({"step_time_ms": float(step)}), Later({"loss": 10.0 * step})
        handles.append((times, scalars))
        queue.push({"step": step}, times, scalars)
    assert written == [] and len(queue) == 3
    handles[1][0].arrive()
    handles[1][1].arrive()
    assert queue.poll() == 0  # step 2 is ready, but step 1 is not: nothing out of order
    handles[0][0].arrive()
    assert queue.poll() == 0  # step 1's times alone are not enough
    handles[0][1].arrive()
    assert queue.poll() == 2
    assert [r["step"] for r in written] == [1, 2]
    assert written[1] == {"step": 2, "step_time_ms": 2.0, "loss": 20.0}
    assert len(queue) == 1


def test_flush_waits_for_everything_in_order():
    queue, written = _queue()
    pending = [(Later({"step_time_ms": 1.0}), Later({"loss": 1.0})) for _ in range(4)]
    for step, (times, scalars) in enumerate(pending, start=1):
        queue.push({"step": step}, times, scalars)
    assert queue.flush() == 4
    assert [r["step"] for r in written] == [1, 2, 3, 4]
    assert all(t.waited and s.waited for t, s in pending)
    assert queue.flush() == 0 and len(queue) == 0


def test_a_value_is_never_read_before_it_arrives():
    queue, _ = _queue()
    queue.push({"step": 1}, Later({}), Later({}))
    with pytest.raises(AssertionError):
        queue._write_head()  # what poll() guards against


def test_host_clock_times_add_up():
    clock = HostStepClock()
    clock.begin()
    clock.mark("fetched")
    for mark in ("start", "copied", "computed"):
        clock.mark(mark)
    times = clock.finish()
    assert not clock.deferred
    assert times["step_time_ms"] >= times["data_wait_ms"] >= 0.0
    parts = times["h2d_ms"] + times["compute_ms"] + times["optimizer_ms"]
    assert times["step_time_ms"] == pytest.approx(times["data_wait_ms"] + parts, abs=0.05)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_host_clock_counts_the_time_another_process_had_the_cpu():
    """Two busy processes on one core: about half of the step the training thread is
    runnable but waiting for the CPU, and the clock says so (``cpu_wait_ms``)."""
    # decided by the host, not by the function under test: a run_queue_wait_ns that failed
    # to read the file skipped this test before
    _schedstat_waited_ns()
    with one_core_beside_a_busy_rival():
        clock = HostStepClock()
        clock.begin()
        for mark in ("fetched", "start", "copied"):
            clock.mark(mark)
        spin(0.4)  # wall time: the rival takes about half of it
        clock.mark("computed")
        times = clock.finish()
    # wide margins: the scheduler shares the core about evenly, the machine is noisy
    assert times["cpu_wait_ms"] >= 0.25 * times["step_time_ms"], times
    assert times["cpu_wait_ms"] <= times["step_time_ms"] + 1.0, times


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_an_evaluations_wait_for_a_cpu_is_set_aside_with_its_time():
    """An evaluation between "fetched" and "start" (an epoch boundary) is left out of the
    step time; its run-queue wait is left out of the step's with it. Before, a step of
    ~150 ms after a contended evaluation recorded up to 300 ms of waiting for a CPU (the
    gate's twins, steps 7), more than it lasted."""
    _schedstat_waited_ns()
    with one_core_beside_a_busy_rival():
        clock = HostStepClock()
        clock.begin()
        clock.mark("fetched")
        with clock.set_aside():
            spin(0.4)  # the evaluation, on the contended core: ~0.2 s waiting
        for mark in ("start", "copied", "computed"):
            clock.mark(mark)
        time.sleep(0.05)  # the step itself sleeps: it waits for no CPU
        times = clock.finish()
    assert times["step_time_ms"] < 200.0, times  # the evaluation is not the step's
    assert 0.0 <= times["cpu_wait_ms"] <= times["step_time_ms"], times


def test_host_clock_counts_no_sleep_as_waiting_for_a_cpu():
    """Sleeping is not waiting for a CPU. The thread sleeps 4 x 50 ms between the clock's
    two reads, so its run-queue wait is at most the wall time between them less 200 ms,
    however loaded the host: a busy CI host makes each wake-up wait for a core (fresh-clone
    CI once recorded 200 ms of such waits in a 338 ms step), but never turns sleep into
    waiting. Null only where the kernel keeps no schedstats, which this host does."""
    naps_s = 4 * 0.05
    clock = HostStepClock()
    outer_start = time.perf_counter()
    clock.begin()
    for mark in ("fetched", "start", "copied", "computed"):
        clock.mark(mark)
        time.sleep(naps_s / 4)
    times = clock.finish()
    outer_ms = (time.perf_counter() - outer_start) * 1e3
    _schedstat_waited_ns()  # this host keeps schedstats: the wait is a number, not null
    assert times["cpu_wait_ms"] is not None, times
    # 1 ms: the kernel's and perf_counter's clocks read at slightly different instants
    assert 0.0 <= times["cpu_wait_ms"] <= outer_ms - naps_s * 1e3 + 1.0, (outer_ms, times)


def _schedstat_waited_ns() -> int:
    """The calling thread's run-queue wait, read here from the file (field 2, ns). Linux
    CI and every host these tests run on keep schedstats (the step records' cpu_wait_ms
    is asserted non-null on real runs in test_step_time_outliers_runs.py), so a missing
    file fails rather than skips."""
    path = Path("/proc/thread-self/schedstat")
    assert path.is_file(), f"{path} is missing: this kernel keeps no schedstats"
    return int(path.read_text().split()[1])


def test_run_queue_wait_is_the_threads_schedstat_field():
    before = _schedstat_waited_ns()
    waited = run_queue_wait_ns()
    after = _schedstat_waited_ns()
    assert waited is not None and before <= waited <= after
