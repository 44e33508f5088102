"""Verdicts of the gate on hand-made sides, each case's numbers chosen so that the verdict
follows from arithmetic in the comment, and the stored baseline's round trip."""

from __future__ import annotations

import json

import pytest

from diagnostics.errors import InputError
from diagnostics.gate.model import gate
from diagnostics.gate.sides import FindingRef, GateSide, load_baseline


def _side(
    times,
    *,
    batch=32.0,
    peak=1 << 30,
    kind="CUDA",
    mfu=None,
    findings=(),
    basis=None,
    counted=None,
    cpu_wait=None,
):
    return GateSide(
        label="side",
        path="side",
        kind="run",
        step_times_ms=tuple(float(t) for t in times),
        step_source="step records",
        job_batch=batch,
        peak_memory_bytes=peak,
        peak_memory_kind=kind,
        mfu_pct=mfu,
        findings=tuple(FindingRef(rule, "high", rule) for rule in findings),
        counted_flops_utilization_pct=counted,
        mfu_basis=basis,
        counted_flops_basis=basis,
        cpu_wait_ms=tuple(float(w) for w in cpu_wait) if cpu_wait is not None else None,
    )


BASE = [100, 101, 99, 102, 98, 100.5, 99.5, 101.5]


def test_a_clear_slowdown_is_a_regression_and_fails():
    # every candidate step is slower than every baseline step (U = 0): exact p = 2/C(16,8);
    # median 120.25 / 100.25 = +20 %
    result = gate(_side(BASE), _side([t * 1.2 for t in BASE]))
    step = result.measure("step_time_ms")
    assert step.verdict == "regression"
    assert step.p_value == pytest.approx(2 / 12870)
    assert step.ratio == pytest.approx(1.2)
    assert result.measure("throughput").verdict == "regression"
    assert result.failed


def test_a_clear_speedup_is_an_improvement_and_passes():
    result = gate(_side(BASE), _side([t / 1.5 for t in BASE]))
    assert result.measure("step_time_ms").verdict == "improvement"
    assert result.measure("throughput").ratio == pytest.approx(1.5)
    assert not result.failed


def test_a_significant_change_within_the_tolerance_is_no_change():
    # +4.5 % on every step: 98 x 1.045 = 102.41 is above the baseline's slowest step (102),
    # so U = 0 and the exact p = 2 / C(16, 8) = 2 / 12870, significant; inside the 5 %
    step = gate(_side(BASE), _side([t * 1.045 for t in BASE])).measure("step_time_ms")
    assert step.p_value == pytest.approx(2 / 12870)
    assert step.verdict == "no change"
    assert step.p_value < 0.002
    assert "within ±5 %" in step.reason


def test_a_large_change_that_is_not_significant_is_no_change_with_its_p():
    # medians 102.5 and 112.5 (+9.8 %), but the samples interleave: far from significant
    step = gate(
        _side([60, 100, 140, 80, 120, 90, 110, 105]), _side([70, 110, 150, 90, 130, 100, 120, 115])
    ).measure("step_time_ms")
    assert step.ratio == pytest.approx(112.5 / 102.5)
    assert step.verdict == "no change"
    assert "not significant" in step.reason and step.p_value > 0.002


def test_six_against_six_steps_cannot_reach_the_default_level():
    # smallest exact p for 6 and 6: 2 / C(12, 6) = 2 / 924 = 0.00216 > 0.002
    step = gate(_side([10, 11, 12, 13, 14, 15]), _side([30, 31, 32, 33, 34, 35])).measure(
        "step_time_ms"
    )
    assert step.verdict == "inconclusive"
    assert step.reason.startswith("too few steps (6 and 6)")


def test_too_few_steps_is_inconclusive_whatever_the_ratio():
    # 3 against 3 steps: the smallest exact p is 2/20 = 0.1, not below even 0.05
    step = gate(_side([10, 11, 12]), _side([30, 31, 32]), alpha=0.05).measure("step_time_ms")
    assert step.verdict == "inconclusive"
    assert step.reason.startswith("too few steps (3 and 3)")
    assert step.p_value is None


def test_a_tighter_tolerance_turns_the_small_change_into_a_regression():
    result = gate(_side(BASE), _side([t * 1.045 for t in BASE]), max_regression=0.01)
    assert result.measure("step_time_ms").verdict == "regression"


def test_peak_memory_is_judged_by_its_ratio_and_kinds_must_match():
    grown = gate(_side(BASE), _side(BASE, peak=int(1.10 * (1 << 30))))
    assert grown.measure("peak_memory_bytes").verdict == "regression"
    assert grown.failed
    mixed = gate(_side(BASE), _side(BASE, kind="host RSS"))
    assert mixed.measure("peak_memory_bytes").verdict == "inconclusive"
    assert "not comparable" in mixed.measure("peak_memory_bytes").reason


def test_mfu_is_unknown_until_an_analysis_gives_it_and_judged_once_it_does():
    unknown = gate(_side(BASE), _side(BASE)).measure("mfu_pct")
    assert (unknown.verdict, unknown.baseline, unknown.candidate) == ("inconclusive", None, None)
    assert "unknown" in unknown.reason
    # 40 % -> 30 %: a quarter less, beyond 1/1.05
    assert gate(_side(BASE, mfu=40.0), _side(BASE, mfu=30.0)).measure("mfu_pct").verdict == (
        "regression"
    )


