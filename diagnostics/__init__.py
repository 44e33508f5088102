"""Pipeline Doctor's analyser: traces and run folders in, findings with evidence out.

``from diagnostics import analyze, analyze_files, AnalysisResult, InputError``. The names
are loaded on first use, so importing a submodule (``diagnostics.views``, the CLI's usage
errors) does not pay for polars and the rules.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diagnostics.analyze import analyze, analyze_files
    from diagnostics.errors import InputError
    from diagnostics.result import AnalysisResult

_EXPORTS = {
    "analyze": "diagnostics.analyze",
    "analyze_files": "diagnostics.analyze",
    "AnalysisResult": "diagnostics.result",
    "InputError": "diagnostics.errors",
}

__all__ = ["AnalysisResult", "InputError", "analyze", "analyze_files"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'diagnostics' has no attribute {name!r}")
    return getattr(import_module(module), name)
