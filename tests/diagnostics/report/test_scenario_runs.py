"""A report builds for a real run of each trainer scenario, and for a comparison of two."""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser

import pytest

from diagnostics.analyze import analyze
from diagnostics.compare import compare
from diagnostics.dotted import dotted_get as config_value
from diagnostics.report.cli import main
from diagnostics.report.html import render_html
from diagnostics.report.json_report import render_json
from diagnostics.report.markdown import render_markdown
from diagnostics.report.model import SEVERITY_ORDER, build_comparison_report, build_report
from tests.conftest import SCENARIO_NAMES


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_report_for_each_scenario_run(scenario, scenario_runs):
    result = analyze(scenario_runs[scenario])
    report = build_report(result)
    assert report.kind == "run"
    ranks = [SEVERITY_ORDER[f.severity] for f in report.findings]
    assert ranks == sorted(ranks)
    assert {"step_time", "loss_gradnorm", "memory"} <= {c.key for c in report.charts}
    # Steps per epoch from the run's training split: the trainer holds out the last tenth of
    # data.rows (32 to 512 rows) for validation; the last partial batch is still a step.
    rows = config_value(result.run.config, "data.rows")
    batch = config_value(result.run.config, "train.batch_size")
    train_rows = rows - min(512, max(32, rows // 10))
    assert report.cost.steps_per_epoch == math.ceil(train_rows / batch)
    assert dict(report.config_rows)["scenario"] == scenario

    document = render_html(report)
    HTMLParser().feed(document)
    for section in ("source", "environment", "summary", "findings", "cost", "charts", "config"):
        assert f'id="{section}"' in document
    assert "## Findings" in render_markdown(report)
    data = json.loads(render_json(report))
    assert data["report"]["metrics"]["steps"] == result.run.steps.height


@pytest.mark.slow
def test_comparison_report_of_two_runs(scenario_runs, tmp_path):
    before = analyze(scenario_runs["slow-loader"])
    after = analyze(scenario_runs["healthy"])
    report = build_comparison_report(compare(before, after))
    assert report.charts[0].key == "compare_steps"
    changed = {key for key, _, _ in report.comparison.config_changes}
    assert "scenario" in changed
    document = render_html(report)
    assert 'id="comparison"' in document
    out = tmp_path / "compare.md"
    code = main(
        [
            str(scenario_runs["slow-loader"]),
            "--compare",
            str(scenario_runs["healthy"]),
            "--format",
            "md",
            "-o",
            str(out),
        ]
    )
    assert code == 0 and "## Before and after" in out.read_text()


@pytest.mark.slow
def test_fail_on_for_a_run_folder(scenario_runs, tmp_path):
    path = scenario_runs["slow-loader"]
    findings = json.loads(render_json(build_report(analyze(path))))["report"]["findings"]
    worst = min((SEVERITY_ORDER[f["severity"]] for f in findings), default=None)
    for level, rank in SEVERITY_ORDER.items():
        expected = 1 if worst is not None and worst <= rank else 0
        assert (
            main(
                [str(path), "--format", "json", "-o", str(tmp_path / "r.json"), "--fail-on", level]
            )
            == expected
        )
