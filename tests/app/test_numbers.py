"""One statistic per quantity, everywhere (issue 11): for one real slow-loader run of the
trainer, the data-wait share, the median step and the throughput read the same on the Run
detail page (AppTest), in the too-few-workers finding and in the HTML, Markdown and JSON
reports; for a real GPU trace, the GPU utilisation reads the same on the card, in the
low-gpu-utilization finding's title and evidence, and in the reports (GPU busy, labelled
so; the kernel-time utilisation beside it on the card and in the reports).

Before the key metrics were computed once, one slow-loader run showed 18.9 % on the card
(a ratio of sums), 55 % in the finding (a median of per-step shares) and 50.3 % in the
report (the trace's mean over profiled steps); one H200 trace 2.8 %, 4 % and 3.6 %.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnostics import views
from diagnostics.analyze import analyze
from diagnostics.metrics import key_metrics
from diagnostics.report import fmt
from diagnostics.report.html import render_html
from diagnostics.report.json_report import render_json
from diagnostics.report.markdown import render_markdown
from diagnostics.report.model import build_report
from tests.app.test_pages import open_page, texts

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


@pytest.fixture
def runs_env(monkeypatch, trained_runs):
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(trained_runs.runs_dir))
    return trained_runs


def _reports(result) -> dict[str, str]:
    report = build_report(result)
    return {"html": render_html(report), "md": render_markdown(report), "json": render_json(report)}


def test_a_slow_loader_run_quotes_one_data_wait_median_step_and_throughput(runs_env):
    result = analyze(runs_env.slow)
    metrics = result.metrics
    assert metrics is not None and metrics.source == "run"
    share = fmt.pct(metrics.data_wait_pct)  # e.g. "55.0 %"
    step = fmt.ms(metrics.median_step_time_ms)  # e.g. "133 ms"
    rate = fmt.rate(metrics.samples_per_s, "")  # e.g. "120"
    # throughput is derived from the median step and the batch size
    assert metrics.samples_per_s == pytest.approx(
        metrics.batch_size / (metrics.median_step_time_ms / 1000)
    )

    # the page: the cards, the finding's header and its evidence table
    at = open_page("pages/3_Run_detail.py", {"run": runs_env.slow.name})
    assert not at.exception
    cards = {metric.label: metric.value for metric in at.metric}
    assert cards["Data-wait share"] == share
    assert cards["Median step time"] == step
    assert cards["Samples/s"] == rate
    assert f"**{share} of step time is spent waiting for the DataLoader**" in texts(at)
    evidence = {
        row["measure"]: row["value"]
        for table in at.table
        for row in table.value.to_dict("records")
        if "measure" in row
    }
    assert evidence["Data-wait share (%)"] == share
    assert evidence["Median step time"] == step
    assert evidence["Throughput (samples/s)"] == rate

    # the finding
    finding = next(f for f in result.findings if f.rule == "too-few-workers")
    assert finding.title.startswith(share)
    assert fmt.pct(finding.evidence["data_wait_share_pct"]) == share
    assert fmt.ms(finding.evidence["step_time_ms_median"]) == step
    assert fmt.rate(finding.evidence["throughput_samples_per_s"], "") == rate

    # the three report formats: the summary and the finding say the same
    reports = _reports(result)
    for name in ("html", "md"):
        text = reports[name]
        assert f"{share} of step time is spent waiting for the DataLoader" in text, name
        assert step in text and f"{rate} samples/s" in text, name
    doc = json.loads(reports["json"])
    assert doc["summary"]["data_wait_pct"] == pytest.approx(metrics.data_wait_pct)
    assert doc["summary"]["step_time_ms"]["p50"] == pytest.approx(metrics.median_step_time_ms)
    assert doc["summary"]["samples_per_s"] == pytest.approx(metrics.samples_per_s)
    assert doc["report"]["metrics"]["data_wait_pct"] == pytest.approx(metrics.data_wait_pct)
    summary_rows = dict(doc["report"]["summary_rows"])
    assert summary_rows["data-wait share of step time"] == share
    assert summary_rows["median step time"] == step
    assert summary_rows["throughput"] == f"{rate} samples/s"
    (json_finding,) = [f for f in doc["report"]["findings"] if f["rule"] == "too-few-workers"]
    assert json_finding["title"] == finding.title


def test_a_gpu_trace_quotes_one_utilisation():
    # A100 rank 0 of 16: the GPU idles most of the profiled steps
    result = analyze(TRACES / "hta_a100_rank0_of_16.json.gz")
    util = fmt.pct(result.metrics.gpu_utilization_pct)
    gpu = result.facts.gpu
    # busy time (kernels, copies, memsets, all streams) over the profiled span
    assert result.metrics.gpu_utilization_pct == pytest.approx(
        100 * gpu["busy_us"].sum() / gpu["span_us"].sum()
    )
    assert result.metrics.gpu_busy_pct == result.metrics.gpu_utilization_pct
    # kernels only, as nvidia-smi: copies and memsets with no kernel beside them left out
    kernel_util = fmt.pct(result.metrics.gpu_kernel_utilization_pct)
    assert result.metrics.gpu_kernel_utilization_pct == pytest.approx(
        100 * gpu["kernel_busy_us"].sum() / gpu["span_us"].sum()
    )
    cards = {card.label: card.value for card in views.summary_cards(key_metrics(result))}
    assert cards["GPU busy"] == util
    assert cards["GPU utilisation"] == kernel_util
    finding = next(f for f in result.findings if f.rule == "low-gpu-utilization")
    assert finding.title == f"GPU busy only {util} of the profiled steps"
    assert fmt.pct(finding.evidence["gpu_busy_pct"]) == util
    assert fmt.pct(finding.evidence["gpu_kernel_utilization_pct"]) == kernel_util
    assert fmt.pct(result.summary["gpu_busy_pct"]) == util
    assert fmt.pct(result.summary["gpu_kernel_utilization_pct"]) == kernel_util
    reports = _reports(result)
    for name, text in reports.items():
        assert f"GPU busy only {util} of the profiled steps" in text, name
    doc = json.loads(reports["json"])
    rows = dict(doc["report"]["summary_rows"])
    assert rows["GPU busy (kernels, copies, memsets)"] == util
    assert rows["GPU utilisation (kernel time, as nvidia-smi)"] == kernel_util
