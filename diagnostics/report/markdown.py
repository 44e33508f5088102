"""The report as Markdown for an issue or a pull request: tables and fenced code.

Text from a trace or a run is escaped: ``<``, ``>`` and ``&`` as entities (GitHub would
otherwise render inline HTML), Markdown's punctuation in running text, ``|`` and newlines
inside table cells. Code goes into a fence longer than any backtick run inside it.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable

from diagnostics.report import fmt
from diagnostics.report.model import Report, ReportFinding
from diagnostics.report.pricing import GPU_PRICES, PRICES_DATED, CostEstimate, saving_note

_MD_PUNCT = re.compile(r"([\\`*_\[\]~])")


def text(value: object) -> str:
    """Running text: HTML entities and Markdown punctuation escaped, lines kept."""
    return _MD_PUNCT.sub(r"\\\1", html.escape(str(value), quote=False))


def cell(value: object) -> str:
    """A table cell: as text, with ``|`` escaped and line breaks as <br>."""
    escaped = text(value).replace("|", "\\|")
    return "<br>".join(part for part in escaped.replace("\r\n", "\n").split("\n"))


def table(head: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    head = list(head)
    lines = [
        "| " + " | ".join(cell(h) for h in head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    lines.extend("| " + " | ".join(cell(v) for v in row) + " |" for row in rows)
    return "\n".join(lines)


def fence(code: str, lang: str = "") -> str:
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{code.rstrip()}\n{ticks}"


def _finding(index: int, finding: ReportFinding) -> str:
    status = f" ({text(finding.status)})" if finding.status else ""
    parts = [
        f"### {index}. [{finding.severity.upper()}] {text(finding.title)}{status}",
        f"Rule `{finding.rule.replace('`', '')}`"
        + (
            f" · expected saving: about {fmt.saving(finding.estimated_saving_pct)}"
            if finding.estimated_saving_pct is not None
            else ""
        ),
    ]
    if finding.recommendation:
        parts.append(text(finding.recommendation))
    if finding.evidence_rows:
        parts.append(table(("evidence", "value"), finding.evidence_rows))
    if finding.fix_code:
        parts.append("**Fix**\n\n" + fence(finding.fix_code, "python"))
    if finding.config_patch:
        heading = (
            "**DataLoader overrides** (your script, no edit)"
            if finding.for_script
            else "**Config patch** (reference trainer)"
        )
        parts.append(
            heading
            + "\n\n"
            + fence(json.dumps(finding.config_patch, indent=2, default=str), "json")
            + "\n\n"
            + fence(finding.rerun_command or "", "bash")
        )
    return "\n\n".join(parts)


def _cost(cost: CostEstimate) -> str:
    origin = (
        f"default estimate for {cost.gpu}, {cost.tier.replace('_', '-')}, prices gathered {PRICES_DATED}"
        if cost.price_is_default
        else "price set by you"
    )
    rate = cost.usd_per_gpu_hour * cost.gpus / 3600.0

    def money(seconds: float | None) -> str:
        return fmt.usd(None if seconds is None else seconds * rate)

    epoch = (
        f"per epoch ({fmt.number(cost.steps_per_epoch)} steps)"
        if cost.steps_per_epoch
        else "per epoch"
    )
    rows = [
        (
            "per 1,000 steps",
            fmt.seconds(cost.time_per_1000_steps_s),
            money(cost.time_per_1000_steps_s),
            fmt.seconds(cost.after_time_per_1000_steps_s),
            money(cost.after_time_per_1000_steps_s),
        ),
        (
            epoch,
            fmt.seconds(cost.time_per_epoch_s),
            money(cost.time_per_epoch_s),
            fmt.seconds(cost.after_time_per_epoch_s),
            money(cost.after_time_per_epoch_s),
        ),
    ]
    return "\n\n".join(
        [
            "## Cost",
            f"At {fmt.unit_price(cost.usd_per_gpu_hour)} per {cost.unit}-hour ({text(origin)}) "
            f"× {cost.gpus} {cost.unit}(s), mean step time {fmt.ms(cost.step_time_ms)}.",
            table(("", "time now", "cost now", "time after fixes", "cost after fixes"), rows),
            f"Steps per epoch: {text(cost.steps_per_epoch_note)}. {saving_note(cost)} "
            "Estimates, not quotes.",
            f"Default prices (estimates gathered {PRICES_DATED}; where each comes from):",
            table(
                ("device", "unit", "on-demand", "spot / preemptible", "source"),
                (
                    (
                        p.name,
                        f"per {p.unit}-hour",
                        fmt.unit_price(p.on_demand_usd_per_hour),
                        fmt.unit_price(p.spot_usd_per_hour),
                        p.source,
                    )
                    for p in GPU_PRICES
                ),
            ),
        ]
    )


def render_markdown(report: Report) -> str:
    parts = [
        f"# {text(report.title)}",
        f"Generated {report.generated_at} by Pipeline Doctor · {len(report.findings)} finding(s)",
        "## Source\n\n" + table(("", ""), report.source_rows),
    ]
    if report.environment_rows:
        parts.append("## Environment\n\n" + table(("", ""), report.environment_rows))
    parts.append("## Summary\n\n" + table(("metric", "value"), report.summary_rows))
    section = report.comparison
    if section is not None:
        parts.append(
            "## Before and after\n\n"
            + (
                f"**Predicted and measured:** {text(section.prediction)}\n\n"
                if section.prediction
                else ""
            )
            + table(
                ("metric", f"{section.label_a} (a)", f"{section.label_b} (b)", "ratio b/a", ""),
                section.rows,
            )
        )
        for title, findings in (
            ("Findings gone", section.gone),
            ("Findings new", section.new),
            ("Findings kept", section.kept),
        ):
            listed = "\n".join(
                f"- **{f.severity}** `{f.rule.replace('`', '')}` {text(f.title)}" for f in findings
            )
            parts.append(f"### {title}\n\n{listed or '- none'}")
        if section.config_changes:
            parts.append(
                "### Config changes\n\n" + table(("key", "a", "b"), section.config_changes)
            )
    if report.memory_tables:
        parts.append("## Memory snapshot")
        for memory in report.memory_tables:
            if memory.key == "memory_snapshot":
                parts.append(table(("", ""), memory.rows))
            else:
                parts.append(
                    f"### {text(memory.title)}\n\n"
                    + (table(memory.head, memory.rows) if memory.rows else "none")
                )
    if report.ranks_table:
        parts.append("## Ranks\n\n" + table(report.ranks_table[0], report.ranks_table[1]))
    parts.append("## Findings")
    if report.findings:
        parts.append(
            table(
                ("#", "severity", "rule", "finding", "expected saving"),
                (
                    (i, f.severity, f.rule, f.title, fmt.pct(f.estimated_saving_pct, 0))
                    for i, f in enumerate(report.findings, 1)
                ),
            )
        )
        parts.extend(_finding(i, f) for i, f in enumerate(report.findings, 1))
    else:
        parts.append("No findings: no rule fired on this input.")
    if report.cost is not None:
        parts.append(_cost(report.cost))
    if report.skipped:
        parts.append("## Rules not applied\n\n" + table(("rule", "why"), report.skipped))
    if report.warnings:
        parts.append("## Warnings\n\n" + "\n".join(f"- {text(w)}" for w in report.warnings))
    if report.notes:
        parts.append("## Notes\n\n" + "\n".join(f"- {text(n)}" for n in report.notes))
    return "\n\n".join(parts) + "\n"
