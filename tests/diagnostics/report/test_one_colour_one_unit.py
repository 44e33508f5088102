"""One colour per category and one unit per time axis, in every figure a user sees.

Before, data wait was red in the step-time chart and plotly's blue in the too-few-workers
evidence beside it, and the sync and kernel evidence charts counted µs ("300k" ticks) while
every other time axis counted ms. The figures are drawn from every rule's own firing
examples and the run and trace charts; the colours expected are written out here.
"""

from __future__ import annotations

import polars as pl
import pytest

from diagnostics.report import drill_plots, plots
from diagnostics.report.evidence_chart import finding_figure
from diagnostics.rules.registry import RULES
from diagnostics.thresholds import Thresholds
from tests.diagnostics.report.frames import simple_steps

RED, PURPLE, BLUE, GREY = "#d62728", "#9467bd", "#1f77b4", "#7f7f7f"


def _colour(trace) -> str | None:
    if trace.type == "bar":
        return trace.marker.color
    return trace.line.color


def _firing_findings():
    for rule in RULES:
        for example in rule.examples:
            if example.fires:
                for finding in rule.check(example.build(), Thresholds()):
                    if finding.evidence.get("chart") is not None:
                        yield rule.id, example.name, finding


FINDINGS = list(_firing_findings())


def test_the_examples_draw_evidence_charts():
    assert len({rule for rule, _, _ in FINDINGS}) >= 15


@pytest.mark.parametrize(("rule", "example", "finding"), FINDINGS, ids=lambda v: str(v)[:40])
def test_evidence_time_axes_are_in_ms_and_categories_keep_their_colour(rule, example, finding):
    chart = finding.evidence["chart"]
    assert "µs" not in chart.y_label, (rule, example, chart.y_label)
    assert not any("µs" in name for name in chart.series), (rule, example, list(chart.series))
    fig = finding_figure(finding)
    if fig is None:  # a chart with no points draws nothing
        assert not chart.x
        return
    expected = {
        "data wait (ms)": RED,
        "h2d (ms)": PURPLE,
        "copy time (ms)": PURPLE,
        "rest of step (ms)": GREY,
    }
    for trace in fig.data:
        if trace.name in expected:
            assert _colour(trace) == expected[trace.name], (rule, trace.name)


def test_data_wait_is_red_in_every_figure_that_draws_it():
    step_time = plots.step_time_figure(simple_steps(4))
    (wait,) = [t for t in step_time.data if t.name == "data wait"]
    breakdown = plots.breakdown_figure(
        pl.DataFrame(
            {
                "step": [1],
                "kernel_us": [1500],
                "memcpy_us": [500],
                "memset_us": [0],
                "runtime_us": [100],
                "dataloader_us": [4000],
                "cpu_exec_us": [0],
                "other_us": [0],
                "total_us": [6100],
            }
        )  # fmt: skip
    )
    (loader,) = [t for t in breakdown.data if t.name == "DataLoader"]
    (kernel,) = [t for t in breakdown.data if t.name == "kernel"]
    (evidence,) = [
        t
        for _, _, f in FINDINGS
        if f.rule == "too-few-workers"
        for t in finding_figure(f).data
        if t.name == "data wait (ms)"
    ][:1]
    overview = drill_plots.overview_figure(
        pl.DataFrame({"category": ["Kernel", "DataLoader"], "mean_ms": [1.0, 2.0]})
    )
    colours = dict(zip(overview.data[0].labels, overview.data[0].marker.colors, strict=True))
    assert wait.marker.color == loader.marker.color == evidence.marker.color == RED
    assert colours["DataLoader"] == RED
    assert colours["Kernel"] == kernel.marker.color == BLUE
    assert drill_plots.KIND_STYLE["dataloader"][1] == RED
    assert drill_plots.KIND_STYLE["kernel"][1] == BLUE
