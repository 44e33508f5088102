"""Rank and step axes tick on whole numbers (issue 11: a rank axis at -0.5, 0.5, 1.5).

``figure_style.integer_axis`` sets linear ticks from the lowest value, a whole-number step
and an integer format; checked on the rank-stragglers finding's chart as the reports and
pages draw it, and on the axis arithmetic itself.
"""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from diagnostics.report import plots
from diagnostics.report.figure_style import integer_axis
from diagnostics.rules.rank_stragglers import RankStragglers
from diagnostics.thresholds import Thresholds

FIRING = [e for e in RankStragglers.examples if e.fires]


def _ticks(axis, count: int) -> list[float]:
    return [axis.tick0 + i * axis.dtick for i in range(count)]


@pytest.mark.parametrize("example", FIRING, ids=lambda e: e.name[:40])
def test_the_rank_stragglers_chart_ticks_once_per_rank(example):
    (finding,) = RankStragglers().check(example.build(), Thresholds())
    chart = finding.evidence["chart"]
    ranks = list(chart.x)
    assert all(isinstance(r, int) for r in ranks) and len(ranks) >= 2
    axis = plots.finding_figure(finding).layout.xaxis
    assert (axis.tickmode, axis.tickformat) == ("linear", "d")
    assert axis.dtick == 1 and axis.tick0 == min(ranks)
    ticks = _ticks(axis, len(ranks))
    assert ticks == sorted(ranks)  # one tick on each rank, none at -0.5 or 0.5
    assert all(float(t).is_integer() for t in ticks)


def test_two_ranks_get_ticks_0_and_1_only():
    fig = go.Figure(go.Bar(x=[0, 1], y=[100.0, 130.0]))
    integer_axis(fig, [0, 1])
    axis = fig.layout.xaxis
    assert _ticks(axis, 2) == [0, 1] and axis.tickformat == "d"


def test_many_steps_keep_about_ten_whole_number_ticks():
    fig = go.Figure()
    integer_axis(fig, list(range(3, 204)), axis="y")
    axis = fig.layout.yaxis
    # (203 - 3) / 10 = 20 steps between ticks, from the first step
    assert (axis.tick0, axis.dtick, axis.tickmode) == (3, 20, "linear")
    assert fig.layout.xaxis.tickmode is None  # only the axis asked for


def test_labels_that_are_not_whole_numbers_leave_the_axis_alone():
    for values in (["rank 0", "rank 1"], [0.5, 1.5], [True, False], []):
        fig = go.Figure()
        integer_axis(fig, values)
        assert fig.layout.xaxis.tickmode is None, values
