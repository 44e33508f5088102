"""The report formats: one registry of name -> renderer, file label and media type.

The report CLI's ``--format`` choices, the pages' download buttons and every "render this
report as ..." call read it. Renderers load on first use, so the CLI's usage errors do not
pay for plotly.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any


@dataclass(frozen=True)
class ReportFormat:
    name: str  # also the file extension
    label: str  # the download button's text
    mime: str
    renderer: str  # "module:function" taking a Report and returning its text

    def render(self, report: Any) -> str:
        module, function = self.renderer.split(":")
        return str(getattr(import_module(module), function)(report))


REPORT_FORMATS: tuple[ReportFormat, ...] = (
    ReportFormat("html", "HTML report", "text/html", "diagnostics.report.html:render_html"),
    ReportFormat(
        "md", "Markdown report", "text/markdown", "diagnostics.report.markdown:render_markdown"
    ),
    ReportFormat(
        "json", "JSON report", "application/json", "diagnostics.report.json_report:render_json"
    ),
)
FORMAT_NAMES: tuple[str, ...] = tuple(f.name for f in REPORT_FORMATS)


def report_format(name: str) -> ReportFormat:
    for candidate in REPORT_FORMATS:
        if candidate.name == name:
            return candidate
    raise ValueError(f"unknown report format {name!r}; expected one of {', '.join(FORMAT_NAMES)}")


def render_report(report: Any, name: str) -> str:
    """The report as text in the format called ``name`` (html, md or json)."""
    return report_format(name).render(report)
