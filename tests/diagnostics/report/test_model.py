from __future__ import annotations

import pytest

from diagnostics.compare import compare
from diagnostics.report.model import build_comparison_report, build_report
from diagnostics.report.pricing import Pricing
from tests.diagnostics.report import fakes


def test_findings_in_severity_then_saving_order(run_result):
    report = build_report(run_result)
    # Given low, medium, high (10 %), high (35 %): highs first, the larger saving first.
    assert [(f.severity, f.rule) for f in report.findings] == [
        ("high", "slow-data"),
        ("high", "too-few-workers"),
        ("medium", "missing-pin-memory"),
        ("low", "small-batch"),
    ]
    assert [f.rule for f in report.findings_at_or_above("high")] == ["slow-data", "too-few-workers"]
    assert len(report.findings_at_or_above("medium")) == 3
    assert len(report.findings_at_or_above("low")) == 4


def test_run_report_summary_cost_and_charts(run_result):
    report = build_report(run_result)
    assert report.kind == "run" and report.title.endswith("run run-1")
    summary = dict(report.summary_rows)
    # Every step: 40 + 2 + 50 + 5 + 3 = 100 ms, 8 samples each: 80 samples/s, 40 % waiting.
    assert summary["median step time"] == "100 ms"
    assert summary["throughput"] == "80 samples/s"
    assert summary["data-wait share of step time"] == "40.0 %"
    # a run folder without a trace: NVML's utilisation is the kernel-time figure; busy time
    # (copies and memsets too) needs a trace
    assert summary["GPU utilisation (kernel time, as nvidia-smi)"] == "40.0 %"
    assert summary["GPU busy (kernels, copies, memsets)"] == "—"
    assert dict(report.environment_rows)["GPU"] == "NVIDIA H100 80GB HBM3"
    assert ("data.num_workers", "0") in report.config_rows
    assert [c.key for c in report.charts] == ["step_time", "loss_gradnorm", "memory", "system"]
    slow = report.findings[0]
    assert slow.figure is not None and "chart" not in slow.evidence
    assert slow.set_args == ("data.num_workers=4", "data.persistent_workers=true")
    assert dict(slow.evidence_rows)["data wait"] == "40.0 ms"
    cost = report.cost
    # 1,000 rows / batch 8 = 125 steps; 125 x 100 ms = 12.5 s an epoch.
    assert cost.steps_per_epoch == 125 and cost.time_per_epoch_s == pytest.approx(12.5)
    # Savings 35, 10, 8 and 5 % of the same step time add up to 58 %, under the largest
    # measured share they can explain (the GPU idles 100 - 40 = 60 %): not compounded.
    assert cost.saving_bound_pct == pytest.approx(60.0)
    kept = 1 - 0.58
    assert cost.saving_pct == pytest.approx(100 * (1 - kept))
    assert cost.after_time_per_1000_steps_s == pytest.approx(100.0 * kept)
    assert cost.gpu == "NVIDIA H100 80GB"


def test_user_price_reaches_the_cost(run_result):
    report = build_report(run_result, pricing=Pricing(usd_per_gpu_hour=36.0))
    # 1,000 steps x 100 ms = 100 s at $36 an hour = $1.00.
    assert report.cost.cost_per_1000_steps_usd == pytest.approx(1.0)


def test_trace_report_has_trace_charts_and_world_size():
    report = build_report(fakes.trace_result())
    assert report.kind == "trace"
    assert [c.key for c in report.charts] == ["breakdown", "top_operators", "top_kernels"]
    assert report.cost.gpus == 8  # the trace's distributedInfo world size
    assert report.cost.steps_per_epoch is None
    # which memory and over which window, as the card and the CLI say it
    rows = dict(report.summary_rows)
    assert rows["peak memory, CUDA allocated (profiled window)"] == "3.00 GiB"  # 3 << 30 bytes


