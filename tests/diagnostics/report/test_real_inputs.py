"""A report builds in every format for every real trace in ../shared/traces."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from diagnostics.analyze import analyze
from diagnostics.report.html import render_html
from diagnostics.report.json_report import render_json
from diagnostics.report.markdown import render_markdown
from diagnostics.report.model import SEVERITY_ORDER, build_report
from tests.diagnostics.trace.helpers import provenance_trace_names

TRACES_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
TRACES = sorted(p for p in TRACES_DIR.glob("*.json*") if p.is_file())


def test_the_shared_traces_are_there():
    # The traces PROVENANCE.md lists (twelve); an empty glob would make the test below vacuous.
    assert {p.name for p in TRACES} == provenance_trace_names()
    assert len(TRACES) == 12


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_report_for_real_trace(trace):
    result = analyze(trace)
    report = build_report(result)
    ranks = [SEVERITY_ORDER[f.severity] for f in report.findings]
    assert ranks == sorted(ranks)
    assert {c.key for c in report.charts} >= {"breakdown"}
    assert report.cost is not None and report.cost.time_per_1000_steps_s

    document = render_html(report)
    parser = HTMLParser()
    parser.feed(document)
    parser.close()
    for section in ("summary", "findings", "cost", "charts"):
        assert f'id="{section}"' in document
    for finding in report.findings:
        assert f"finding sev-{finding.severity}" in document

    markdown = render_markdown(report)
    assert "## Summary" in markdown and "## Findings" in markdown

    data = json.loads(render_json(report))
    assert data["schema"] == "pipeline-doctor/analysis/v1"
    assert [f["rule"] for f in data["report"]["findings"]] == [f.rule for f in report.findings]
    assert sorted(f["rule"] for f in data["findings"]) == sorted(f.rule for f in report.findings)
