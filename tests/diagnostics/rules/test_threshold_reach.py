"""Every threshold a rule declares reaches the rule: moving it changes what the rule says.

A threshold that a helper re-reads from ``Thresholds()`` (the defaults) silently ignores the
user's ``--thresholds`` file; these tests catch that for every rule in the registry.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
from pathlib import Path

import pytest

from diagnostics.rules import examples as ex
from diagnostics.rules.registry import RULES
from diagnostics.thresholds import Thresholds

FIELDS = {f.name: f for f in dataclasses.fields(Thresholds)}
DEFAULTS = Thresholds()
RULES_DIR = Path(importlib.import_module("diagnostics.rules").__file__).parent

CASES = [
    pytest.param(rule, name, id=f"{rule.id}::{name}")
    for rule in RULES
    for name in rule.threshold_names
]


# thresholds that size the advice (saving, workers) or annotate the evidence rather than decide
# whether the rule fires; the test above sees their effect
SIZING = {
    "tensor_core_bf16_step_ratio",
    "cores_reserved_for_main",
    "worker_headroom",
    "worker_count_tolerance_pct",
    "launch_delay_outlier_us",  # says whether launches queue, in the evidence
    "straggler_cause_min_share_pct",  # names the straggler's cause
    "snapshot_oom_site_min_pct",  # names the out-of-memory error's cause (one site or many)
}
GATING_CASES = [case for case in CASES if case.values[1] not in SIZING]


def _candidates(name: str) -> list[float | int]:
    """Values on either side of the default, far enough to cross any example's margin."""
    default = getattr(DEFAULTS, name)
    values = [0, default * 0.5, default * 2, default * 100, default + 1000]
    if isinstance(default, int):
        # counts and windows of 0 are degenerate (an empty window), so ints start at 1
        return sorted({max(int(v), 1) for v in values})
    return sorted({float(v) for v in values} | {0.99})


def _said(rule, inputs, thresholds: Thresholds) -> str:
    if rule.skip_reason(inputs) is not None:
        return "skipped"
    # as the engine does: a rule that cannot tell on these thresholds says so
    cannot_tell = rule.cannot_tell(inputs, thresholds)
    if cannot_tell is not None:
        return cannot_tell
    return json.dumps([f.to_dict() for f in rule.check(inputs, thresholds)], sort_keys=True)


@pytest.mark.parametrize(("rule", "name"), CASES)
def test_moving_a_declared_threshold_changes_what_the_rule_says(rule, name):
    examples = [example.build() for example in rule.examples]
    baseline = [_said(rule, inputs, DEFAULTS) for inputs in examples]
    for value in _candidates(name):
        moved = dataclasses.replace(DEFAULTS, **{name: value})
        if [_said(rule, inputs, moved) for inputs in examples] != baseline:
            return
    pytest.fail(f"{rule.id}: moving {name} changed nothing on its examples")


@pytest.mark.parametrize(("rule", "name"), GATING_CASES)
def test_a_firing_example_stops_or_starts_firing_when_its_threshold_moves(rule, name):
    """Where a threshold gates the finding, crossing it turns the finding on or off."""
    examples = [example.build() for example in rule.examples]
    fired = [bool(_said(rule, i, DEFAULTS) not in ("skipped", "[]")) for i in examples]
    for value in _candidates(name):
        moved = dataclasses.replace(DEFAULTS, **{name: value})
        now = [bool(_said(rule, i, moved) not in ("skipped", "[]")) for i in examples]
        if now != fired:
            return
    pytest.fail(f"{rule.id}: no example crosses {name}")


def _fields_read(tree: ast.AST) -> set[str]:
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in FIELDS
    }


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_declared_thresholds_are_exactly_those_the_rule_module_reads(rule):
    tree = ast.parse(inspect.getsource(inspect.getmodule(type(rule))))
    assert set(rule.threshold_names) == _fields_read(tree)


class _Recording(Thresholds):
    """Thresholds that note which fields are read (to catch reads through helpers)."""

    def __getattribute__(self, attr: str):
        if attr in FIELDS:
            object.__getattribute__(self, "__dict__").setdefault("_read", set()).add(attr)
        return object.__getattribute__(self, attr)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_a_rule_reads_no_threshold_it_does_not_declare(rule):
    recording = _Recording()
    for example in rule.examples:
        inputs = example.build()
        if rule.skip_reason(inputs) is None:
            rule.check(inputs, recording)
    read = recording.__dict__.get("_read", set())
    assert read, f"{rule.id} read no threshold on its examples"
    assert read <= set(rule.threshold_names), read - set(rule.threshold_names)


def test_no_rule_or_helper_builds_its_own_default_thresholds():
    # the engine is the one place that resolves the user's thresholds
    helpers = [*RULES_DIR.glob("*.py"), *(RULES_DIR.parent / "facts").glob("*.py")]
    for path in sorted(p for p in helpers if p.name != "engine.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            named = node.func if isinstance(node, ast.Call) else node
            name = getattr(named, "id", None) or getattr(named, "attr", None)
            assert name not in {"Thresholds", "DEFAULT_THRESHOLDS", "load_thresholds"} or not (
                isinstance(node, ast.Call) or name == "DEFAULT_THRESHOLDS"
            ), f"{path.name}:{node.lineno} builds default thresholds; pass the rule's own down"


def test_memory_leak_reserved_slope_uses_the_callers_warmup_share():
    """The reserved-memory slope honours ``leak_warmup_share`` like the allocated one.

    Reserved memory climbs over the first 30 steps, then stays flat; allocated leaks
    throughout. A warm-up of 75% of 40 steps leaves only the flat part of reserved memory.
    """
    rule = next(r for r in RULES if r.id == "memory-leak")
    inputs = ex.inputs(
        run=ex.run(
            ex.series(
                40,
                cuda_allocated_bytes=lambda s: 2**30 + s * 2**23,
                cuda_reserved_bytes=lambda s: 2**31 + min(s, 30) * 2**24,
                rss_bytes=3 * 2**30,
            ),
            environment={**ex.CUDA_ENV, "gpu_memory_bytes": 80 * 2**30},
        )
    )
    default = rule.check(inputs, DEFAULTS)[0].evidence["reserved_slope_bytes_per_step"]
    late = dataclasses.replace(DEFAULTS, leak_warmup_share=0.75, leak_min_steps=5)
    moved = rule.check(inputs, late)[0].evidence["reserved_slope_bytes_per_step"]
    assert default > 0  # the default warm-up keeps part of the climb
    assert moved == 0  # the caller's warm-up leaves only the flat part
