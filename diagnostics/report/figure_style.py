"""Shared look and helpers of every report figure: sizes, titles, escaping, thinning."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import plotly.graph_objects as go
import polars as pl

MIB = 1024 * 1024


# Charts with more points than this are thinned by an even stride: a 100k-step run would
# otherwise put megabytes of JSON into each report figure without showing more detail.
MAX_POINTS = 5000


# Labels longer than this are shortened on the axis; the full (escaped) text stays in the hover.
MAX_LABEL_CHARS = 60

# One colour per category in every figure (run charts, trace charts, findings' evidence, the
# drill-down): data wait is red wherever it is drawn. torch-tb-profiler's palette.
CATEGORY_COLOURS = {
    "data wait": "#d62728",
    "copy": "#9467bd",
    "compute": "#1f77b4",
    "optimizer": "#2ca02c",
    "CPU": "#2ca02c",
    "runtime": "#ff7f0e",
    "memset": "#8c564b",
    "communication": "#e377c2",
    "sync": "#bcbd22",
    "other": "#7f7f7f",
}
# a series' or legend entry's name (lower case, its "(unit)" left off) -> its category
_CATEGORY_OF = {
    "data wait": "data wait",
    "dataloader": "data wait",
    "host→device copy": "copy",
    "h2d": "copy",
    "memcpy": "copy",
    "copy time": "copy",
    "forward + backward": "compute",
    "kernel": "compute",
    "optimizer": "optimizer",
    "cpu exec": "CPU",
    "cpu operator": "CPU",
    "cuda runtime": "runtime",
    "memset": "memset",
    "collective": "communication",
    "runtime": "runtime",
    "exposed": "communication",
    "sync": "sync",
    "rest of step": "other",
    "other": "other",
}


def category_colour(name: str) -> str | None:
    """The colour of the category a series is named for ('data wait (ms)' -> red); None
    for a name of no category (plotly's own sequence then)."""
    key = name.strip().lower()
    if key.endswith(")") and " (" in key:
        key = key[: key.rindex(" (")]
    category = _CATEGORY_OF.get(key)
    return CATEGORY_COLOURS[category] if category is not None else None


def safe_text(value: object, max_chars: int | None = None) -> str:
    """Escape a string from a trace or run for a plotly label, optionally shortened."""
    text = str(value)
    if max_chars is not None and len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return html.escape(text, quote=True)


def layout(fig: go.Figure, title: str, x_title: str, y_title: str, height: int = 380) -> None:
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"},
        template="plotly_white",
        height=height,
        margin={"l": 60, "r": 20, "t": 70, "b": 50},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0.0},
        hovermode="x unified",
        font={"size": 12},
        showlegend=True,
    )
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title)


def empty_figure(title: str, message: str, x_title: str = "", y_title: str = "") -> go.Figure:
    fig = go.Figure()
    layout(fig, title, x_title, y_title, height=260)
    fig.add_annotation(
        text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5, font={"size": 14}
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def thin(frame: pl.DataFrame, max_points: int = MAX_POINTS) -> pl.DataFrame:
    if frame.height <= max_points:
        return frame
    stride = math.ceil(frame.height / max_points)
    return frame.gather_every(stride)


def has_values(frame: pl.DataFrame | None, column: str) -> bool:
    return frame is not None and column in frame.columns and frame[column].null_count() < len(frame)


def column_values(frame: pl.DataFrame, column: str, scale: float = 1.0) -> list[float | None]:
    series = frame[column].cast(pl.Float64)
    if scale != 1.0:
        series = series / scale
    return series.to_list()


def figure_titles(fig: go.Figure) -> tuple[str, str, str]:
    """(title, x axis title, y axis title) of a figure, for tests and accessibility text."""
    layout = fig.layout
    return (
        layout.title.text or "",
        layout.xaxis.title.text or "",
        layout.yaxis.title.text or "",
    )


def series_names(fig: go.Figure) -> Sequence[str]:
    return [trace.name for trace in fig.data if trace.name]


def integer_axis(fig: go.Figure, values: Sequence[object], axis: str = "x") -> None:
    """Whole-number ticks for an axis of steps or ranks: plotly would otherwise put ticks at
    -0.5, 0.5, 1.5 for two ranks. At most about ten ticks, each on an integer."""
    numbers = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    if not numbers or len(numbers) != len(values):
        return
    low, high = min(numbers), max(numbers)
    dtick = max(1, math.ceil((high - low) / 10))
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(tickmode="linear", tick0=low, dtick=dtick, tickformat="d")
