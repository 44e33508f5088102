"""Every registered rule's own examples: must-fire ones fire, must-not-fire ones stay quiet.

Adding a rule to the registry adds its examples here; nothing else needs editing.
"""

from __future__ import annotations

import json

import pytest

from diagnostics.rules.base import Finding, Severity
from diagnostics.rules.registry import RULES
from diagnostics.thresholds import Thresholds

CASES = [
    pytest.param(rule, example, id=f"{rule.id}::{example.name}")
    for rule in RULES
    for example in rule.examples
]


@pytest.mark.parametrize(("rule", "example"), CASES)
def test_example(rule, example):
    inputs = example.build()
    skip = rule.skip_reason(inputs)
    # silent by a skip or silent after a check: each example says which, so a rule whose
    # need wrongly fails on an input it should judge cannot pass its quiet examples
    if example.skipped:
        assert not example.fires, f"{example.name!r}: a skipped example cannot fire"
        assert skip is not None, f"{rule.id} was not skipped on {example.name!r}"
        return
    assert skip is None, f"{rule.id} skipped {example.name!r}: {skip}"
    findings = rule.check(inputs, Thresholds())
    if example.fires:
        assert findings, f"{rule.id} did not fire on {example.name!r}"
        for finding in findings:
            _assert_complete(rule, finding)
            if example.expect is not None:
                example.expect(finding)
    else:
        assert findings == [], f"{rule.id} fired on {example.name!r}: {findings[0].title}"


def _assert_complete(rule, finding: Finding) -> None:
    """A finding shows its evidence and says how to fix it, in JSON-safe form."""
    assert finding.rule == rule.id
    assert isinstance(finding.severity, Severity)
    assert finding.title and finding.recommendation
    assert finding.evidence, "a finding without evidence"
    assert (
        "steps" in finding.evidence
        or "time_range_us" in finding.evidence
        or ("time_range_s" in finding.evidence)
    ), "evidence must say which steps or time range it comes from"
    assert finding.fix.code.count("# before") == 1 and finding.fix.code.count("# after") == 1
    if finding.fix.config_patch is not None:
        assert all("." in key for key in finding.fix.config_patch)
    if finding.estimated_saving_pct is not None:
        assert 0.0 <= finding.estimated_saving_pct <= 100.0
    json.dumps(finding.to_dict(), allow_nan=False)


def test_every_rule_has_both_kinds_of_example():
    for rule in RULES:
        kinds = {example.fires for example in rule.examples}
        assert kinds == {True, False}, f"{rule.id} needs must-fire and must-not-fire examples"
