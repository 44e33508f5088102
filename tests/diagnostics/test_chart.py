"""The evidence chart (diagnostics.chart.Chart): what its constructor refuses, its JSON form
and its round trip, and that every rule's firing examples carry one the reports can draw."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from diagnostics.chart import CHART_KEYS, CHART_KINDS, Chart, ChartError
from diagnostics.report import plots
from diagnostics.result import _clean
from diagnostics.rules.base import Finding, Fix, Severity
from diagnostics.rules.evidence import chart
from diagnostics.rules.registry import RULES
from diagnostics.thresholds import Thresholds

PARTS = {
    "kind": "line",
    "title": "Step time",
    "x_label": "step",
    "y_label": "time (ms)",
    "x": (1, 2, 3),
    "series": {"step time (ms)": (10.0, None, 12.5)},
    "highlight_x": (2,),
}


def _make(**changes) -> Chart:
    return Chart(**{**PARTS, **changes})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kind": "pie"}, "kind 'pie' is not one of line, bar"),
        ({"series": {"a": (1.0, 2.0)}}, "series 'a' has 2 values for 3 x values"),
        ({"series": {"a": (1.0, "2", 3.0)}}, "series 'a' holds '2', not a number or null"),
        ({"series": {"a": (1.0, True, 3.0)}}, "series 'a' holds True"),
        ({"series": {}}, "series must map at least one name to values"),
        ({"series": {"a": 5}}, "each series must be a list of values"),
        ({"x": (1, None, 3)}, "x holds None, not a number or a string"),
        ({"x": "abc"}, "x must be a list of values"),
        ({"highlight_x": ([2],)}, "highlight_x holds [2]"),
        ({"title": None}, "title must be a string"),
    ],
)
def test_the_constructor_refuses_a_chart_that_breaks_the_contract(changes, message):
    with pytest.raises(ChartError, match=r"^chart .*: ") as raised:
        _make(**changes)
    assert message in str(raised.value)


def test_a_chart_is_frozen_and_keeps_no_list_it_was_given():
    x, values = [1, 2, 3], [1.0, 2.0, 3.0]
    made = _make(x=x, series={"a": values})
    x.append(4)
    values[0] = 99.0
    assert made.x == (1, 2, 3) and made.series["a"] == (1.0, 2.0, 3.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.kind = "bar"  # type: ignore[misc]


def test_the_rules_helper_downsamples_and_makes_values_plain():
    made = chart(
        "line",
        "Loss",
        "step",
        "loss",
        np.arange(1000),
        {"loss": [math.nan, *np.linspace(1.0, 2.0, 998), math.inf]},
        highlight_x=[np.int64(5)],
        max_points=10,
    )
    assert isinstance(made, Chart)
    assert len(made.x) == 10 and made.x[0] == 0 and made.x[-1] == 999
    assert made.series["loss"][0] is None and made.series["loss"][-1] is None  # NaN, inf: gaps
    assert type(made.x[1]) is int and made.highlight_x == (5,)
    with pytest.raises(ChartError, match="series 'loss' has 2 values for 3 x values"):
        chart("line", "Loss", "step", "loss", [1, 2, 3], {"loss": [1.0, 2.0]})


def test_the_json_form_keeps_its_keys_and_reads_back_the_same_chart():
    made = _make(kind="bar", x=("Pageable", "Pinned"), series={"HtoD (ms)": (8.0, None)})
    doc = made.to_dict()
    assert tuple(doc) == CHART_KEYS
    assert doc == {
        "kind": "bar",
        "title": "Step time",
        "x_label": "step",
        "y_label": "time (ms)",
        "x": ["Pageable", "Pinned"],
        "series": {"HtoD (ms)": [8.0, None]},
        "highlight_x": [2],
    }
    assert Chart.from_dict(json.loads(json.dumps(doc, allow_nan=False))) == made


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({k: v for k, v in PARTS.items() if k != "series"}, "missing series"),
        ({**PARTS, "horizontal": True}, "unknown horizontal"),  # an option no rule emits
        ({**PARTS, "kind": "pie"}, "kind 'pie'"),
    ],
)
def test_reading_a_chart_back_names_what_is_wrong(doc, message):
    with pytest.raises(ChartError, match=message):
        Chart.from_dict(doc)


def test_a_finding_writes_its_chart_as_the_json_form():
    made = _make()
    finding = Finding(
        rule="demo",
        severity=Severity.LOW,
        title="demo",
        evidence={"steps": [1, 2, 3], "chart": made, "slope_ms": 1.5},
        recommendation="",
        fix=Fix(code=""),
    )
    evidence = _clean(finding.to_dict())["evidence"]
    assert list(evidence) == ["steps", "chart", "slope_ms"]  # the key keeps its place
    assert evidence["chart"] == made.to_dict()
    assert finding.evidence["chart"] is made  # the finding itself is left as it was


FIRING = [
    pytest.param(rule, example, id=f"{rule.id}::{example.name}")
    for rule in RULES
    for example in rule.examples
    if example.fires
]


@pytest.mark.parametrize(("rule", "example"), FIRING)
def test_every_firing_example_carries_a_chart_the_reports_draw(rule, example):
    inputs = example.build()
    assert rule.skip_reason(inputs) is None
    for finding in rule.check(inputs, Thresholds()):
        made = finding.evidence.get("chart")
        if made is None:
            continue
        assert isinstance(made, Chart), f"{rule.id}: evidence['chart'] is {type(made).__name__}"
        assert Chart.from_dict(json.loads(json.dumps(finding.to_dict()))["evidence"]["chart"])
        fig = plots.finding_figure(finding)
        if made.x:
            assert fig is not None and plots.figure_titles(fig)[0] == made.title
            assert set(made.series) <= set(plots.series_names(fig))


def test_every_rule_shows_a_chart_in_some_firing_example():
    """So the check above is not vacuous: each rule's must-fire examples chart something,
    and between them the rules use every kind."""
    kinds = set()
    for rule in RULES:
        charts = [
            finding.evidence["chart"]
            for example in rule.examples
            if example.fires
            for finding in rule.check(example.build(), Thresholds())
            if "chart" in finding.evidence
        ]
        assert charts, f"{rule.id}: no firing example has a chart"
        kinds |= {c.kind for c in charts}
    assert kinds == set(CHART_KINDS)
