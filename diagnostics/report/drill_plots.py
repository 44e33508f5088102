"""Plotly figures of the drill-down views (diagnostics.drilldown): no streamlit here.

The timeline draws each kind of event as one line trace whose segments are separated by
gaps in the data (x0, x1, None, ...): one SVG path per kind, however many segments, where
layout shapes would be one SVG element each. (WebGL traces were tried: headless Chromium
without a GPU placed them off their lanes.)
"""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl

from diagnostics.drilldown.timeline import Timeline
from diagnostics.report import plots
from diagnostics.report.figure_style import category_colour, empty_figure, layout, safe_text

# the categories' colours, the same as in every other figure (figure_style.CATEGORY_COLOURS)
OVERVIEW_COLOURS = {
    name: category_colour(name) or "#7f7f7f"
    for name in ("Kernel", "Memcpy", "Memset", "Runtime", "DataLoader", "CPU exec", "Other")
}
KIND_STYLE: dict[str, tuple[str, str]] = {
    kind: (label, category_colour(label) or "#7f7f7f")
    for kind, label in (
        ("operator", "CPU operator"),
        ("dataloader", "DataLoader"),
        ("runtime", "CUDA runtime"),
        ("kernel", "kernel"),
        ("collective", "collective (NCCL)"),
        ("memcpy", "memcpy"),
        ("memset", "memset"),
        ("sync", "sync"),
    )
}
# Runtime calls run inside operators on the same thread: drawn as a thinner bar in the
# lower half of the lane so the operator under them stays visible.
KIND_OFFSET = {"runtime": 0.22}
KIND_WIDTH_PX = {"runtime": 6}
IDLE_COLOUR = "rgba(214, 39, 40, 0.45)"
# Curves that never reach this are drawn as 0.0 MiB by the hover's one decimal: hidden.
NEGLIGIBLE_MIB = 0.05
LANE_PX = 30
BAR_PX = 16


def overview_figure(overview: pl.DataFrame) -> go.Figure:
    """The average step as a donut: each category's mean ms and share."""
    title = "Profiled steps only: the average step by category"
    if overview.height == 0 or float(overview["mean_ms"].sum()) <= 0:
        return empty_figure(title, "No profiler steps in the trace")
    rows = overview.filter(pl.col("mean_ms") > 0)
    fig = go.Figure(
        go.Pie(
            labels=rows["category"].to_list(),
            values=rows["mean_ms"].to_list(),
            hole=0.45,
            sort=False,
            marker={"colors": [OVERVIEW_COLOURS.get(c, "#7f7f7f") for c in rows["category"]]},
            texttemplate="%{label}<br>%{percent:.1%}",
            hovertemplate="%{label}: %{value:.2f} ms (%{percent:.1%})<extra></extra>",
        )
    )
    layout(fig, title, "", "")
    fig.update_layout(hovermode="closest", legend={"orientation": "v", "x": 1.0, "y": 1.0})
    return fig


def steps_figure(breakdown: pl.DataFrame) -> go.Figure:
    """The per-step bars beside the donut. The column is narrow, so the seven categories'
    legend wraps to two or three rows: above the plot (the report's place for it) it would
    climb over the title, so here it goes below the axis."""
    fig = plots.breakdown_figure(breakdown)
    if not fig.data:
        return fig
    fig.update_layout(
        height=460,
        margin={"t": 50, "b": 150},
        legend={"orientation": "h", "yanchor": "top", "y": -0.25, "x": 0.0},
    )
    return fig


def _visible(values: pl.Series) -> bool:
    """Whether a memory curve shows anything: a flat line at 0 MiB (a host the allocator
    barely used, a reserved column a trace fills with zeros) only adds a "peak 0 MiB"."""
    top = values.drop_nulls().max()
    return top is not None and float(top) >= NEGLIGIBLE_MIB


