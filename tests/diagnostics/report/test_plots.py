from __future__ import annotations

import polars as pl
import pytest

from diagnostics.chart import CHART_KINDS, Chart
from diagnostics.report import plots
from diagnostics.rules.base import Finding, Fix, Severity
from tests.diagnostics.report.frames import MIB, sample_frame, simple_steps, step_frame

HOSTILE = "<script>alert(1)</script>"


def _trace(fig, name):
    matches = [t for t in fig.data if t.name == name]
    assert len(matches) == 1, [t.name for t in fig.data]
    return matches[0]


def _is_empty_placeholder(fig) -> bool:
    return not fig.data and len(fig.layout.annotations) == 1


def test_step_time_stacks_parts_and_the_unaccounted_rest():
    fig = plots.step_time_figure(simple_steps(4))
    title, x_title, y_title = plots.figure_titles(fig)
    assert title == "Step time breakdown"
    assert x_title == "step" and "(ms)" in y_title
    assert fig.layout.barmode == "stack"
    assert list(_trace(fig, "data wait").y) == [30.0] * 4
    assert list(_trace(fig, "optimizer").y) == [5.0] * 4
    # step_time = 30 + 2 + 50 + 5 + 3, so 3 ms is covered by no part.
    assert list(_trace(fig, "other").y) == [3.0] * 4
    stacked = [sum(t.y[i] for t in fig.data) for i in range(4)]
    assert stacked == [90.0] * 4


def test_step_time_without_rest_has_no_other_series():
    steps = simple_steps(3).with_columns(step_time_ms=pl.lit(87.0))  # 30 + 2 + 50 + 5
    names = plots.series_names(plots.step_time_figure(steps))
    assert "other" not in names and "data wait" in names


def test_empty_frames_give_a_titled_placeholder():
    empty = step_frame([])
    for fig in (
        plots.step_time_figure(empty),
        plots.loss_gradnorm_figure(empty),
        plots.memory_figure(empty, None),
        plots.system_figure(sample_frame([])),
        plots.breakdown_figure(pl.DataFrame()),
        plots.top_figure(pl.DataFrame(), "device_us"),
        plots.compare_steps_figure(empty, empty, "a", "b"),
    ):
        assert _is_empty_placeholder(fig)
        assert plots.figure_titles(fig)[0]


def test_loss_gradnorm_marks_spikes_on_both_panels():
    steps = simple_steps(6).with_columns(
        grad_norm=pl.when(pl.col("step") == 4).then(50.0).otherwise(1.0)
    )
    fig = plots.loss_gradnorm_figure(steps, spike_steps=[4, 99])
    spike = _trace(fig, "spike (grad norm)")
    assert list(spike.x) == [4] and list(spike.y) == [50.0]
    # loss at step 4 is 2.0 - 0.1 * 4
    assert list(_trace(fig, "spike (loss)").y) == pytest.approx([1.6])
    assert fig.layout.xaxis2.title.text == "step"
    assert fig.layout.yaxis.title.text and fig.layout.yaxis2.title.text


def test_memory_in_mib_with_fitted_slope_through_the_data():
    steps = simple_steps(10)  # rss = (500 + step) MiB: grows exactly 1 MiB a step
    fig = plots.memory_figure(steps, None, slope_bytes_per_step=float(MIB))
    rss = _trace(fig, "host RSS")
    assert list(rss.y) == [500.0 + s for s in range(1, 11)]
    fitted = [t for t in fig.data if t.name.startswith("fitted growth")][0]
    # A perfect line: the fitted ends meet the first and last points (501 and 510 MiB).
    assert list(fitted.x) == [1.0, 10.0]
    assert list(fitted.y) == pytest.approx([501.0, 510.0])
    assert "1,024.0 KiB/step" in fitted.name
    assert plots.figure_titles(fig)[2] == "memory (MiB)"
    # CUDA allocated is all null on a CPU run: no empty series drawn.
    assert "CUDA allocated" not in plots.series_names(fig)


def test_memory_joins_worker_rss_to_the_last_finished_step():
    steps = simple_steps(3)  # step s ends at wall 1000 + 0.09 s
    samples = sample_frame(
        [
            {"wall_time": 1000.10, "workers_rss_bytes": 10 * MIB, "cpu_percent": 50.0},
            {"wall_time": 1000.20, "workers_rss_bytes": 20 * MIB, "cpu_percent": 50.0},
        ]
    )
    workers = _trace(plots.memory_figure(steps, samples), "DataLoader workers RSS")
    # 1000.10 falls after step 1 (1000.09), 1000.20 after step 2 (1000.18).
    assert list(workers.x) == [1, 2] and list(workers.y) == [10.0, 20.0]


