"""The rule contract: a Rule inspects AnalysisInputs and returns Findings with evidence.

A rule module defines one subclass of ``Rule`` with a stable ``id``, a ``title``, a
docstring headed *What it finds* / *Why it matters* / *How to fix*, the ``needs`` it has
(:class:`Need`: the one declaration of what it requires, which both gates it and documents
it), the ``threshold_names`` it reads from :class:`diagnostics.thresholds.Thresholds`, and
``examples``: small inputs that must fire and must not fire, run by the test suite
automatically.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, final

from diagnostics.chart import Chart
from diagnostics.model import AnalysisInputs
from diagnostics.rules.evidence import cuda_trace, has_steps, run_device
from diagnostics.thresholds import Thresholds


class Severity(StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


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
    # what a must-fire example's finding must show: raises AssertionError when it does not
    # (the examples harness calls it on each finding); None: only that it fires
    expect: Callable[[Finding], None] | None = None
    # a must-not-fire example the rule is skipped on (one of its needs unmet), not one it
    # checks and finds nothing in: the harness holds each example to the one it declares
    skipped: bool = False


@dataclass(frozen=True)
class Need:
    """An input a rule cannot judge without. A rule's ``needs`` are checked in order: the
    first unmet one skips the rule with its ``skip`` message, and the rule reference lists
    each ``text``, so what gates a rule and what its page says cannot drift apart."""

    text: str  # what is needed, for the docs: "a CUDA trace"
    met: Callable[[AnalysisInputs], bool]
    # why a rule without it is skipped; a callable words it by what the inputs do hold;
    # None: "needs <text>"
    skip: str | Callable[[AnalysisInputs], str] | None = None

    def reason(self, inputs: AnalysisInputs) -> str | None:
        """None when the need is met, else why the rule is skipped."""
        if self.met(inputs):
            return None
        if self.skip is None:
            return f"needs {self.text}"
        return self.skip if isinstance(self.skip, str) else self.skip(inputs)


def on_cuda(inputs: AnalysisInputs) -> bool:
    """A CUDA trace, or a run that trained on a CUDA device."""
    if cuda_trace(inputs) is not None:
        return True
    return inputs.run is not None and run_device(inputs.run) == "cuda"


TRACE = Need("a trace", lambda inputs: inputs.trace is not None)


def need_cuda_trace(why: str | None = None) -> Need:
    """A trace of CUDA work; ``why`` says what only a GPU profile shows."""
    return Need(
        "a CUDA trace",
        lambda inputs: cuda_trace(inputs) is not None,
        f"needs a CUDA trace: {why}" if why else None,
    )


def need_cuda(what: str) -> Need:
    """A CUDA trace or a CUDA run; ``what`` names the judgement in the skip message."""

    def skip(inputs: AnalysisInputs) -> str:
        if inputs.trace is None and inputs.run is None:
            return "no trace and no run records to read"
        if inputs.run is not None and run_device(inputs.run) == "cpu":
            return f"the run trained on CPU: {what} needs a CUDA device"
        return f"the trace has no GPU activity: {what} needs a CUDA trace"

    return Need("a CUDA trace or a CUDA run", on_cuda, skip)


def need_trace_host_side(what: str) -> Need:
    """A trace that holds its CPU side (operators or runtime calls): a GPU-only trace shows
    ``what`` no more than it shows the host."""
    return Need(
        "a trace with its CPU side (operators, runtime calls)",
        lambda inputs: inputs.trace is not None and inputs.trace.host_side,
        f"the trace has no CPU side (a GPU-only trace): {what} cannot be seen",
    )


def need_run_steps(*columns: str) -> Need:
    """Run step records with a value in each of ``columns``."""
    return Need(
        f"run step records with {' and '.join(columns)}",
        lambda inputs: has_steps(inputs.run, *columns),
    )


def need_trainer_config(keys: str) -> Need:
    """A run of the reference trainer, whose config (``keys``) the rule reads; a script run
    (a user's own script under ``pipeline-doctor profile``) has none, so the rule stays
    silent on it and says why."""

    def skip(inputs: AnalysisInputs) -> str:
        if inputs.run is None:
            # worded for an uploaded trace: someone else's job, so no trainer advice
            return f"needs the run's DataLoader and epoch records ({keys}): a trace has none"
        return f"a script run: this judgement reads the reference trainer's config ({keys})"

    return Need(
        f"a run of the reference trainer (its config: {keys})",
        lambda inputs: inputs.run is not None and inputs.run.kind != "script",
        skip,
    )


def need_any(*needs: Need, text: str | None = None, skip: str | None = None) -> Need:
    """One of ``needs`` (e.g. run records or a trace); ``text`` and ``skip`` default to
    theirs joined by "or"."""
    return Need(
        text or " or ".join(n.text for n in needs),
        lambda inputs: any(n.met(inputs) for n in needs),
        skip,
    )


class Rule:
    id: ClassVar[str]
    title: ClassVar[str]
    severity: ClassVar[Severity]
    needs: ClassVar[tuple[Need, ...]] = ()
    examples: ClassVar[Sequence[Example]] = ()
    # names of the diagnostics.thresholds.Thresholds fields the rule reads (for the docs)
    threshold_names: ClassVar[tuple[str, ...]] = ()

    @final
    def skip_reason(self, inputs: AnalysisInputs) -> str | None:
        """Why this rule cannot judge these inputs, or None when it can: the first unmet
        need, then :meth:`not_applicable`. Rules declare ``needs`` and never override this."""
        for need in self.needs:
            reason = need.reason(inputs)
            if reason is not None:
                return reason
        return self.not_applicable(inputs)

    def not_applicable(self, inputs: AnalysisInputs) -> str | None:
        """With every need met: why the inputs still leave the rule nothing to judge (the
        workers it would watch do not restart, say), or None."""
        return None

    def cannot_tell(self, inputs: AnalysisInputs, thresholds: Thresholds) -> str | None:
        """With the inputs judgeable: why this rule's figure cannot be trusted on them under
        these thresholds (too little of the kernel time is classified, say), or None. The
        engine reports it as a skip, like an unmet need."""
        return None

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        raise NotImplementedError


@dataclass(frozen=True)
class RulesOutcome:
    findings: tuple[Finding, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    errors: tuple[Skipped, ...] = field(default=())
