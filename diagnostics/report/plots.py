"""Plotly figures for the app and the reports, built from the documented frame columns.

Every figure has a title and axis titles with units, and takes polars frames with the
columns of ``diagnostics.runs.STEP_SCHEMA`` / ``SAMPLE_SCHEMA`` or of the ``TraceFacts``
frames. Nothing here imports streamlit or fetches anything from the network: the app passes
the figures to ``st.plotly_chart``, the HTML report inlines plotly's JavaScript once.

Every string that comes from a trace or a run (op and kernel names, series names, titles
in a finding's evidence) goes through :func:`safe_text` before it reaches plotly: plotly
renders a subset of HTML in labels, so markup is escaped and shown literally. Plotly turns
the entities back into characters with ``textContent``, so nothing in a name can run.

A finding's evidence chart (a :class:`diagnostics.chart.Chart`, contract in
``docs/CHARTS.md``) is drawn by :func:`finding_figure`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from diagnostics.metrics import PEAK_MEMORY_NAMES, steady_steps
from diagnostics.report.evidence_chart import finding_figure
from diagnostics.report.figure_style import (
    MAX_LABEL_CHARS,
    MAX_POINTS,
    MIB,
    category_colour,
    column_values,
    empty_figure,
    figure_titles,
    has_values,
    integer_axis,
    layout,
    safe_text,
    series_names,
    thin,
)
from diagnostics.report.fmt import ms as fmt_ms

__all__ = [
    "MAX_POINTS",
    "MIB",
    "breakdown_figure",
    "compare_steps_figure",
    "figure_titles",
    "finding_figure",
    "loss_gradnorm_figure",
    "memory_figure",
    "safe_text",
    "series_names",
    "step_time_figure",
    "system_figure",
    "top_figure",
]


def _parts(*parts: tuple[str, str]) -> tuple[tuple[str, str, str], ...]:
    """(column, label, the label's category colour)."""
    return tuple((column, label, category_colour(label) or "#7f7f7f") for column, label in parts)


STEP_PARTS = _parts(
    ("data_wait_ms", "data wait"),
    ("h2d_ms", "host→device copy"),
    ("compute_ms", "forward + backward"),
    ("optimizer_ms", "optimizer"),
)
BREAKDOWN_PARTS = _parts(
    ("kernel_us", "kernel"),
    ("memcpy_us", "memcpy"),
    ("memset_us", "memset"),
    ("runtime_us", "CUDA runtime"),
    ("dataloader_us", "DataLoader"),
    ("cpu_exec_us", "CPU exec"),
    ("other_us", "other"),
)


# a warm-up step this many times the steady steps' highest would flatten them: it is cut
WARM_UP_CUT_RATIO = 1.5
WARM_UP_FILL = "rgba(127, 127, 127, 0.15)"


def _warm_up_and_top(steps: pl.DataFrame) -> tuple[pl.DataFrame, float | None]:
    """The steps the statistics leave out (each phase's first: metrics.steady_steps), and
    the highest steady step time."""
    timed = steps.filter(pl.col("step_time_ms").is_not_null() & pl.col("step").is_not_null())
    steady = steady_steps(timed)
    top = steady["step_time_ms"].max()
    return timed.join(steady.select("step"), on="step", how="anti"), (
        float(top) if top is not None else None
    )


def _mark_warm_up(fig: go.Figure, runs: Sequence[pl.DataFrame]) -> None:
    """Shades the warm-up steps, which the statistics leave out, and keeps the y axis to the
    steady steps' scale when a warm-up step would dwarf them (a 3 s first step beside 74 ms
    waits): the cut bar is labelled with its time."""
    frames = [s for s in runs if s is not None and s.height and "step_time_ms" in s.columns]
    if not frames:
        return
    warm, tops = zip(*(_warm_up_and_top(s) for s in frames), strict=True)
    for step in sorted({int(v) for w in warm for v in w["step"].to_list()}):
        fig.add_vrect(
            x0=step - 0.5, x1=step + 0.5, fillcolor=WARM_UP_FILL, line_width=0, layer="below"
        )
    top = max((t for t in tops if t is not None), default=None)
    if top is None or top <= 0:
        return
    cut = pl.concat([w.select("step", "step_time_ms") for w in warm]).filter(
        pl.col("step_time_ms") > WARM_UP_CUT_RATIO * top
    )
    if cut.height == 0:
        return
    ceiling = 1.25 * top
    fig.update_yaxes(range=[0.0, ceiling])
    for step, value in cut.iter_rows():
        fig.add_annotation(
            x=step,
            y=ceiling,
            yanchor="top",
            text=f"warm-up ↑ {fmt_ms(value)}",
            showarrow=False,
            font={"size": 11, "color": "#555555"},
            bgcolor="rgba(255, 255, 255, 0.8)",
        )


def _step_axis(steps: pl.DataFrame) -> pl.DataFrame:
    return steps.filter(pl.col("step").is_not_null()).sort("step")


def step_time_figure(steps: pl.DataFrame) -> go.Figure:
    """Per-step time stacked as data wait, host→device copy, compute and optimizer (ms).

    The remainder of ``step_time_ms`` that none of the parts covers (logging, checkpoints,
    synchronisation) is drawn as "other" when it is positive, so the bars add up to the
    measured step time.
    """
    title = "Step time breakdown"
    if steps is None or steps.height == 0 or "step" not in steps.columns:
        return empty_figure(title, "No step records", "step", "time (ms)")
    frame = thin(_step_axis(steps))
    x = frame["step"].to_list()
    fig = go.Figure()
    parts_sum = pl.Series([0.0] * frame.height)
    for column, label, colour in STEP_PARTS:
        if not has_values(frame, column):
            continue
        values = frame[column].cast(pl.Float64).fill_null(0.0)
        parts_sum = parts_sum + values
        fig.add_trace(
            go.Bar(
                x=x,
                y=values.to_list(),
                name=label,
                marker_color=colour,
                hovertemplate="%{y:.1f} ms",
            )
        )
    if has_values(frame, "step_time_ms"):
        other = (frame["step_time_ms"].cast(pl.Float64).fill_null(0.0) - parts_sum).clip(
            lower_bound=0.0
        )
        if float(other.sum()) > 0.0:
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=other.to_list(),
                    name="other",
                    marker_color="#7f7f7f",
                    hovertemplate="%{y:.1f} ms",
                )
            )
    if not fig.data:
        return empty_figure(title, "No step timings recorded", "step", "time (ms)")
    layout(fig, title, "step", "time per step (ms)")
    fig.update_layout(barmode="stack", bargap=0.05)
    integer_axis(fig, x)
    _mark_warm_up(fig, [steps])
    return fig


