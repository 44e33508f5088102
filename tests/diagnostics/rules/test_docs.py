"""The rule reference is generated from the rules, and docs/RULES.md is that output."""

from __future__ import annotations

from diagnostics.rules.docs import SECTIONS, main, render_markdown, rule_reference
from diagnostics.rules.registry import CORE_RULE_IDS, RULES


def test_docs_rules_md_is_the_generators_output(repo_root):
    committed = (repo_root / "docs" / "RULES.md").read_text(encoding="utf-8")
    assert committed == render_markdown(), (
        "docs/RULES.md is stale: run python -m diagnostics.rules.docs -o docs/RULES.md"
    )


def test_every_rule_documents_what_why_and_how():
    for doc in rule_reference():
        assert doc.summary, doc.id
        for section in SECTIONS:
            assert len(doc.sections.get(section, "")) > 40, f"{doc.id}: {section!r} missing"


def test_reference_lists_every_rule_with_its_thresholds():
    text = render_markdown()
    for rule in RULES:
        assert f"## {rule.id}\n" in text
        for name in rule.threshold_names:
            assert f"`{name}`" in text


def test_registry_ids_are_unique_and_include_the_five_core_rules():
    ids = [rule.id for rule in RULES]
    assert len(ids) == len(set(ids))
    assert set(CORE_RULE_IDS) <= set(ids)


def test_main_prints_the_reference(capsys):
    assert main([]) == 0
    assert capsys.readouterr().out == render_markdown()


def test_main_writes_a_file_and_reports_an_unwritable_path(tmp_path, capsys):
    out = tmp_path / "RULES.md"
    assert main(["--format", "md", "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render_markdown()
    assert main(["-o", str(tmp_path / "missing" / "RULES.md")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