def memory_curve_figure(curve: pl.DataFrame, peaks: pl.DataFrame) -> go.Figure:
    """Allocated and reserved memory over the trace, per device, with each peak marked."""
    title = "Allocator memory over the trace"
    if curve.height == 0:
        return empty_figure(
            title,
            "No [memory] events: record with torch.profiler(profile_memory=True)",
            "time (ms)",
            "memory (MiB)",
        )
    fig = go.Figure()
    shown: list[int] = []
    for device in sorted(curve["device"].unique().to_list()):
        rows = curve.filter(pl.col("device") == device)
        where = "host" if device == -1 else f"GPU {device}"
        if _visible(rows["allocated_mib"]):
            shown.append(device)  # the peak markers are of allocated memory
        for column, kind, line in (
            ("allocated_mib", "allocated", {"shape": "hv"}),
            ("reserved_mib", "reserved", {"shape": "hv", "dash": "dot"}),
        ):
            if _visible(rows[column]):
                fig.add_trace(
                    go.Scattergl(
                        x=rows["time_ms"].to_list(),
                        y=rows[column].to_list(),
                        name=f"{where} {kind}",
                        mode="lines",
                        line=line,
                        hovertemplate="%{y:,.1f} MiB at %{x:,.1f} ms",
                    )
                )
    if not fig.data:
        return empty_figure(
            title,
            f"The allocator held under {NEGLIGIBLE_MIB} MiB throughout",
            "time (ms)",
            "memory (MiB)",
        )
    peaks = peaks.filter(pl.col("device").is_in(shown))
    if peaks.height:
        fig.add_trace(
            go.Scatter(
                x=peaks["time_ms"].to_list(),
                y=peaks["allocated_mib"].to_list(),
                name="peak allocated",
                mode="markers+text",
                marker={"symbol": "triangle-down", "size": 12, "color": "#d62728"},
                text=[f"peak {v:,.0f} MiB" for v in peaks["allocated_mib"].to_list()],
                textposition="top center",
                hovertemplate="peak %{y:,.1f} MiB at %{x:,.1f} ms",
            )
        )
    layout(fig, title, "time since the trace's start (ms)", "memory (MiB)")
    fig.update_yaxes(rangemode="tozero")
    return fig


def _segments_xy(
    frame: pl.DataFrame, lane_y: dict[str, int], min_width_ms: float, offset: float = 0.0
) -> tuple[list, list, list]:
    """Segments as one polyline with None breaks: x0,x1,None / y,y,None / hover text."""
    xs: list[float | None] = []
    ys: list[int | None] = []
    texts: list[str | None] = []
    for lane, start, end, events, busy, label in frame.select(
        "lane", "start_ms", "end_ms", "events", "busy_ms", "label"
    ).iter_rows():
        y = lane_y[lane] + offset
        end = max(end, start + min_width_ms)
        text = (
            f"{safe_text(label, 80)}<br>{end - start:.3f} ms"
            if events == 1
            else f"{events} events, {busy:.3f} ms busy over {end - start:.3f} ms<br>"
            f"longest: {safe_text(label, 80)}"
        )
        xs += [start, end, None]
        ys += [y, y, None]
        texts += [text, text, None]
    return xs, ys, texts


def timeline_figure(timeline: Timeline) -> go.Figure:
    """CPU threads and GPU streams as lanes; segments coloured by kind; GPU idle in red."""
    title = f"Step {timeline.step}: {timeline.span_ms:,.1f} ms"
    if not timeline.lanes:
        return empty_figure(title, "No events in this step")
    lane_y = {lane: i for i, lane in enumerate(timeline.lanes)}
    min_width_ms = timeline.tolerance_us / 1000.0
    fig = go.Figure()
    for kind, (label, colour) in KIND_STYLE.items():
        rows = timeline.segments.filter(pl.col("kind") == kind)
        if rows.height == 0:
            continue
        xs, ys, texts = _segments_xy(rows, lane_y, min_width_ms, KIND_OFFSET.get(kind, 0.0))
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                text=texts,
                mode="lines",
                name=label,
                line={"color": colour, "width": KIND_WIDTH_PX.get(kind, BAR_PX)},
                hoverinfo="text",
                connectgaps=False,
            )
        )
    if timeline.gaps.height:
        xs, ys, texts = [], [], []
        for lane, start, end in timeline.gaps.select("lane", "start_ms", "end_ms").iter_rows():
            text = f"GPU idle {end - start:.3f} ms"
            xs += [start, end, None]
            ys += [lane_y[lane], lane_y[lane], None]
            texts += [text, text, None]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                text=texts,
                mode="lines",
                name="GPU idle",
                line={"color": IDLE_COLOUR, "width": BAR_PX},
                hoverinfo="text",
                connectgaps=False,
            )
        )
    height = 120 + LANE_PX * len(timeline.lanes)
    layout(fig, title, "time since the step's start (ms)", "", height=max(height, 260))
    fig.update_layout(hovermode="closest", margin={"l": 230})
    fig.update_yaxes(
        tickmode="array",
        tickvals=list(lane_y.values()),
        ticktext=[safe_text(lane, 40) for lane in lane_y],
        autorange="reversed",
        showgrid=False,
        zeroline=False,
    )
    fig.update_xaxes(range=[0, timeline.span_ms])
    return fig
