"""The drill-down figures on real traces: which memory curves are drawn, where the per-step
legend sits, what the Kernels view says without kernels."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnostics.drilldown import build_drilldown, load_drilldowns
from diagnostics.drilldown.kernels import no_kernels_text
from diagnostics.report.drill_plots import memory_curve_figure, steps_figure
from diagnostics.trace.loader import load_trace_file
from tests.diagnostics.drilldown.conftest import SHARED

V100 = SHARED / "traces" / "kineto_resnet50_num_workers_0.pt.trace.json.gz"


@pytest.fixture(scope="module")
def cpu_drill(tiny_run: Path):
    (drill,) = load_drilldowns(tiny_run)
    return drill


def curves(drill) -> dict[str, list]:
    fig = memory_curve_figure(drill.memory_curve, drill.memory_peaks)
    return {trace.name: list(trace.text or ()) for trace in fig.data}


def test_a_host_curve_that_stays_at_zero_is_hidden_with_its_peak(h200_drill):
    # the H200 trace's host allocator peaks at 8 bytes: drawn, it read "peak 0 MiB"
    host = h200_drill.memory_curve.filter(h200_drill.memory_curve["device"] == -1)
    assert 0 < host["allocated_mib"].max() < 0.001
    drawn = curves(h200_drill)
    assert list(drawn) == ["GPU 0 allocated", "GPU 0 reserved", "peak allocated"]
    assert drawn["peak allocated"] == ["peak 7,344 MiB"]


def test_real_host_memory_keeps_its_curve_and_peak():
    drawn = curves(build_drilldown(load_trace_file(V100)))
    assert list(drawn) == ["host allocated", "GPU 0 allocated", "peak allocated"]
    assert drawn["peak allocated"] == ["peak 55 MiB", "peak 2,662 MiB"]


def test_a_cpu_run_draws_host_allocated_but_not_its_near_zero_reserved(cpu_drill):
    curve = cpu_drill.memory_curve
    assert curve["reserved_mib"].max() < 0.01  # a few KiB: drawn, it read "0.0 MiB"
    assert curve["allocated_mib"].max() > 1
    drawn = curves(cpu_drill)
    assert list(drawn) == ["host allocated", "peak allocated"]
    assert all(text != "peak 0 MiB" for text in drawn["peak allocated"])


def test_the_per_step_legend_sits_below_the_axis_not_over_the_title(h200_drill):
    fig = steps_figure(h200_drill.breakdown)
    legend, margin = fig.layout.legend, fig.layout.margin
    assert len(fig.data) >= 3 and fig.layout.title.text
    # under the plot area (paper y < 0, hanging down), inside the enlarged bottom margin
    assert legend.yanchor == "top" and legend.y < 0
    assert margin.b >= 120 and margin.t < margin.b


def test_kernels_view_explains_a_cpu_run(cpu_drill, h200_drill):
    assert cpu_drill.kernels.height == 0
    assert no_kernels_text(cpu_drill.trace.metadata.device_properties) == (
        "No GPU kernels in this trace (a CPU run)."
    )
    assert h200_drill.kernels.height > 0
    assert "CPU run" not in no_kernels_text(h200_drill.trace.metadata.device_properties)
