"""The rule reference, generated from the rules themselves (``python -m diagnostics rules``).

Each rule's docstring (the class's, else its module's) holds the sections *What it finds*,
*Why it matters* and *How to fix*; what it needs is the text of its ``Rule.needs`` (the
declaration that also gates it); the thresholds it reads come from
``Rule.threshold_names`` and their defaults and sources from ``diagnostics.thresholds``.
``docs/RULES.md`` is this module's output, checked by a test to stay in sync.

Regenerate it with ``python -m diagnostics.rules.docs -o docs/RULES.md``.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from diagnostics.rules.base import Rule
from diagnostics.rules.registry import RULES
from diagnostics.text_output import emit_or_exit_code
from diagnostics.thresholds import Thresholds

SECTIONS: tuple[str, ...] = ("What it finds", "Why it matters", "How to fix")


@dataclass(frozen=True)
class RuleDoc:
    id: str
    title: str
    severity: str
    needs: tuple[str, ...]  # each need's text, in the order the rule checks them
    summary: str
    sections: dict[str, str]
    thresholds: tuple[tuple[str, Any, str, str], ...]  # name, default, doc, source
    examples: tuple[tuple[str, bool], ...]  # name, fires

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "severity": self.severity,
            "needs": list(self.needs),
            "summary": self.summary,
            "sections": dict(self.sections),
            "thresholds": [
                {"name": n, "default": d, "doc": doc, "source": src}
                for n, d, doc, src in self.thresholds
            ],
            "examples": [{"name": n, "fires": f} for n, f in self.examples],
        }

    @property
    def needs_text(self) -> str:
        return "; ".join(self.needs) or "nothing"


def rule_docstring(rule: Rule) -> str:
    own = type(rule).__dict__.get("__doc__")
    if own:
        return inspect.cleandoc(own)
    module = sys.modules[type(rule).__module__]
    return inspect.cleandoc(module.__doc__ or "")


def parse_docstring(text: str) -> tuple[str, dict[str, str]]:
    """(first line, {section heading: dedented body}) of a rule docstring."""
    lines = text.splitlines()
    summary = lines[0].strip() if lines else ""
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in lines[1:]:
        heading = line.strip()
        if heading in SECTIONS and not line.startswith(" "):
            current = heading
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    # reStructuredText ``literals`` read as Markdown `code`
    return summary.replace("``", "`"), {
        name: inspect.cleandoc("\n".join(body)).strip().replace("``", "`")
        for name, body in sections.items()
    }


def rule_doc(rule: Rule) -> RuleDoc:
    summary, sections = parse_docstring(rule_docstring(rule))
    # module docstrings open with "rule-id: summary"; the heading already shows the id
    prefix = f"{rule.id}: "
    if summary.startswith(prefix):
        summary = summary[len(prefix) :]
        summary = summary[:1].upper() + summary[1:]
    known = {row[0]: row for row in Thresholds.field_docs()}
    return RuleDoc(
        id=rule.id,
        title=rule.title,
        severity=str(rule.severity),
        needs=tuple(need.text for need in rule.needs),
        summary=summary,
        sections=sections,
        thresholds=tuple(known[name] for name in rule.threshold_names),
        examples=tuple((e.name, e.fires) for e in rule.examples),
    )


def rule_reference(rules: Sequence[Rule] = RULES) -> list[RuleDoc]:
    return [rule_doc(rule) for rule in rules]


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(rules: Sequence[Rule] = RULES) -> str:
    docs = rule_reference(rules)
    out = [
        "# Rule reference",
        "",
        "Generated from the rules by `python -m diagnostics rules` "
        "(`diagnostics/rules/docs.py`); do not edit by hand.",
        "",
        "Every threshold can be overridden from one TOML or JSON file (or a mapping): "
        "`python -m diagnostics analyze PATH --thresholds t.toml`, or "
        '`analyze(path, thresholds="t.toml")` (`diagnostics/thresholds.py`). Severities '
        "below are the rules' defaults; a finding is rated up or down by the size of its "
        "evidence.",
        "",
        "```toml",
        "[thresholds]",
        "dataloader_share_min_pct = 10.0",
        "```",
        "",
        "| id | severity | title |",
        "|---|---|---|",
    ]
    out += [f"| [`{d.id}`](#{d.id}) | {d.severity} | {_cell(d.title)} |" for d in docs]
    for d in docs:
        out += [
            "",
            f"## {d.id}",
            "",
            f"**{d.title}** · default severity `{d.severity}` · needs {d.needs_text}",
        ]
        out += ["", d.summary]
        for name in SECTIONS:
            if name in d.sections:
                out += ["", f"### {name}", "", d.sections[name]]
        if d.thresholds:
            out += ["", "### Thresholds", "", "| name | default | meaning | source |"]
            out += ["|---|---|---|---|"]
            out += [
                f"| `{n}` | {default} | {_cell(doc)} | {_cell(src)} |"
                for n, default, doc, src in d.thresholds
            ]
        if d.examples:
            out += ["", "### Examples (run as tests)", ""]
            out += [f"- {'fires' if fires else 'quiet'}: {name}" for name, fires in d.examples]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m diagnostics rules", description="Print the rule reference."
    )
    parser.add_argument("--format", choices=("md",), default="md")
    parser.add_argument("-o", "--output", help="write to this file instead of stdout")
    args = parser.parse_args(argv)
    return emit_or_exit_code(render_markdown(), args.output)


if __name__ == "__main__":
    raise SystemExit(main())