def test_system_figure_one_series_per_gpu_and_cpu_once_per_tick():
    rows = []
    for tick in range(3):
        for gpu in (0, 1):
            rows.append(
                {
                    "wall_time": 50.0 + tick,
                    "cpu_percent": 100.0 + tick,
                    "gpu_index": gpu,
                    "gpu_util_pct": 10.0 * (gpu + 1),
                }
            )
    fig = plots.system_figure(sample_frame(rows))
    assert list(_trace(fig, "GPU 0 util").y) == [10.0] * 3
    assert list(_trace(fig, "GPU 1 util").y) == [20.0] * 3
    cpu = _trace(fig, "host CPU")
    assert list(cpu.x) == [0.0, 1.0, 2.0] and list(cpu.y) == [100.0, 101.0, 102.0]
    assert fig.layout.yaxis.title.text == "GPU util (%)"
    assert "(s)" in fig.layout.xaxis2.title.text


def test_system_figure_on_cpu_says_there_is_no_gpu():
    fig = plots.system_figure(
        sample_frame(
            [{"wall_time": 1.0, "cpu_percent": 90.0}, {"wall_time": 2.0, "cpu_percent": 80.0}]
        )
    )
    assert [t.name for t in fig.data] == ["host CPU"]
    assert list(fig.data[0].y) == [90.0, 80.0]
    title, x_title, y_title = plots.figure_titles(fig)
    assert "no GPU samples" in title and "(s)" in x_title and "%" in y_title


def test_memory_leaves_out_workers_when_there_are_none():
    samples = sample_frame([{"wall_time": 1000.10, "workers_rss_bytes": 0, "cpu_percent": 50.0}])
    assert "DataLoader workers RSS" not in plots.series_names(
        plots.memory_figure(simple_steps(3), samples)
    )


def test_breakdown_converts_us_to_ms():
    breakdown = pl.DataFrame(
        {
            "step": [1, 2],
            "kernel_us": [1500, 2500],
            "memcpy_us": [500, 0],
            "memset_us": [0, 0],
            "runtime_us": [100, 100],
            "dataloader_us": [4000, 0],
            "cpu_exec_us": [0, 0],
            "other_us": [0, 0],
            "total_us": [6100, 2600],
        }
    )
    fig = plots.breakdown_figure(breakdown)
    assert list(_trace(fig, "kernel").y) == [1.5, 2.5]
    assert list(_trace(fig, "DataLoader").y) == [4.0, 0.0]
    assert plots.figure_titles(fig)[2] == "time (ms)"


def test_top_figure_ranks_escapes_and_shortens():
    frame = pl.DataFrame(
        {
            "name": ["small", HOSTILE, "x" * 200, "mid"],
            "device_us": [1000.0, 9000.0, 5000.0, 3000.0],
        }
    )
    fig = plots.top_figure(frame, "device_us", n=3)
    bar = fig.data[0]
    # Largest last (plotly draws the last category on top): 9 ms, 5 ms, 3 ms reversed.
    assert list(bar.x) == [3.0, 5.0, 9.0]
    assert bar.y[2] == "1. &lt;script&gt;alert(1)&lt;/script&gt;"
    assert len(bar.y[1]) < 70 and bar.y[1].endswith("…")
    assert bar.customdata[1] == "x" * 200
    assert "<script>" not in fig.to_json()
    assert plots.figure_titles(fig)[1] == "device (ms)"


def _finding(evidence):
    return Finding(
        rule="demo",
        severity=Severity.MEDIUM,
        title="demo",
        evidence=evidence,
        recommendation="",
        fix=Fix(code=""),
    )


def _chart(kind="line", **changes):
    parts = {
        "kind": kind,
        "title": "Data wait per step",
        "x_label": "step",
        "y_label": "time (ms)",
        "x": (1, 2, 3),
        "series": {"data wait (ms)": (40.0, 41.5, None), HOSTILE: (1, 2, 3)},
        "highlight_x": (2,),
    }
    return Chart(**{**parts, **changes})


