"""One severity order and one report-format registry, shared by the engine, pages and reports."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from diagnostics.analyze import analyze
from diagnostics.report.cli import _parser
from diagnostics.report.formats import FORMAT_NAMES, REPORT_FORMATS, render_report, report_format
from diagnostics.report.model import build_report
from diagnostics.severity import SEVERITY_ORDER, order_findings, severity_rank

REPO = Path(__file__).resolve().parents[2]
GPU_RUN = REPO.parent / "shared" / "gpu-runs" / "h200-default" / "gpu-healthy"


def _f(rule: str, severity: str, saving: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(rule=rule, severity=severity, estimated_saving_pct=saving)


def test_order_is_severity_then_saving_and_keeps_ties_in_arrival_order():
    findings = [
        _f("z-low", "low", 50.0),
        _f("b-medium", "medium"),
        _f("a-medium", "medium"),
        _f("odd", "unheard-of"),
        _f("saves-more", "medium", 20.0),
        _f("high", "HIGH"),
    ]
    ordered = [f.rule for f in order_findings(findings)]
    assert ordered == ["high", "saves-more", "b-medium", "a-medium", "z-low", "odd"]
    assert severity_rank("high") < severity_rank("medium") < severity_rank("low")
    assert severity_rank("unheard-of") == len(SEVERITY_ORDER)


def test_report_lists_findings_in_the_analysers_order():
    """Two medium findings without savings: the report used to re-sort them by rule id."""
    result = analyze(GPU_RUN)
    engine = [f.rule for f in result.findings]
    assert engine == [f.rule for f in order_findings(result.findings)]
    assert [f.rule for f in build_report(result).findings] == engine
    assert engine != sorted(engine, key=lambda r: (severity_rank(_sev(result, r)), r))


def _sev(result, rule: str) -> str:
    return next(str(f.severity) for f in result.findings if f.rule == rule)


def test_report_cli_offers_exactly_the_registered_formats():
    action = next(a for a in _parser()._actions if a.dest == "format")
    assert tuple(action.choices) == FORMAT_NAMES == ("html", "md", "json")
    assert [f.mime for f in REPORT_FORMATS] == ["text/html", "text/markdown", "application/json"]
    with pytest.raises(ValueError, match="unknown report format 'pdf'"):
        report_format("pdf")


def test_every_registered_format_renders_a_real_report():
    trace = REPO.parent / "shared" / "traces" / "hta_a100_rank3_of_8.json.gz"
    report = build_report(analyze(trace))
    texts = {name: render_report(report, name) for name in FORMAT_NAMES}
    assert texts["html"].lstrip().lower().startswith("<!doctype html")
    assert "## Summary" in texts["md"]
    assert json.loads(texts["json"])["report"]["schema"] == "pipeline-doctor/report/v1"


def _literal_dict_keys(tree: ast.AST) -> list[tuple[set[str], list[ast.expr]]]:
    return [
        (
            {
                k.value
                for k in node.keys
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            },
            node.values,
        )
        for node in ast.walk(tree)
        if isinstance(node, ast.Dict)
    ]


def test_no_other_module_spells_the_severity_order_or_the_renderers():
    roots = [REPO / "diagnostics", REPO / "app_ui", REPO / "pages"]
    copies = []
    for path in (p for root in roots for p in root.rglob("*.py")):
        if path.name in {"severity.py", "formats.py"}:
            continue
        for keys, values in _literal_dict_keys(ast.parse(path.read_text(encoding="utf-8"))):
            # an order maps severities to numbers (badges and labels are not orders)
            ranks = all(isinstance(v, ast.Constant) and isinstance(v.value, int) for v in values)
            renderers = all(isinstance(v, ast.Name) for v in values)
            if (keys >= {"high", "medium", "low"} and ranks) or (
                keys >= {"html", "md", "json"} and renderers
            ):
                copies.append(str(path.relative_to(REPO)))
    assert copies == []
