"""The memory figures and the page view: units on the axes, the peak where the analysis
put it, each segment drawn to its size, and the site table's MiB from the sites' bytes."""

from __future__ import annotations

from types import SimpleNamespace

import polars as pl

from diagnostics.report.memory_plots import (
    categories_figure,
    memory_timeline_figure,
    segment_map_figure,
)
from diagnostics.rules.snapshot_evidence import snapshot_inputs
from diagnostics.snapshot.examples import MIB, fragmented_snapshot, training_snapshot
from diagnostics.views.memory import memory_view


def _facts(raw):
    return snapshot_inputs(raw).snapshot


def test_timeline_marks_the_peak_in_mib_over_seconds():
    facts = _facts(training_snapshot())
    fig = memory_timeline_figure(facts)
    assert "(s)" in fig.layout.xaxis.title.text and "MiB" in fig.layout.yaxis.title.text
    (peak,) = [t for t in fig.data if t.name == "peak"]
    assert peak.x[0] == facts.peak.time_s
    assert peak.y[0] == 296.0  # 310,378,496 bytes / 2**20
    allocated = next(t for t in fig.data if t.name == "allocated")
    assert max(allocated.y) == 296.0


def test_timeline_without_times_is_drawn_over_entries():
    facts = _facts(training_snapshot(new_schema=False))
    fig = memory_timeline_figure(facts)
    assert "trace entry" in fig.layout.xaxis.title.text
    (peak,) = [t for t in fig.data if t.name == "peak"]
    assert peak.x[0] == facts.peak.seq


def test_segment_map_draws_each_segment_to_its_size():
    raw = fragmented_snapshot(tensors=10, tensor_bytes=4 * MIB)
    fig = segment_map_figure(_facts(raw))
    drawn: dict[str, float] = {}
    for trace in fig.data:
        for y, x in zip(trace.y, trace.x, strict=True):
            drawn[y] = drawn.get(y, 0.0) + x
    assert drawn == {"segment 0": raw["segments"][0]["total_size"] / MIB}
    assert {t.name for t in fig.data} == {"active_allocated", "inactive"}


def test_categories_figure_matches_the_table():
    facts = _facts(training_snapshot())
    (bar,) = categories_figure(facts).data
    got = dict(zip(bar.x, bar.y, strict=True))
    assert got["optimizer_state"] == 128.0 and got["parameters"] == 64.0


def test_memory_view_tables():
    facts = _facts(training_snapshot())
    result = SimpleNamespace(snapshot=facts, snapshot_growth=None, summary={})
    view = memory_view(result)
    assert view.sites_title == "at the peak"
    assert view.sites["MiB"].to_list()[0] == 128.0
    assert view.sites.columns[:3] == ["site", "MiB", "blocks"]
    assert view.categories.filter(pl.col("category") == "activations")["MiB"][0] == 32.0
    assert [label for label, _ in view.figures] == ["Timeline", "Categories", "Segment map"]
    assert memory_view(SimpleNamespace(snapshot=None)) is None