def loss_gradnorm_figure(steps: pl.DataFrame, spike_steps: Iterable[int] = ()) -> go.Figure:
    """Loss (top) and gradient norm before clipping (bottom) per step, spikes marked."""
    title = "Loss and gradient norm"
    if steps is None or steps.height == 0 or "step" not in steps.columns:
        return empty_figure(title, "No step records", "step", "")
    frame = thin(_step_axis(steps))
    spikes = sorted({int(s) for s in spike_steps})
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=("loss", "gradient norm (L2, before clipping)"),
    )
    for row, column, colour in ((1, "loss", "#1f77b4"), (2, "grad_norm", "#ff7f0e")):
        if not has_values(frame, column):
            continue
        fig.add_trace(
            go.Scatter(
                x=frame["step"].to_list(),
                y=column_values(frame, column),
                mode="lines",
                name=column.replace("_", " "),
                line={"color": colour, "width": 1.5},
            ),
            row=row,
            col=1,
        )
        if spikes:
            # Spikes come from the full frame, not the thinned one, so none is lost.
            marked = steps.filter(pl.col("step").is_in(spikes)).sort("step")
            if marked.height and has_values(marked, column):
                fig.add_trace(
                    go.Scatter(
                        x=marked["step"].to_list(),
                        y=column_values(marked, column),
                        mode="markers",
                        name=f"spike ({column.replace('_', ' ')})",
                        marker={"color": "#d62728", "size": 10, "symbol": "x"},
                    ),
                    row=row,
                    col=1,
                )
    if not fig.data:
        return empty_figure(title, "No loss or gradient norm recorded", "step", "")
    layout(fig, title, "", "", height=480)
    fig.update_xaxes(title_text="step", row=2, col=1)
    fig.update_yaxes(title_text="loss (nats)", row=1, col=1)
    fig.update_yaxes(title_text="grad norm", row=2, col=1)
    return fig


