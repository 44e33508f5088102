"""Reports: the report model, plotly figures and the HTML / Markdown / JSON renderers.

``render_html``, ``render_markdown``, ``render_json``, ``build_report`` and
``build_comparison_report`` are importable from here; they load on first use, so importing
a submodule (``report.fmt``) does not load plotly. The headline numbers live below this
package, in ``diagnostics.metrics``.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "render_html": "diagnostics.report.html",
    "render_markdown": "diagnostics.report.markdown",
    "render_json": "diagnostics.report.json_report",
    "build_report": "diagnostics.report.model",
    "build_comparison_report": "diagnostics.report.model",
    "Report": "diagnostics.report.model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'diagnostics.report' has no attribute {name!r}")
