"""The rule contract: a Rule inspects AnalysisInputs and returns Findings with evidence.

A rule module defines one subclass of ``Rule`` with a stable ``id``, a ``title``, a
docstring headed *What it finds* / *Why it matters* / *How to fix*, the ``needs`` it has
(``trace``, ``run_steps``, ``run_samples``, ``run_config``, ``gpu``), the
``threshold_names`` it reads from :class:`diagnostics.thresholds.Thresholds`, and
``examples``: small inputs that must fire and must not fire, run by the test suite
automatically.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from diagnostics.chart import Chart
from diagnostics.model import AnalysisInputs
from diagnostics.severity import SEVERITY_ORDER
from diagnostics.thresholds import Thresholds


class Severity(StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"

    @property
    def rank(self) -> int:
        return SEVERITY_ORDER[self.value]


@dataclass(frozen=True)
class Fix:
    code: str  # before/after snippet for the user's own training code
    # reference-trainer keys, usable as --set; only for runs of the trainer (the engine drops
    # it on uploaded traces, whose fix is ``code`` for the user's own script)
    config_patch: dict[str, Any] | None = None


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
    title: str
    evidence: dict[str, Any]  # numbers, steps/time range, and a Chart under "chart"
    recommendation: str
    fix: Fix
    estimated_saving_pct: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": str(self.severity),
            "title": self.title,
            "evidence": {
                key: value.to_dict() if isinstance(value, Chart) else value
                for key, value in self.evidence.items()
            },
            "recommendation": self.recommendation,
            "fix": {"code": self.fix.code, "config_patch": self.fix.config_patch},
            "estimated_saving_pct": self.estimated_saving_pct,
        }


@dataclass(frozen=True)
class Skipped:
    rule: str
    reason: str


@dataclass(frozen=True)
class Example:
    """A small input for a rule's own tests: ``fires`` says whether it must fire."""

    name: str
    fires: bool
    build: Callable[[], AnalysisInputs]


class Rule:
    id: ClassVar[str]
    title: ClassVar[str]
    severity: ClassVar[Severity]
    needs: ClassVar[frozenset[str]] = frozenset()
    examples: ClassVar[Sequence[Example]] = ()
    # names of the diagnostics.thresholds.Thresholds fields the rule reads (for the docs)
    threshold_names: ClassVar[tuple[str, ...]] = ()

    def skip_reason(self, inputs: AnalysisInputs) -> str | None:
        """Why this rule cannot judge these inputs, or None when it can."""
        return None

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        raise NotImplementedError


@dataclass(frozen=True)
class RulesOutcome:
    findings: tuple[Finding, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    errors: tuple[Skipped, ...] = field(default=())
