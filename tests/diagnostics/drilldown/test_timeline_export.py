"""Timeline (merged lanes, idle gaps) and Export (a step as Chrome-trace JSON) on real traces."""

from __future__ import annotations

import json
import re

import polars as pl
import pytest

from diagnostics.drilldown.timeline import _thread_label, step_timeline, step_window
from diagnostics.report.drill_plots import timeline_figure
from diagnostics.trace.loader import load_trace_file


def test_every_event_of_the_step_is_in_exactly_one_segment(large_drill):
    step = large_drill.step_ids[2]
    timeline = large_drill.timeline(step)
    assert timeline.events > 10_000  # a large step: the merge has work to do
    assert int(timeline.segments["events"].sum()) == timeline.events
    assert timeline.segments.height < timeline.events / 10
    assert set(timeline.segments["lane"]) <= set(timeline.lanes)
    assert {"kernel", "collective", "runtime", "operator", "memcpy"} <= set(
        timeline.segments["kind"]
    )
    span = timeline.span_ms
    assert (timeline.segments["start_ms"] >= 0).all()
    assert (timeline.segments["end_ms"] <= span + 1e-9).all()


def test_lanes_are_cpu_threads_then_gpu_streams_then_idle(large_drill):
    lanes = large_drill.timeline(large_drill.step_ids[0]).lanes
    assert lanes[0].startswith("CPU")
    assert lanes[-1] == "GPU 1 · idle"
    assert [lane for lane in lanes if lane.startswith("GPU 1 · stream")] == [
        "GPU 1 · stream 7",
        "GPU 1 · stream 14",
    ]


def test_a_cpu_lane_names_its_thread_id_once(large_drill):
    lanes = large_drill.timeline(large_drill.step_ids[0]).lanes
    cpu = [lane for lane in lanes if lane.startswith("CPU")]
    # Kineto's thread_name already holds the id: "thread 783658 (python3.8)"
    assert "CPU · thread 783658 (python3.8)" in cpu
    for lane in cpu:
        ids = re.findall(r"\d{3,}", lane)
        assert len(ids) == len(set(ids)) == 1, lane


def test_a_thread_name_without_its_id_gets_it_appended():
    assert _thread_label("python", 42) == "python (42)"
    assert _thread_label("thread 420 (python)", 42) == "thread 420 (python) (42)"
    assert _thread_label("", 42) == "thread 42"


def test_segment_cap_raises_the_merge_tolerance(large_drill):
    step = large_drill.step_ids[2]
    default = large_drill.timeline(step)
    capped = step_timeline(large_drill.trace.events, large_drill.steps, step, max_segments=100)
    assert capped.segments.height <= 100
    assert capped.tolerance_us > default.tolerance_us
    assert int(capped.segments["events"].sum()) == default.events


def test_idle_gaps_overlap_no_gpu_work(large_drill):
    step = large_drill.step_ids[2]
    timeline = large_drill.timeline(step)
    assert timeline.gaps.height > 0
    start_us = timeline.start_us
    gpu = large_drill.trace.events.filter(
        pl.col("cat").is_in(["kernel", "gpu_memcpy", "gpu_memset"])
    ).select(
        ((pl.col("ts") - start_us) / 1000).alias("s"),
        ((pl.col("ts") + pl.col("dur") - start_us) / 1000).alias("e"),
    )
    for _, gap_start, gap_end in timeline.gaps.iter_rows():
        inside = gpu.filter((pl.col("s") < gap_end - 1e-6) & (pl.col("e") > gap_start + 1e-6))
        assert inside.height == 0, (gap_start, gap_end)


def test_unknown_step_is_a_clear_error(large_drill):
    with pytest.raises(ValueError, match="step 999 is not in the trace"):
        large_drill.timeline(999)


def test_timeline_figure_is_one_line_trace_per_kind(large_drill):
    timeline = large_drill.timeline(large_drill.step_ids[2])
    fig = timeline_figure(timeline)
    assert {trace.type for trace in fig.data} == {"scatter"}
    segments = timeline.segments.height + timeline.gaps.height
    assert sum(len(trace.x) for trace in fig.data) == 3 * segments  # x0, x1, None each
    names = [trace.name for trace in fig.data]
    assert len(names) == len(set(names)) and "GPU idle" in names
    assert not fig.layout.shapes  # no SVG shapes: their count would grow with the trace


def test_exported_step_reloads_with_the_same_events(large_drill, tmp_path):
    step = large_drill.step_ids[1]
    start_us, end_us = step_window(large_drill.steps, step)
    data = large_drill.step_export(step)
    document = json.loads(data)  # plain JSON, as Perfetto and chrome://tracing read it
    assert document["deviceProperties"] and document["distributedInfo"]["rank"] == 1
    path = tmp_path / "step.json"
    path.write_bytes(data)
    reloaded = load_trace_file(path)
    events = large_drill.trace.events
    expected = events.filter(
        (pl.col("ts") <= end_us)
        & (pl.col("ts") + pl.col("dur").fill_null(0.0) >= start_us)
        & pl.col("ph").is_in(["X", "i", "I"])
    )
    assert reloaded.events.height == expected.height
    by_cat = dict(reloaded.events.group_by("cat").len().iter_rows())
    assert by_cat == dict(expected.group_by("cat").len().iter_rows())
    # the launch -> kernel arrows come along, and the ranks' metadata
    assert reloaded.flows.filter(pl.col("cat") == "ac2g").height > 0
    assert reloaded.metadata.rank == 1


def test_exported_shapes_survive_the_round_trip(h200_drill, tmp_path):
    step = h200_drill.step_ids[0]
    path = tmp_path / "step.json"
    path.write_bytes(h200_drill.step_export(step))
    shapes = load_trace_file(path).events.filter(pl.col("input_shapes").is_not_null())
    assert shapes.height > 100
    mm = shapes.filter(pl.col("name") == "aten::mm")["input_shapes"].to_list()
    assert all(json.loads(s) and isinstance(json.loads(s), list) for s in mm)
