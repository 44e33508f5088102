"""The README is the front door and docs/ holds the reference: neither may drift from the code.

The config-key table moved to the generated docs/CONFIG.md; its check is in
tests/trainer/test_config_docs.py.
"""

from __future__ import annotations

import re

from diagnostics.result import SUMMARY_KEYS
from diagnostics.rules.registry import RULES
from diagnostics.trace.schema import EVENT_SCHEMA

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _readme(repo_root) -> str:
    return (repo_root / "README.md").read_text(encoding="utf-8")


def _doc(repo_root, name: str) -> str:
    return (repo_root / "docs" / name).read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    following = re.search(r"^## ", text[start + len(heading) :], flags=re.MULTILINE)
    return text[start : start + len(heading) + following.start()] if following else text[start:]


def _table_names(section: str) -> set[str]:
    """Every `name` in a table's first column (a cell may list several)."""
    names: set[str] = set()
    for cell in re.findall(r"^\| (.*?) \|", section, flags=re.MULTILINE):
        names |= set(re.findall(r"`([a-z_]+)`", cell))
    return names


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(text: str) -> set[str]:
    outside_code = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", outside_code, flags=re.MULTILINE)}


def _anchors_of(path) -> set[str]:
    return _anchors(path.read_text(encoding="utf-8"))


def test_rule_table_lists_exactly_the_registered_rules(repo_root):
    section = _section(_readme(repo_root), "## Diagnostic rules")
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.MULTILINE))
    assert listed == {rule.id for rule in RULES}


def test_readme_test_command_is_what_ci_runs(repo_root):
    assert "scripts/test.sh" in _readme(repo_root)
    assert "scripts/test.sh" in (repo_root / ".ci" / "run").read_text(encoding="utf-8")


def test_readme_gives_the_two_commands_and_links_every_reference_doc(repo_root):
    readme = _readme(repo_root)
    assert "scripts/app.sh" in _section(readme, "## Two commands")
    assert "scripts/test.sh" in _section(readme, "## Two commands")
    linked = set(LINK.findall(readme))
    for path in sorted((repo_root / "docs").glob("*.md")):
        assert f"docs/{path.name}" in linked, f"README does not link docs/{path.name}"


def test_result_json_table_lists_exactly_the_summary_keys(repo_root):
    section = _section(_doc(repo_root, "ANALYSIS.md"), "## Result JSON")
    assert _table_names(section) == set(SUMMARY_KEYS)


def test_event_table_lists_exactly_the_schema_columns(repo_root):
    section = _section(_doc(repo_root, "ANALYSIS.md"), "## Event table")
    assert _table_names(section) == set(EVENT_SCHEMA)


def test_every_relative_link_in_readme_and_docs_resolves(repo_root):
    pages = [repo_root / "README.md", *sorted((repo_root / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            linked = (page.parent / path_part).resolve() if path_part else page
            if not linked.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and linked.is_file() and anchor not in _anchors_of(linked):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken
