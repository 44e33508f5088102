from __future__ import annotations

import pytest

from diagnostics.compare import compare
from diagnostics.rules.base import Severity
from tests.diagnostics.report import fakes


@pytest.fixture
def before_after(tmp_path):
    slow = fakes.write_run(
        tmp_path,
        run_id="slow",
        steps=fakes.steps_records(6, data_wait_ms=90.0),
        config={
            "scenario": "slow-loader",
            "data": {"rows": 64, "num_workers": 0},
            "train": {"batch_size": 8},
        },
    )
    fast = fakes.write_run(
        tmp_path,
        run_id="fast",
        steps=fakes.steps_records(6, data_wait_ms=0.0),
        config={
            "scenario": "slow-loader",
            "data": {"rows": 64, "num_workers": 4},
            "train": {"batch_size": 8},
        },
        parent_run_id="slow",
        applied_patch={"data.num_workers": 4},
    )
    a = fakes.run_result(
        slow,
        (
            fakes.finding("too-few-workers", Severity.HIGH, 60.0),
            fakes.finding("small-batch", Severity.LOW, 5.0),
        ),
    )
    b = fakes.run_result(
        fast,
        (
            fakes.finding("small-batch", Severity.LOW, 5.0),
            fakes.finding("memory-leak", Severity.MEDIUM, None),
        ),
    )
    return a, b


def test_ratios_are_after_over_before(before_after):
    comparison = compare(*before_after)
    # Step time: 90 + 2 + 50 + 5 + 3 = 150 ms before, 0 + 60 = 60 ms after.
    step = comparison.row("median_step_time_ms")
    assert (step.a, step.b) == (150.0, 60.0)
    assert step.ratio == pytest.approx(60.0 / 150.0)
    assert step.improved is True
    # Throughput: 8 samples per step, so 8 / 0.150 s before and 8 / 0.060 s after: 2.5x.
    throughput = comparison.row("throughput")
    assert throughput.unit == "samples/s"
    assert throughput.a == pytest.approx(8 / 0.150)
    assert throughput.ratio == pytest.approx(150.0 / 60.0)
    assert throughput.improved is True
    wait = comparison.row("data_wait_pct")
    assert wait.a == pytest.approx(100 * 90 / 150) and wait.b == 0.0
    assert wait.ratio == 0.0 and wait.improved is True
    # Peak host RSS: (500 + 6) MiB in both runs.
    memory = comparison.row("peak_memory_bytes")
    assert memory.a == memory.b == 506 * 1024 * 1024 and memory.improved is None
    # A CPU run has no GPU samples: no ratio rather than a made-up one.
    for key in ("gpu_kernel_utilization_pct", "gpu_busy_pct"):
        gpu = comparison.row(key)
        assert gpu.a is None and gpu.ratio is None and gpu.improved is None


def test_findings_gone_new_kept_and_config_changes(before_after):
    comparison = compare(*before_after)
    assert [f.rule for f in comparison.findings_gone] == ["too-few-workers"]
    assert [f.rule for f in comparison.findings_new] == ["memory-leak"]
    assert [(fa.rule, fb.rule) for fa, fb in comparison.findings_kept] == [
        ("small-batch", "small-batch")
    ]
    assert comparison.config_changes == (("data.num_workers", 0, 4),)
    assert (comparison.label_a, comparison.label_b) == ("slow", "fast")
    data = comparison.to_dict()
    assert data["metrics"][0]["key"] == "throughput"
    assert data["findings_gone"][0]["rule"] == "too-few-workers"


def test_traces_compare_in_steps_per_second_and_keep_apart_same_names():
    a = fakes.trace_result((fakes.finding("gpu-idle", Severity.HIGH, 20.0),))
    b = fakes.trace_result(())
    comparison = compare(a, b)
    throughput = comparison.row("throughput")
    # The trace summary's mean step is 10 ms: 100 steps/s on both sides.
    assert throughput.unit == "steps/s" and throughput.a == pytest.approx(100.0)
    assert throughput.ratio == pytest.approx(1.0) and throughput.improved is None
    assert comparison.label_a != comparison.label_b
    assert comparison.config_changes == ()
    assert [f.rule for f in comparison.findings_gone] == ["gpu-idle"]


def test_changes_within_two_percent_read_as_same(tmp_path):
    base = fakes.write_run(tmp_path, run_id="a", steps=fakes.steps_records(6, data_wait_ms=40.0))
    # 40 + 2 + 50 + 5 + 3 = 100 ms against 41 + 60 = 101 ms: 1 % slower, within the noise.
    near = fakes.write_run(tmp_path, run_id="b", steps=fakes.steps_records(6, data_wait_ms=41.0))
    far = fakes.write_run(tmp_path, run_id="c", steps=fakes.steps_records(6, data_wait_ms=43.0))
    a, b, c = (fakes.run_result(run) for run in (base, near, far))
    assert compare(a, b).row("median_step_time_ms").improved is None
    # 103 ms is 3 % slower: worse.
    assert compare(a, c).row("median_step_time_ms").improved is False


def test_headline_is_the_median_step_ratio_and_throughput_follows_it(before_after):
    from diagnostics import views

    comparison = compare(*before_after)
    # median step 150 ms before, 60 ms after: B is 150 / 60 = 2.5x faster
    assert comparison.speedup == pytest.approx(2.5)
    assert views.headline(comparison) == "B is 2.50× faster: median step 150 ms → 60.0 ms"
    # throughput is derived from the same medians, so its ratio is the speedup
    assert comparison.row("throughput").ratio == pytest.approx(comparison.speedup)
    slower = compare(before_after[1], before_after[0])
    assert views.headline(slower) == "B is 2.50× slower: median step 60.0 ms → 150 ms"
