"""Every rule, listed explicitly (no reflection): add a rule here and its examples run."""

from __future__ import annotations

from diagnostics.rules.base import Rule
from diagnostics.rules.low_gpu_utilization import LowGpuUtilization
from diagnostics.rules.memory_leak import MemoryLeak
from diagnostics.rules.missing_pin_memory import MissingPinMemory
from diagnostics.rules.too_few_workers import TooFewWorkers
from diagnostics.rules.unstable_gradients import UnstableGradients

RULES: tuple[Rule, ...] = (
    # the five the app, the reports and users' CI gates rely on (ids fixed)
    LowGpuUtilization(),
    MissingPinMemory(),
    TooFewWorkers(),
    UnstableGradients(),
    MemoryLeak(),
)


def rule_by_id(rule_id: str) -> Rule:
    for rule in RULES:
        if rule.id == rule_id:
            return rule
    raise KeyError(f"unknown rule {rule_id!r}; known: {', '.join(r.id for r in RULES)}")
