"""The one order of findings by severity, for the engine, the pages and the reports.

No polars and no rules here: the report CLI reads the severities before any usage error.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# most severe first: the one order of the engine, the pages and the reports
SEVERITY_ORDER: dict[str, int] = {"high": 0, "medium": 1, "low": 2}


def severity_rank(severity: object) -> int:
    """A severity's place in SEVERITY_ORDER (a Severity or its text, any case); unknown last."""
    text = str(getattr(severity, "value", severity)).lower()
    return SEVERITY_ORDER.get(text, len(SEVERITY_ORDER))


def order_findings(findings: Iterable[Any]) -> list[Any]:
    """Most severe first; within a severity the largest expected saving first.

    Stable: ties keep the order they came in (the registry's, from the engine), so the JSON,
    the pages and the reports list findings alike. Takes the engine's Findings and the
    reports' findings (anything with ``severity`` and ``estimated_saving_pct``).
    """
    return sorted(
        findings, key=lambda f: (severity_rank(f.severity), -(f.estimated_saving_pct or 0.0))
    )
