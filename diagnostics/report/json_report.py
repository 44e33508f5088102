"""The report as JSON: the analyser's versioned document plus a ``report`` object.

For one analysis the top level is the analyser's ``pipeline-doctor/analysis/v1`` document
unchanged, with ``report`` added. For a comparison it is
``{"schema": "pipeline-doctor/comparison/v1", "a": <analysis>, "b": <analysis>, "report": ...}``.
``report`` (schema ``pipeline-doctor/report/v1``) always holds: ``schema``, ``kind``,
``title``, ``generated_at``, ``metrics``, ``findings`` (severity order, each with
``set_args`` and ``rerun_command``), ``cost`` (null when unknown), ``comparison`` (null for one analysis),
``summary_rows``, ``environment_rows``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from diagnostics.report.model import REPORT_SCHEMA, Report

COMPARISON_SCHEMA = "pipeline-doctor/comparison/v1"


def _clean(value: Any) -> Any:
    """Plain JSON values: NaN and infinity become null; tuples become lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _clean(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(item) for item in value]
    if value is None or isinstance(value, str | int | bool):
        return value
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        return _clean(item())
    return str(value)


def report_document(report: Report) -> dict[str, Any]:
    section = report.comparison
    report_part = {
        "schema": REPORT_SCHEMA,
        "kind": report.kind,
        "title": report.title,
        "generated_at": report.generated_at,
        "metrics": report.metrics,
        "summary_rows": [list(row) for row in report.summary_rows],
        "environment_rows": [list(row) for row in report.environment_rows],
        "notes": list(report.notes),
        "findings": [finding.to_dict() for finding in report.findings],
        "cost": report.cost.to_dict() if report.cost is not None else None,
        "memory_tables": [t.to_dict() for t in report.memory_tables],
        "comparison": None
        if section is None
        else {
            **section.data,
            "cost_a": section.cost_a.to_dict() if section.cost_a is not None else None,
        },
    }
    if report.kind == "comparison":
        document = {
            "schema": COMPARISON_SCHEMA,
            "a": report.analysis.get("a", {}),
            "b": report.analysis.get("b", {}),
        }
    else:
        document = dict(report.analysis)
    document["report"] = report_part
    return _clean(document)


def render_json(report: Report) -> str:
    return json.dumps(report_document(report), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