def memory_figure(
    steps: pl.DataFrame,
    samples: pl.DataFrame | None = None,
    slope_bytes_per_step: float | None = None,
    *,
    slope_column: str = "rss_bytes",
) -> go.Figure:
    """Trainer RSS and CUDA allocated memory per step (MiB), with an optional fitted line.

    Samples, when given, add the DataLoader workers' RSS, matched to the step that had
    ended last at each sample's wall time. ``slope_bytes_per_step`` (a rule's fitted growth)
    draws a dashed line through the mean of ``slope_column`` with that slope.
    """
    title = "Memory per step"
    if steps is None or steps.height == 0 or "step" not in steps.columns:
        return empty_figure(title, "No step records", "step", "memory (MiB)")
    ordered = _step_axis(steps)
    frame = thin(ordered)
    x = frame["step"].to_list()
    fig = go.Figure()
    for column, label, colour in (
        ("rss_bytes", PEAK_MEMORY_NAMES["host RSS"], "#1f77b4"),
        ("cuda_allocated_bytes", "CUDA allocated", "#ff7f0e"),
        ("cuda_reserved_bytes", "CUDA reserved", "#ffbb78"),
    ):
        if has_values(frame, column):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=column_values(frame, column, MIB),
                    mode="lines",
                    name=label,
                    line={"color": colour},
                    hovertemplate="%{y:.1f} MiB",
                )
            )
    if (
        samples is not None
        and samples.height
        and has_values(samples, "workers_rss_bytes")
        and has_values(ordered, "wall_time")
    ):
        per_tick = (
            samples.select("wall_time", "workers_rss_bytes")
            .filter(pl.col("wall_time").is_not_null())
            .unique("wall_time")
            .sort("wall_time")
        )
        joined = per_tick.join_asof(
            ordered.select("wall_time", "step").filter(pl.col("wall_time").is_not_null()),
            on="wall_time",
            strategy="backward",
        ).filter(pl.col("step").is_not_null())
        joined = thin(joined.group_by("step").agg(pl.col("workers_rss_bytes").max()).sort("step"))
        # No workers (num_workers=0) records 0 bytes: a flat line at zero says nothing.
        if (
            joined.height
            and has_values(joined, "workers_rss_bytes")
            and joined["workers_rss_bytes"].max()
        ):
            fig.add_trace(
                go.Scatter(
                    x=joined["step"].to_list(),
                    y=column_values(joined, "workers_rss_bytes", MIB),
                    mode="lines",
                    name="DataLoader workers RSS",
                    line={"color": "#2ca02c"},
                    hovertemplate="%{y:.1f} MiB",
                )
            )
    if slope_bytes_per_step is not None and has_values(ordered, slope_column):
        fit = ordered.select("step", slope_column).drop_nulls()
        steps_f = fit["step"].cast(pl.Float64)
        values = fit[slope_column].cast(pl.Float64)
        # Least-squares intercept for a fixed slope: the line passes through the means.
        intercept = float(values.mean()) - slope_bytes_per_step * float(steps_f.mean())
        first, last = float(steps_f.min()), float(steps_f.max())
        fig.add_trace(
            go.Scatter(
                x=[first, last],
                y=[
                    (intercept + slope_bytes_per_step * first) / MIB,
                    (intercept + slope_bytes_per_step * last) / MIB,
                ],
                mode="lines",
                name=f"fitted growth {slope_bytes_per_step / 1024:+,.1f} KiB/step",
                line={"color": "#d62728", "dash": "dash", "width": 2},
                hovertemplate="%{y:.1f} MiB",
            )
        )
    if not fig.data:
        return empty_figure(title, "No memory recorded", "step", "memory (MiB)")
    layout(fig, title, "step", "memory (MiB)")
    return fig