def test_utilisations_of_different_peaks_are_not_compared():
    # the H200 pair m768l6b256 -> -fp32: 24.9 % of the bf16 peak is 246.6 TFLOP/s, 65.3 % of
    # the fp32 one 43.8: the higher share is the slower run
    bf16, fp32 = "H200 SXM dense bf16 989.5 TFLOP/s", "H200 SXM dense fp32 67 TFLOP/s"
    result = gate(
        _side(BASE, mfu=24.9, counted=23.2, basis=bf16),
        _side(BASE, mfu=65.3, counted=63.5, basis=fp32),
    )
    for key in ("mfu_pct", "counted_flops_utilization_pct"):
        measure = result.measure(key)
        assert measure.verdict == "inconclusive" and measure.ratio is None
        assert measure.reason == f"not comparable: a share of {bf16} against one of {fp32}"
    assert result.measure("mfu_pct").baseline == 24.9  # shown, not judged
    same = gate(_side(BASE, mfu=24.9, basis=bf16), _side(BASE, mfu=24.0, basis=bf16))
    # 24.0 / 24.9 = 0.964, above the higher-is-better bound 1 / 1.05 = 0.952
    assert same.measure("mfu_pct").verdict == "no change"


def test_throughput_falls_back_to_steps_per_second_without_a_batch():
    measure = gate(_side(BASE, batch=None), _side(BASE)).measure("throughput")
    assert measure.unit == "steps/s"
    assert measure.baseline == pytest.approx(1000 / 100.25)


def test_findings_gained_and_lost_are_matched_by_rule():
    result = gate(
        _side(BASE, findings=("too-few-workers", "unused-embedding-rows")),
        _side(BASE, findings=("unused-embedding-rows", "batch-too-small")),
    )
    assert [f.rule for f in result.findings_gained] == ["batch-too-small"]
    assert [f.rule for f in result.findings_lost] == ["too-few-workers"]
    assert not result.failed  # findings are reported, they do not fail the gate


def test_a_stored_baseline_reads_back_as_the_same_measures(tmp_path):
    side = _side(BASE, mfu=41.5, counted=38.0, basis="B200 dense bf16 2250 TFLOP/s",
                 findings=("too-few-workers",))  # fmt: skip
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(side.to_baseline()))
    loaded = load_baseline(path)
    assert loaded.kind == "baseline"
    fields = ("step_times_ms", "job_batch", "peak_memory_bytes", "mfu_pct", "findings",
              "counted_flops_utilization_pct", "mfu_basis", "counted_flops_basis")  # fmt: skip
    for field in fields:
        assert getattr(loaded, field) == getattr(side, field)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"schema": "something/else"}, "schema"),
        ({"schema": "pipeline-doctor/gate-baseline/v1", "step_times_ms": [1, "x"]}, "step_times_ms"),
        ({"schema": "pipeline-doctor/gate-baseline/v1", "peak_memory_bytes": "1 GiB"}, "peak_memory_bytes"),
        ({"schema": "pipeline-doctor/gate-baseline/v1", "findings": [{"severity": "high"}]}, "findings"),
    ],
)  # fmt: skip
def test_a_bad_baseline_is_one_error_naming_the_file_and_field(tmp_path, doc, field):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as error:
        load_baseline(path)
    assert str(error.value).startswith(f"{path}: ")
    assert field in str(error.value)


def test_a_slowdown_that_is_only_waiting_for_a_cpu_is_inconclusive_not_a_regression():
    # the twins of test_gate_noise: the same 150 ms of work a step, one waiting 750 ms for a
    # core and the other 1,050 ms (+33 % in wall time, every step slower: p = 2 / C(16, 8))
    work = [150, 152, 148, 151, 149, 150.5, 149.5, 151.5]
    base = _side([w + 750 for w in work], cpu_wait=[750] * 8)
    cand = _side([w + 1050 for w in work], cpu_wait=[1050] * 8)
    result = gate(base, cand)
    for key in ("step_time_ms", "throughput"):
        measure = result.measure(key)
        assert measure.verdict == "inconclusive", measure
        assert "the difference is CPU contention" in measure.reason
        assert measure.p_value == pytest.approx(2 / 12870)  # the wall-time test, kept
    assert not result.failed


def test_a_slowdown_in_the_work_itself_stays_a_regression_whatever_the_cpu_wait():
    # the same waits on both sides, 20 % more work a step: net of the wait still +20 %
    base = _side([b + 300 for b in BASE], cpu_wait=[300] * 8)
    cand = _side([b * 1.2 + 300 for b in BASE], cpu_wait=[300] * 8)
    assert gate(base, cand).measure("step_time_ms").verdict == "regression"
    # and without wait records on one side nothing is taken out
    bare = _side([b * 1.2 + 300 for b in BASE])
    waited = _side([w + 1050 for w in BASE], cpu_wait=[1050] * 8)
    assert gate(_side([w + 750 for w in BASE]), waited).measure("step_time_ms").verdict == (
        "regression"
    )
    assert gate(base, bare).measure("step_time_ms").verdict == "regression"
