"""The drill-down figures and the kernels' blocks per SM, on real traces (issue 11).

The figures are checked against the tables they draw: the overview donut and the per-step
bars against the overview table, the memory curve's peak marker against the curve's
largest value. Blocks per SM after aggregation are checked against a json.load oracle.
"""

from __future__ import annotations

from collections import defaultdict

import polars as pl
import pytest

from diagnostics.drilldown.overview import PART_LABELS
from diagnostics.report import drill_plots, plots


def test_blocks_per_sm_is_each_kernels_duration_weighted_mean_from_the_json(h200_drill, h200_raw):
    # CUPTI's per-launch "blocks per SM", weighted by duration as torch-tb-profiler does:
    # sum(dur x blocks) / sum(dur) over a kernel's launches with a duration.
    weighted: defaultdict[str, float] = defaultdict(float)
    duration: defaultdict[str, float] = defaultdict(float)
    for e in h200_raw:
        if e.get("cat") == "kernel" and e.get("ph") == "X" and "blocks per SM" in e["args"]:
            weighted[e["name"]] += e["dur"] * e["args"]["blocks per SM"]
            duration[e["name"]] += e["dur"]
    assert duration, "this H200 trace carries blocks per SM"
    table = h200_drill.kernels
    checked = 0
    for name, blocks in table.select("kernel", "blocks_per_sm").iter_rows():
        if duration[name] > 0:
            assert blocks == pytest.approx(weighted[name] / duration[name], rel=1e-9)
            checked += 1
    assert checked == sum(1 for d in duration.values() if d > 0)
    # a weighted mean lies within its launches' range
    spread = {}
    for e in h200_raw:
        if e.get("cat") == "kernel" and e.get("ph") == "X" and e["dur"] > 0:
            low, high = spread.get(e["name"], (float("inf"), float("-inf")))
            value = e["args"]["blocks per SM"]
            spread[e["name"]] = (min(low, value), max(high, value))
    for name, blocks in table.select("kernel", "blocks_per_sm").iter_rows():
        if name in spread:
            low, high = spread[name]
            assert low - 1e-12 <= blocks <= high + 1e-12


def test_overview_donut_and_per_step_bars_add_up_to_the_table(h200_drill):
    table = h200_drill.overview.filter(pl.col("mean_ms") > 0)
    donut = drill_plots.overview_figure(h200_drill.overview)
    (pie,) = donut.data
    assert list(pie.labels) == table["category"].to_list()
    assert list(pie.values) == pytest.approx(table["mean_ms"].to_list())
    # the parts add up to the mean profiled step
    mean_step_ms = float(h200_drill.breakdown["total_us"].mean()) / 1000.0
    assert sum(pie.values) == pytest.approx(mean_step_ms)

    bars = plots.breakdown_figure(h200_drill.breakdown)
    steps = h200_drill.breakdown.height
    assert all(len(bar.y) == steps for bar in bars.data)  # no thinning at this size
    # each category's bars, averaged over the steps, are the table's mean for it; the
    # stacked bars together are the mean step
    by_label = {bar.name: sum(bar.y) / steps for bar in bars.data}
    bar_label = {column: label for column, label, _ in plots.BREAKDOWN_PARTS}
    table_label = {label: column for column, label in PART_LABELS}
    for category, mean_ms in table.select("category", "mean_ms").iter_rows():
        assert by_label[bar_label[table_label[category]]] == pytest.approx(mean_ms)
    assert sum(by_label.values()) == pytest.approx(mean_step_ms)


def test_memory_curve_marks_each_gpus_peak_at_the_curves_largest_value(h200_drill):
    curve, peaks = h200_drill.memory_curve, h200_drill.memory_peaks
    figure = drill_plots.memory_curve_figure(curve, peaks)
    marker = next(t for t in figure.data if t.name == "peak allocated")
    points = list(zip(marker.x, marker.y, strict=True))
    for device in curve.filter(pl.col("device") >= 0)["device"].unique().to_list():
        rows = curve.filter(pl.col("device") == device)
        top = float(rows["allocated_mib"].max())
        at = rows.filter(pl.col("allocated_mib") == top)["time_ms"].to_list()
        # the marker sits on the curve's maximum: that value, at a time the curve has it
        assert any(y == pytest.approx(top) and x in at for x, y in points), device
    # and nothing on the drawn allocated lines is higher than the highest marker
    lines = [t for t in figure.data if str(t.name).endswith("allocated") and t.name != marker.name]
    assert max(max(t.y) for t in lines) == pytest.approx(max(marker.y))