@pytest.mark.parametrize("kind", CHART_KINDS)
def test_finding_figure_draws_each_kind(kind):
    fig = plots.finding_figure(_finding({"chart": _chart(kind)}))
    assert plots.figure_titles(fig) == ("Data wait per step", "step", "time (ms)")
    drawn = _trace(fig, "data wait (ms)")
    assert drawn.type == {"line": "scatter", "bar": "bar"}[kind]
    assert list(drawn.x) == [1, 2, 3] and list(drawn.y) == [40.0, 41.5, None]
    # the highlighted x sits on the first series' value there
    assert list(_trace(fig, "highlighted").x) == [2]
    assert list(_trace(fig, "highlighted").y) == [41.5]
    assert "<script>" not in fig.to_json()
    if kind == "bar":
        assert fig.layout.barmode == "group"


def test_finding_figure_labels_and_marks_categories():
    chart = _chart(
        "bar",
        x=("Pageable", HOSTILE),
        series={"HtoD (ms)": (8.0, 1.0)},
        highlight_x=("Pageable", "not drawn"),  # an x the chart does not hold marks nothing
    )
    fig = plots.finding_figure(_finding({"chart": chart}))
    assert list(fig.data[0].x) == ["Pageable", plots.safe_text(HOSTILE)]
    assert list(_trace(fig, "highlighted").x) == ["Pageable"]
    assert list(_trace(fig, "highlighted").y) == [8.0]


@pytest.mark.parametrize(
    "evidence",
    [
        {},
        {"chart": None},
        {"chart": _chart(x=(), series={"a": ()}, highlight_x=())},  # no points to draw
        # the JSON form is not read: findings carry a Chart
        {"chart": _chart().to_dict()},
    ],
)
def test_finding_figure_none_without_a_chart(evidence):
    assert plots.finding_figure(_finding(evidence)) is None


def test_compare_overlays_both_runs():
    fast = simple_steps(5, data_wait_ms=1.0)
    slow = simple_steps(5, data_wait_ms=60.0)
    fig = plots.compare_steps_figure(slow, fast, "before", HOSTILE)
    assert list(_trace(fig, "before: step time").y) == [120.0] * 5  # 60 + 2 + 50 + 5 + 3
    assert list(_trace(fig, "before: data wait").y) == [60.0] * 5
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;: step time"
    assert list(_trace(fig, escaped).y) == [61.0] * 5  # 1 + 2 + 50 + 5 + 3
    assert plots.figure_titles(fig)[1:] == ("step", "time per step (ms)")


def test_long_runs_are_thinned():
    steps = simple_steps(plots.MAX_POINTS * 2 + 1)
    fig = plots.step_time_figure(steps)
    assert len(fig.data[0].x) <= plots.MAX_POINTS
    assert fig.data[0].x[0] == 1


def _with_warm_up(first_ms: float) -> pl.DataFrame:
    steps = simple_steps(6)  # 90 ms steps
    return steps.with_columns(
        step_time_ms=pl.when(pl.col("step") == 1).then(first_ms).otherwise(pl.col("step_time_ms")),
        compute_ms=pl.when(pl.col("step") == 1)
        .then(first_ms - 40.0)
        .otherwise(pl.col("compute_ms")),
    )


def test_a_warm_up_step_is_marked_and_left_out_of_the_scale():
    # step 1 (the phase's first, left out of the statistics) took 3 s beside 90 ms steps:
    # the axis keeps the steady steps' scale and the cut bar says its time
    for fig in (
        plots.step_time_figure(_with_warm_up(3000.0)),
        plots.compare_steps_figure(_with_warm_up(3000.0), simple_steps(6), "a", "b"),
    ):
        low, high = fig.layout.yaxis.range
        assert low == 0.0 and 90.0 < high <= 1.25 * 90.0 + 1e-9
        (note,) = [a.text for a in fig.layout.annotations]
        assert note == "warm-up ↑ 3.00 s"
        shaded = [(s.x0, s.x1) for s in fig.layout.shapes]
        assert shaded == [(0.5, 1.5)]


def test_a_warm_up_step_of_the_steady_scale_keeps_the_axis_as_plotly_sets_it():
    fig = plots.step_time_figure(_with_warm_up(100.0))  # 100 ms beside 90: nothing to cut
    assert fig.layout.yaxis.range is None
    assert not fig.layout.annotations
    assert [(s.x0, s.x1) for s in fig.layout.shapes] == [(0.5, 1.5)]  # still marked