def system_figure(samples: pl.DataFrame) -> go.Figure:
    """GPU utilisation per GPU (top) and host CPU (bottom) over time since the first sample."""
    title = "GPU and CPU utilisation"
    if samples is None or samples.height == 0 or not has_values(samples, "wall_time"):
        return empty_figure(title, "No system samples", "time (s)", "utilisation (%)")
    frame = samples.filter(pl.col("wall_time").is_not_null()).sort("wall_time")
    start = float(frame["wall_time"].min())
    frame = frame.with_columns(elapsed_s=pl.col("wall_time") - start)
    has_gpu = has_values(frame, "gpu_util_pct") and has_values(frame, "gpu_index")
    if has_gpu:
        fig = make_subplots(
            rows=2,
            cols=1,
            shared_xaxes=True,
            vertical_spacing=0.1,
            subplot_titles=("GPU utilisation (NVML: kernel time)", "host CPU"),
        )
        gpu_rows = frame.filter(pl.col("gpu_index").is_not_null())
        for (index,), part in gpu_rows.group_by(["gpu_index"], maintain_order=True):
            part = thin(part)
            fig.add_trace(
                go.Scatter(
                    x=part["elapsed_s"].to_list(),
                    y=column_values(part, "gpu_util_pct"),
                    mode="lines",
                    name=f"GPU {int(index)} util",
                    hovertemplate="%{y:.0f} %",
                ),
                row=1,
                col=1,
            )
        cpu_row: dict[str, int] = {"row": 2, "col": 1}
    else:
        # A CPU run (or no NVML): one panel, and the title says why there is no GPU line.
        fig = go.Figure()
        title = "Host CPU utilisation (no GPU samples: CPU run or NVML unavailable)"
        cpu_row = {}
    if has_values(frame, "cpu_percent"):
        # One sample row per GPU per tick repeats the host CPU figure; keep one a tick.
        cpu = thin(frame.unique("wall_time", keep="first", maintain_order=True))
        fig.add_trace(
            go.Scatter(
                x=cpu["elapsed_s"].to_list(),
                y=column_values(cpu, "cpu_percent"),
                mode="lines",
                name="host CPU",
                line={"color": "#2ca02c"},
                hovertemplate="%{y:.0f} %",
            ),
            **cpu_row,
        )
    if not fig.data:
        return empty_figure(title, "No utilisation recorded", "time (s)", "utilisation (%)")
    if has_gpu:
        layout(fig, title, "", "", height=460)
        fig.update_xaxes(title_text="time since first sample (s)", row=2, col=1)
        fig.update_yaxes(title_text="GPU util (%)", range=[0, 105], row=1, col=1)
        fig.update_yaxes(title_text="CPU (% of one core)", rangemode="tozero", row=2, col=1)
    else:
        layout(fig, title, "time since first sample (s)", "CPU (% of one core)")
        fig.update_yaxes(rangemode="tozero")
    return fig


def breakdown_figure(breakdown: pl.DataFrame) -> go.Figure:
    """The trace's per-step time breakdown (TensorBoard profiler categories), in ms."""
    title = "Trace breakdown per profiler step"
    if breakdown is None or breakdown.height == 0 or "step" not in breakdown.columns:
        return empty_figure(title, "No profiler steps in the trace", "profiler step", "time (ms)")
    frame = thin(breakdown.sort("step"))
    x = [str(s) for s in frame["step"].to_list()]
    fig = go.Figure()
    for column, label, colour in BREAKDOWN_PARTS:
        if has_values(frame, column):
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=column_values(
                        frame.with_columns(pl.col(column).fill_null(0)), column, 1000.0
                    ),
                    name=label,
                    marker_color=colour,
                    hovertemplate="%{y:.2f} ms",
                )
            )
    if not fig.data:
        return empty_figure(title, "No breakdown columns", "profiler step", "time (ms)")
    layout(fig, title, "profiler step", "time (ms)")
    fig.update_layout(barmode="stack", bargap=0.15)
    fig.update_xaxes(type="category")
    return fig


