"""``finding_figure``: draws a finding's ``evidence["chart"]``, a :class:`diagnostics.chart.Chart`.

The chart was validated when the rule built it, so nothing here second-guesses its shape.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from diagnostics.chart import Chart
from diagnostics.report.figure_style import (
    MAX_LABEL_CHARS,
    category_colour,
    integer_axis,
    layout,
    safe_text,
)

HIGHLIGHT_NAME = "highlighted"


def _shown(value: Any) -> Any:
    return safe_text(value) if isinstance(value, str) else value


def finding_figure(finding: Any) -> go.Figure | None:
    """The figure of ``finding.evidence["chart"]``; ``None`` when the finding has no chart or
    its chart has no points."""
    chart = (getattr(finding, "evidence", None) or {}).get("chart")
    if not isinstance(chart, Chart) or not chart.x:
        return None
    x_values = [_shown(v) for v in chart.x]
    fig = go.Figure()
    for name, values in chart.series.items():
        label = safe_text(name, MAX_LABEL_CHARS)
        colour = category_colour(name)  # data wait is red here as in the step-time chart
        if chart.kind == "line":
            line = {"color": colour} if colour else None
            fig.add_trace(
                go.Scatter(x=x_values, y=list(values), mode="lines", name=label, line=line)
            )
        else:
            fig.add_trace(go.Bar(x=x_values, y=list(values), name=label, marker_color=colour))
    first = dict(zip(chart.x, next(iter(chart.series.values())), strict=True))
    # a marked x that downsampling left out of the chart has no point to mark
    marked = [v for v in chart.highlight_x if v in first]
    if marked:
        fig.add_trace(
            go.Scatter(
                x=[_shown(v) for v in marked],
                y=[first[v] for v in marked],
                mode="markers",
                name=HIGHLIGHT_NAME,
                marker={"color": "#d62728", "size": 10, "symbol": "x"},
            )
        )
    layout(
        fig, safe_text(chart.title), safe_text(chart.x_label), safe_text(chart.y_label), height=340
    )
    if chart.kind == "bar":
        fig.update_layout(barmode="group")
    integer_axis(fig, list(chart.x))  # steps and ranks are whole numbers
    return fig
