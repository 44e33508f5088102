"""step-time-outliers on the step records that made CI fail (stop 34): the stalled run of
tests/diagnostics/rules/test_step_time_outliers_runs.py, beside three other runs on a CI
host (three test workers, two cores) that got busy from step 15 on. Its ordinary steps went
from ~55 ms to ~450 ms, nearly all of it waiting for a CPU (``cpu_wait_ms``), and the rule,
judging the clock time, found only two of the four 1.5 s loader stalls among them: silent.
The figures are that run's, as the failed test printed them."""

from __future__ import annotations

from diagnostics.rules import examples as ex
from diagnostics.rules.step_time_outliers import StepTimeOutliers
from diagnostics.thresholds import Thresholds

# step, step_time_ms, data_wait_ms, cpu_wait_ms, marks
MEASURED = [
    (1, 995.6, 927.4, 64.1, "epoch_start"),
    (2, 42.0, 11.3, 30.8, "profiler_warmup"),
    (3, 132.9, 5.8, 108.1, "profiler_active"),
    (4, 140.3, 14.2, 119.9, "profiler_active"),
    (5, 1582.8, 1504.7, 64.6, "profiler_active"),
    (6, 66.9, 1.2, 53.1, "after_trace_export"),
    (7, 60.7, 0.8, 46.5, None),
    (8, 82.6, 6.4, 67.5, None),
    (9, 48.8, 3.2, 38.6, None),
    (10, 1571.0, 1513.7, 57.0, None),
    (11, 49.5, 9.6, 33.7, "after_checkpoint"),
    (12, 59.8, 3.6, 43.8, None),
    (13, 49.0, 3.9, 33.3, None),
    (14, 58.4, 18.7, 42.3, None),
    (15, 1845.8, 1514.6, 330.0, None),
    (16, 512.0, 36.1, 496.0, None),
    (17, 438.5, 55.7, 422.5, None),
    (18, 394.4, 24.0, 378.8, None),
    (19, 472.4, 93.4, 457.1, None),
    (20, 1836.0, 1629.0, 325.0, None),
    (21, 474.3, 80.2, 458.0, "after_checkpoint"),
    (22, 508.0, 164.3, 474.6, None),
    (23, 381.4, 26.2, 366.8, None),
    (24, 516.4, 112.1, 499.7, None),
    (25, 1647.5, 1500.8, 134.3, None),
    (26, 10.3, 0.6, 0.9, None),
    (27, 18.3, 1.5, 9.0, None),
    (28, 51.4, 43.4, 6.8, "after_evaluation,epoch_start"),
    (29, 9.2, 1.5, 1.1, None),
    (30, 9.3, 1.5, 1.0, None),
]


def _column(index: int):
    return lambda step: MEASURED[step - 1][index]


def test_the_four_loader_stalls_are_found_through_the_hosts_busy_stretch():
    inputs = ex.cpu_run(
        30,
        config={"train.checkpoint_every": 10},
        step_time_ms=_column(1),
        data_wait_ms=_column(2),
        cpu_wait_ms=_column(3),
        marks=_column(4),
    )
    (finding,) = StepTimeOutliers().check(inputs, Thresholds())
    evidence = finding.evidence
    # 5 is in the profiler's window; none of the busy stretch's ordinary steps (16-24)
    assert evidence["slow_steps"] == [10, 15, 20, 25]
    assert evidence["episodes"] == 4
    assert evidence["cause"] == "waiting for the next batch"
    # the saving is the stalls' own time beyond the median step, the host's wait inside
    # them left out: 4 x ~1.5 s of ~13.9 s of steps, not the ~1.7 s the clock showed
    total_ms = sum(row[1] for row in MEASURED)
    assert 4 * 1400 / total_ms * 100 < finding.estimated_saving_pct < 4 * 1600 / total_ms * 100