def _value_title(value_col: str) -> tuple[str, float]:
    """Axis title and divisor for a value column named with its unit."""
    base = value_col.rsplit("_", 1)[0].replace("_", " ")
    if value_col.endswith("_us"):
        return f"{base} (ms)", 1000.0
    if value_col.endswith("_ms"):
        return f"{base} (ms)", 1.0
    if value_col.endswith("_bytes"):
        return f"{base} (MiB)", float(MIB)
    if value_col.endswith("_pct"):
        return f"{base} (%)", 1.0
    return value_col.replace("_", " "), 1.0


def top_figure(
    frame: pl.DataFrame,
    value_col: str,
    label_col: str = "name",
    n: int = 15,
    *,
    title: str | None = None,
) -> go.Figure:
    """The ``n`` rows with the largest ``value_col`` as horizontal bars, largest on top.

    Units follow the column name: ``*_us`` is shown in ms, ``*_bytes`` in MiB.
    """
    axis_title, divisor = _value_title(value_col)
    title = title or f"Top {n} by {axis_title}"
    if (
        frame is None
        or frame.height == 0
        or value_col not in frame.columns
        or label_col not in frame.columns
    ):
        return empty_figure(title, "Nothing to rank", axis_title, "")
    top = (
        frame.select(label_col, value_col)
        .drop_nulls(value_col)
        .sort(value_col, descending=True)
        .head(n)
        .reverse()
    )
    full = [safe_text(label) for label in top[label_col].to_list()]
    # Two names that shorten to the same text would merge into one bar; a rank prefix keeps
    # them apart.
    shown = [
        f"{len(full) - i}. {safe_text(label, MAX_LABEL_CHARS)}"
        for i, label in enumerate(top[label_col].to_list())
    ]
    fig = go.Figure(
        go.Bar(
            x=[v / divisor for v in top[value_col].cast(pl.Float64).to_list()],
            y=shown,
            orientation="h",
            customdata=full,
            hovertemplate="%{customdata}<br>%{x:,.2f}<extra></extra>",
            marker_color="#1f77b4",
        )
    )
    layout(fig, title, axis_title, "", height=max(300, 60 + 26 * top.height))
    fig.update_layout(hovermode="closest", margin={"l": 20}, showlegend=False)
    fig.update_yaxes(automargin=True, type="category")
    return fig


def compare_steps_figure(
    steps_a: pl.DataFrame, steps_b: pl.DataFrame, label_a: str, label_b: str
) -> go.Figure:
    """Step time (solid) and data wait (dotted) per step for two runs, overlaid."""
    title = "Step time: side by side"
    fig = go.Figure()
    for steps, label, colour in ((steps_a, label_a, "#1f77b4"), (steps_b, label_b, "#ff7f0e")):
        if steps is None or steps.height == 0 or "step" not in steps.columns:
            continue
        frame = thin(_step_axis(steps))
        name = safe_text(label, MAX_LABEL_CHARS)
        if has_values(frame, "step_time_ms"):
            fig.add_trace(
                go.Scatter(
                    x=frame["step"].to_list(),
                    y=column_values(frame, "step_time_ms"),
                    mode="lines",
                    name=f"{name}: step time",
                    line={"color": colour},
                    hovertemplate="%{y:.1f} ms",
                )
            )
        if has_values(frame, "data_wait_ms"):
            fig.add_trace(
                go.Scatter(
                    x=frame["step"].to_list(),
                    y=column_values(frame, "data_wait_ms"),
                    mode="lines",
                    name=f"{name}: data wait",
                    line={"color": colour, "dash": "dot"},
                    hovertemplate="%{y:.1f} ms",
                )
            )
    if not fig.data:
        return empty_figure(title, "No step records in either run", "step", "time (ms)")
    layout(fig, title, "step", "time per step (ms)")
    _mark_warm_up(fig, [steps_a, steps_b])
    return fig
