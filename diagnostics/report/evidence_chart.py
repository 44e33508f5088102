"""``finding_figure``: draws a finding's ``evidence["chart"]``.

The convention it reads is written in ``diagnostics/report/plots.py``'s docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from diagnostics.report.figure_style import MAX_LABEL_CHARS, integer_axis, layout, safe_text

CHART_KINDS = frozenset({"line", "bar"})


def _is_number_list(values: Any, length: int) -> bool:
    return (
        isinstance(values, list | tuple)
        and len(values) == length
        and all(
            v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in values
        )
    )


def finding_figure(finding: Any) -> go.Figure | None:
    """The chart in ``finding.evidence["chart"]`` (see the module docstring), or ``None``."""
    evidence = getattr(finding, "evidence", None)
    if isinstance(finding, Mapping):
        evidence = finding.get("evidence")
    if not isinstance(evidence, Mapping):
        return None
    chart = evidence.get("chart")
    if not isinstance(chart, Mapping) or chart.get("kind") not in CHART_KINDS:
        return None
    x = chart.get("x")
    series = chart.get("series", chart.get("y"))
    if not isinstance(x, list | tuple) or not x or not isinstance(series, Mapping) or not series:
        return None
    if not all(isinstance(v, int | float | str) and not isinstance(v, bool) for v in x):
        return None
    if not all(_is_number_list(values, len(x)) for values in series.values()):
        return None
    x_values = [safe_text(v) if isinstance(v, str) else v for v in x]
    horizontal = bool(chart.get("horizontal")) and chart["kind"] == "bar"
    fig = go.Figure()
    for name, values in series.items():
        label = safe_text(name, MAX_LABEL_CHARS)
        if chart["kind"] == "line":
            fig.add_trace(go.Scatter(x=x_values, y=list(values), mode="lines", name=label))
        elif horizontal:
            fig.add_trace(go.Bar(x=list(values), y=x_values, orientation="h", name=label))
        else:
            fig.add_trace(go.Bar(x=x_values, y=list(values), name=label))
    markers = chart.get("markers")
    highlight = chart.get("highlight_x")
    marker_label = "highlighted"
    if not isinstance(highlight, list | tuple) and isinstance(markers, Mapping):
        highlight = markers.get("x")
        marker_label = str(markers.get("label", marker_label))
    if isinstance(highlight, list | tuple) and highlight:
        first = list(series.values())[0]
        lookup = dict(zip(x, first, strict=True))
        marked = [v for v in highlight if isinstance(v, int | float | str) and v in lookup]
        if marked:
            fig.add_trace(
                go.Scatter(
                    x=[safe_text(v) if isinstance(v, str) else v for v in marked],
                    y=[lookup[v] for v in marked],
                    mode="markers",
                    name=safe_text(marker_label, MAX_LABEL_CHARS),
                    marker={"color": "#d62728", "size": 10, "symbol": "x"},
                )
            )
    hlines = chart.get("hlines")
    if isinstance(hlines, list | tuple):
        for line in hlines:
            if isinstance(line, Mapping) and isinstance(line.get("y"), int | float):
                fig.add_hline(
                    y=float(line["y"]),
                    line_dash="dot",
                    line_color="#7f7f7f",
                    annotation_text=safe_text(line.get("label", ""), MAX_LABEL_CHARS),
                )
    x_title = safe_text(chart.get("x_label", chart.get("x_title", "")))
    y_title = safe_text(chart.get("y_label", chart.get("y_title", "")))
    if horizontal:
        x_title, y_title = y_title, x_title
    layout(fig, safe_text(chart.get("title", "Evidence")), x_title, y_title, height=340)
    if chart["kind"] == "bar":
        fig.update_layout(barmode="stack" if chart.get("stacked") else "group")
    if chart.get("log_y"):
        if horizontal:
            fig.update_xaxes(type="log")
        else:
            fig.update_yaxes(type="log")
    if horizontal:
        fig.update_yaxes(automargin=True, type="category")
        fig.update_layout(hovermode="closest")
    else:
        integer_axis(fig, list(x))  # steps and ranks are whole numbers
    return fig