def test_comparison_report(tmp_path, run_data, mixed_findings):
    fast = fakes.write_run(
        tmp_path,
        run_id="run-2",
        steps=fakes.steps_records(12, data_wait_ms=0.0),
        config={
            "scenario": "slow-loader",
            "data": {"rows": 1000, "num_workers": 4},
            "train": {"batch_size": 8},
        },
    )
    a = fakes.run_result(run_data, mixed_findings)
    b = fakes.run_result(fast, mixed_findings[:2])
    report = build_comparison_report(compare(a, b))
    section = report.comparison
    assert report.kind == "comparison"
    assert [f.rule for f in section.gone] == ["slow-data", "too-few-workers"]
    assert [f.rule for f in section.kept] == ["missing-pin-memory", "small-batch"]
    assert section.new == ()
    rows = {row[0]: row for row in section.rows}
    # 100 ms -> 60 ms a step: throughput 100/60 = 1.67x, step time 0.60x.
    assert rows["throughput (samples/s)"][3] == "1.67×"
    assert rows["median step time"][3] == "0.60×"
    assert rows["median step time"][4] == "better"
    assert section.config_changes == (("data.num_workers", "0", "4"),)
    assert report.charts[0].key == "compare_steps"
    assert section.cost_a.time_per_1000_steps_s == pytest.approx(100.0)
    assert report.cost.time_per_1000_steps_s == pytest.approx(60.0)


def test_run_charts_mark_the_rules_spikes_and_leak_slope(run_data):
    unstable = fakes.finding(
        "unstable-gradients",
        fakes.Severity.HIGH,
        None,
        evidence={"grad_spikes": {"finetune": {"steps": [4, 7]}}, "steps": [4, 7]},
    )
    leak = fakes.finding(
        "memory-leak",
        fakes.Severity.HIGH,
        None,
        evidence={"series": "host RSS of the trainer", "slope_bytes_per_step": 1024 * 1024},
    )
    charts = {
        c.key: c.figure for c in build_report(fakes.run_result(run_data, (unstable, leak))).charts
    }
    spikes = [t for t in charts["loss_gradnorm"].data if t.name == "spike (grad norm)"]
    assert list(spikes[0].x) == [4, 7]
    fitted = [t for t in charts["memory"].data if t.name.startswith("fitted growth")]
    # RSS is (500 + step) MiB over steps 1..12 and the slope is 1 MiB/step: the line meets both ends.
    assert list(fitted[0].y) == pytest.approx([501.0, 512.0])


def test_a_range_in_unstable_evidence_is_not_a_spike(run_data):
    diverged = fakes.finding(
        "unstable-gradients",
        fakes.Severity.HIGH,
        None,
        evidence={"divergence": {}, "steps": [1, 12]},
    )
    charts = {c.key: c.figure for c in build_report(fakes.run_result(run_data, (diverged,))).charts}
    assert not [t for t in charts["loss_gradnorm"].data if (t.name or "").startswith("spike")]


def test_cpu_trace_ranks_operators_by_host_self_time():
    import dataclasses

    import polars as pl

    facts = fakes.trace_facts()
    cpu_ops = pl.DataFrame(
        {
            "name": ["autograd::engine", "aten::mm"],
            "calls": [1, 1],
            "host_us": [5000.0, 4000.0],  # the wrapper's total includes aten::mm's 4 ms
            "host_self_us": [1000.0, 4000.0],
            "device_us": [0.0, 0.0],
        }
    )
    result = dataclasses.replace(
        fakes.trace_result(), facts=dataclasses.replace(facts, device="cpu", operators=cpu_ops)
    )
    chart = {c.key: c for c in build_report(result).charts}["top_operators"].figure
    bar = chart.data[0]
    # Largest self time on top (last): aten::mm 4 ms, then the wrapper's own 1 ms.
    assert list(bar.x) == [1.0, 4.0] and bar.y[-1] == "1. aten::mm"
    assert "CPU self time" in chart.layout.title.text
