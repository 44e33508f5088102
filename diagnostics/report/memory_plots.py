"""Plotly figures of a memory snapshot (no streamlit): the timeline with its peak, the
categories at the peak, and the segment map. Units on every axis: MiB, s."""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl

from diagnostics.report.figure_style import MAX_POINTS, MIB, empty_figure, layout, safe_text
from diagnostics.snapshot.analysis import SnapshotFacts

STATE_COLOURS = {
    "active_allocated": "#1f77b4",
    "active_awaiting_free": "#ff7f0e",
    "inactive": "#d3d3d3",
}
# segments drawn in the map, largest first: a snapshot may hold thousands
MAX_SEGMENTS = 60


def _thinned(timeline: pl.DataFrame, keep_seq: int | None) -> pl.DataFrame:
    """At most MAX_POINTS rows by bucket maximum of allocated (a spike survives), the
    peak's row always kept."""
    if timeline.height <= MAX_POINTS:
        return timeline
    size = -(-timeline.height // MAX_POINTS)
    bucketed = (
        timeline.with_row_index("_i")
        .with_columns((pl.col("_i") // size).alias("_bucket"))
        .sort(["_bucket", "allocated_bytes"], descending=[False, True])
        .group_by("_bucket", maintain_order=True)
        .first()
    )
    if keep_seq is not None:
        peak = timeline.filter(pl.col("seq") == keep_seq)
        bucketed = pl.concat([bucketed.drop("_i", "_bucket"), peak]).unique("seq")
        return bucketed.sort("seq")
    return bucketed.drop("_i", "_bucket").sort("seq")


def memory_timeline_figure(facts: SnapshotFacts) -> go.Figure:
    title = "Memory over the recorded window"
    timeline = facts.timeline
    if timeline.height == 0:
        return empty_figure(
            title, "No trace entries: recorded without _record_memory_history", "s", "MiB"
        )
    timed = timeline["time_s"].null_count() == 0
    x_col, x_title = (
        ("time_s", "time since the first entry (s)")
        if timed
        else ("seq", "trace entry (no time_us in this snapshot)")
    )
    peak = facts.peak
    frame = _thinned(timeline, peak.seq if peak else None)
    x = frame[x_col].to_list()
    fig = go.Figure()
    for column, label, colour in (
        ("allocated_bytes", "allocated", "#1f77b4"),
        ("reserved_bytes", "reserved", "#aec7e8"),
    ):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=(frame[column].cast(pl.Float64) / MIB).to_list(),
                mode="lines",
                name=label,
                line={"color": colour, "shape": "hv"},
                hovertemplate="%{y:,.1f} MiB",
            )
        )
    if peak is not None:
        px = peak.time_s if timed else peak.seq
        fig.add_trace(
            go.Scatter(
                x=[px],
                y=[peak.allocated_bytes / MIB],
                mode="markers+text",
                name="peak",
                marker={"color": "#d62728", "size": 10, "symbol": "diamond"},
                text=[f"peak {peak.allocated_bytes / MIB:,.1f} MiB"],
                textposition="top center",
                hovertemplate="peak %{y:,.1f} MiB",
            )
        )
    if facts.oom is not None:
        ox = facts.oom.time_s if timed else facts.oom.seq
        fig.add_vline(
            x=ox, line={"color": "#d62728", "dash": "dash"}, annotation_text="out of memory"
        )
    layout(fig, title, x_title, "memory (MiB)")
    return fig


def categories_figure(facts: SnapshotFacts) -> go.Figure:
    at_peak = facts.peak is not None
    table = facts.categories_at_peak if at_peak else facts.categories_at_dump
    title = "What held the peak" if at_peak else "What was held at dump time"
    if table.height == 0 or int(table["bytes"].sum() or 0) == 0:
        return empty_figure(title, "Nothing live", "category", "MiB")
    fig = go.Figure(
        go.Bar(
            x=table["category"].to_list(),
            y=(table["bytes"].cast(pl.Float64) / MIB).to_list(),
            marker={"color": "#1f77b4"},
            hovertemplate="%{x}: %{y:,.1f} MiB",
            name="MiB",
        )
    )
    layout(fig, title, "category (inferred; docs/MEMORY.md)", "memory (MiB)", height=320)
    fig.update_layout(showlegend=False)
    return fig


def segment_map_figure(facts: SnapshotFacts) -> go.Figure:
    """Each segment a row, its blocks laid along it by offset, coloured by state."""
    title = "Segments at dump time: blocks by state"
    blocks = facts.segment_map
    if blocks.height == 0:
        return empty_figure(title, "No segments", "offset in segment (MiB)", "segment")
    sizes = blocks.group_by("segment").agg(pl.col("size").sum().alias("total"))
    shown = sizes.sort(["total", "segment"], descending=[True, False]).head(MAX_SEGMENTS)
    order = {seg: i for i, seg in enumerate(shown["segment"].to_list())}
    drawn = blocks.filter(pl.col("segment").is_in(list(order)))
    fig = go.Figure()
    for state, colour in STATE_COLOURS.items():
        part = drawn.filter(pl.col("state") == state)
        if part.height == 0:
            continue
        fig.add_trace(
            go.Bar(
                y=[f"segment {s}" for s in part["segment"].to_list()],
                x=(part["size"].cast(pl.Float64) / MIB).to_list(),
                base=(part["offset"].cast(pl.Float64) / MIB).to_list(),
                orientation="h",
                name=state,
                marker={"color": colour, "line": {"color": "white", "width": 0.5}},
                customdata=[safe_text(s or "", 80) for s in part["site"].to_list()],
                hovertemplate="%{x:,.2f} MiB at %{base:,.2f} MiB<br>%{customdata}",
            )
        )
    note = f" (largest {MAX_SEGMENTS} of {sizes.height})" if sizes.height > MAX_SEGMENTS else ""
    layout(
        fig,
        title + note,
        "offset in segment (MiB)",
        "segment",
        height=max(300, 22 * len(order) + 120),
    )
    fig.update_layout(barmode="overlay", hovermode="closest")
    fig.update_yaxes(categoryorder="array", categoryarray=[f"segment {s}" for s in order][::-1])
    return fig
