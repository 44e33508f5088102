"""The README is the front door: its rule table and config keys must not drift from the code."""

from __future__ import annotations

import re

from diagnostics.rules.registry import RULES
from trainer.launch import config_fields


def _readme(repo_root) -> str:
    return (repo_root / "README.md").read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    following = re.search(r"^## ", text[start + len(heading) :], flags=re.MULTILINE)
    return text[start : start + len(heading) + following.start()] if following else text[start:]


def test_rule_table_lists_exactly_the_registered_rules(repo_root):
    section = _section(_readme(repo_root), "## Diagnostic rules")
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.MULTILINE))
    assert listed == {rule.id for rule in RULES}


def test_every_config_key_is_documented_with_its_default(repo_root):
    section = _section(_readme(repo_root), "### Config keys")
    for field in config_fields():
        row = next((line for line in section.splitlines() if f"`{field.key}`" in line), None)
        assert row is not None, f"{field.key} is missing from the README's config table"
        default = "null" if field.default is None else str(field.default).lower()
        assert f"`{default}`" in row.lower(), f"{field.key}: README default is not {default}"


def test_readme_test_command_is_what_ci_runs(repo_root):
    assert "scripts/test.sh" in _readme(repo_root)
    assert "scripts/test.sh" in (repo_root / ".ci" / "run").read_text(encoding="utf-8")
