from __future__ import annotations

import json
import re

from diagnostics.compare import compare
from diagnostics.report.json_report import COMPARISON_SCHEMA, render_json
from diagnostics.report.markdown import cell, fence, render_markdown
from diagnostics.report.model import REPORT_SCHEMA, build_comparison_report, build_report
from tests.diagnostics.report import fakes
from tests.diagnostics.report.fakes import BREAKOUT, HOSTILE, PIPED


def _table_rows(document: str, header_start: str) -> list[str]:
    lines = document.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def _cells(row: str) -> list[str]:
    """A row's cells, split on the pipes Markdown splits on (an escaped \\| stays in its cell)."""
    return re.split(r"(?<!\\)\|", row.strip())[1:-1]


def _markdown_tables(document: str) -> list[tuple[str, list[str]]]:
    """Each table as (header, body rows): a header is the line above a |---| separator."""
    lines = document.splitlines()
    tables = []
    for i in range(1, len(lines)):
        if re.fullmatch(r"\|(---\|)+", lines[i]):
            rows = []
            for line in lines[i + 1 :]:
                if not line.startswith("|"):
                    break
                rows.append(line)
            tables.append((lines[i - 1], rows))
    return tables


def test_markdown_sections_tables_and_fences(run_result):
    document = render_markdown(build_report(run_result))
    for heading in (
        "# Pipeline Doctor report",
        "## Summary",
        "## Findings",
        "## Cost",
        "## Environment",
    ):
        assert heading in document
    findings = _table_rows(document, "| # | severity")
    assert [row.split(" | ")[1] for row in findings] == ["high", "high", "medium", "low"]
    assert "```python\nloader = DataLoader(ds, num_workers=4)\n```" in document
    assert '```json\n{\n  "data.num_workers": 4,' in document
    assert "--set data.num_workers=4 --set data.persistent_workers=true" in document
    summary = dict(
        (row.split(" | ")[0].lstrip("| "), row.split(" | ")[1].rstrip(" |"))
        for row in _table_rows(document, "| metric | value")
    )
    assert summary["median step time"] == "100 ms"


def test_markdown_cells_escape_pipes_newlines_and_markup():
    assert cell("a|b\nc") == "a\\|b<br>c"
    assert cell(HOSTILE) == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert cell("data_wait_ms") == "data\\_wait\\_ms"


def test_fence_outgrows_backticks_in_the_code():
    assert fence("x = 1", "python") == "```python\nx = 1\n```"
    code = "print('```')"
    assert fence(code).startswith("````\n") and fence(code).endswith("\n````")


def test_markdown_hostile_names_stay_text(hostile_result):
    document = render_markdown(build_report(hostile_result))
    outside_code = []
    in_fence = False
    for line in document.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if not in_fence:
            outside_code.append(line)
    prose = "\n".join(outside_code)
    assert HOSTILE not in prose and "</script>" not in prose and "<!--" not in prose
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in prose
    # In a fence the code is shown verbatim, which Markdown never renders as HTML.
    assert f"# {BREAKOUT}" in document
    # Every row has as many cells as its table's header: a | in a name did not split a cell.
    tables = _markdown_tables(prose)
    rows_with_a_piped_name = 0
    for header, rows in tables:
        for row in rows:
            assert len(_cells(row)) == len(_cells(header)), (header, row)
            rows_with_a_piped_name += PIPED.replace("|", "\\|") in row
    # PIPED is in the hostname, the breakdown, the findings table, an evidence key and value.
    assert rows_with_a_piped_name >= 4


def test_json_is_the_analysis_document_plus_report(run_result):
    document = json.loads(render_json(build_report(run_result)))
    assert document["schema"] == "pipeline-doctor/analysis/v1"
    assert document["summary"]["steps"] == 12
    report = document["report"]
    assert report["schema"] == REPORT_SCHEMA
    for key in (
        "kind",
        "title",
        "generated_at",
        "metrics",
        "findings",
        "cost",
        "comparison",
        "summary_rows",
    ):
        assert key in report
    assert [f["rule"] for f in report["findings"]] == [
        "slow-data",
        "too-few-workers",
        "missing-pin-memory",
        "small-batch",
    ]
    assert report["findings"][0]["set_args"] == [
        "data.num_workers=4",
        "data.persistent_workers=true",
    ]
    assert report["metrics"]["median_step_time_ms"] == 100.0
    assert report["cost"]["steps_per_epoch"] == 125
    assert report["comparison"] is None


def test_json_comparison_document(run_data, mixed_findings):
    a = fakes.run_result(run_data, mixed_findings)
    b = fakes.trace_result(())
    document = json.loads(render_json(build_comparison_report(compare(a, b))))
    assert document["schema"] == COMPARISON_SCHEMA
    assert document["a"]["schema"] == document["b"]["schema"] == "pipeline-doctor/analysis/v1"
    gone = document["report"]["comparison"]["findings_gone"]
    assert sorted(f["rule"] for f in gone) == sorted(f.rule for f in mixed_findings)
    assert document["report"]["comparison"]["cost_a"]["time_per_1000_steps_s"] == 100.0


def test_json_has_no_nan(run_data):
    finding = fakes.finding("x", fakes.Severity.LOW, float("nan"), evidence={"ratio": float("inf")})
    text = render_json(build_report(fakes.run_result(run_data, (finding,))))
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["report"]["findings"][0]["evidence"]["ratio"] is None
