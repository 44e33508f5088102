"""Runs every registered rule over AnalysisInputs; a rule that breaks never hides the rest."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from diagnostics.model import AnalysisInputs
from diagnostics.rules.base import Finding, RulesOutcome, Skipped
from diagnostics.rules.registry import RULES
from diagnostics.severity import order_findings
from diagnostics.thresholds import load_thresholds


def run_rules(inputs: AnalysisInputs, thresholds: Any = None) -> RulesOutcome:
    """Findings (most severe first, then by estimated saving), skips and rule errors.

    ``thresholds`` is a :class:`Thresholds`, a mapping of overrides, a .toml/.json path, or
    None for the defaults; a bad config raises ThresholdsError before any rule runs.
    """
    resolved = load_thresholds(thresholds)
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    errors: list[Skipped] = []
    for rule in RULES:
        reason = rule.skip_reason(inputs)
        if reason is not None:
            skipped.append(Skipped(rule.id, reason))
            continue
        try:
            reason = rule.cannot_tell(inputs, resolved)
            if reason is not None:
                skipped.append(Skipped(rule.id, reason))
                continue
            findings.extend(rule.check(inputs, resolved))
        except Exception as exc:  # a broken rule is reported, the others still run
            errors.append(Skipped(rule.id, f"{type(exc).__name__}: {exc}"))
    findings = _link_related(findings)
    if inputs.run is None or inputs.run.kind == "script":
        findings = [_without_trainer_patch(f) for f in findings]
    return RulesOutcome(tuple(order_findings(findings)), tuple(skipped), tuple(errors))


def _without_trainer_patch(finding: Finding) -> Finding:
    """An uploaded trace or a script run is someone else's job: its fix is the code for
    their own training script (``fix.code``); a config patch of reference-trainer keys is
    offered only for runs of the trainer. A script run keeps a patch written wholly in the
    keys ``pipeline-doctor profile --override`` takes (``dataloader.*``)."""
    patch = finding.fix.config_patch
    if patch is None:
        return finding
    if all(key.startswith("dataloader.") for key in patch):
        return finding
    return replace(finding, fix=replace(finding.fix, config_patch=None))


def _link_related(findings: list[Finding]) -> list[Finding]:
    """A finding naming ``related_rules`` (rules whose cause it measured, e.g. where the GPU
    idle time went) learns which of them actually fired: ``explained_by_findings``."""
    fired = {f.rule for f in findings}
    linked = []
    for finding in findings:
        related = finding.evidence.get("related_rules")
        if isinstance(related, list):
            explained = [rule for rule in related if rule in fired and rule != finding.rule]
            finding = replace(
                finding, evidence={**finding.evidence, "explained_by_findings": explained}
            )
        linked.append(finding)
    return linked
