"""Every rule, listed explicitly (no reflection): add a rule here and its examples run."""

from __future__ import annotations

from diagnostics.rules.base import Rule

RULES: tuple[Rule, ...] = ()
