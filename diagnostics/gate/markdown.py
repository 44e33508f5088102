"""The gate's summary as Markdown, short enough for a pull-request comment."""

from __future__ import annotations

from diagnostics.gate.model import GateResult, MeasureVerdict
from diagnostics.printable import printable
from diagnostics.report.fmt import rate

_MARK = {
    "regression": "❌ regression",
    "improvement": "✅ improvement",
    "no change": "➖ no change",
    "inconclusive": "❔ inconclusive",
}


def _cell(text: str) -> str:
    return printable(text).replace("|", "\\|")


def _value(measure: MeasureVerdict, value: float | None) -> str:
    if value is None:
        return "unknown"
    if measure.unit == "bytes":
        return f"{value / 2**30:.2f} GiB"
    if measure.unit == "ms":
        return f"{value:.1f} ms"
    if measure.unit == "%":
        return f"{value:.1f} %"
    return rate(value, measure.unit)


def _interval(measure: MeasureVerdict) -> str:
    if measure.ci_low is None or measure.ci_high is None:
        return "–"
    return f"{measure.ci_low:.3f} – {measure.ci_high:.3f}"


def headline(result: GateResult) -> str:
    """One line: the gate's outcome, for a log or stderr."""
    tolerance = f"{result.max_regression * 100:g} %"
    if result.failed:
        worst = ", ".join(f"{m.label} {m.reason}" for m in result.regressions)
        return f"gate failed: regression beyond {tolerance}: {worst}"
    step = next((m for m in result.measures if m.key == "step_time_ms"), None)
    detail = f": {step.label} {step.verdict} ({step.reason})" if step else ""
    return f"gate passed (no regression beyond {tolerance}){detail}"


def render_markdown(result: GateResult) -> str:
    lines = [
        "## Pipeline Doctor gate: " + ("❌ failed" if result.failed else "✅ passed"),
        "",
        f"Baseline `{_cell(result.baseline.label)}` ({len(result.baseline.step_times_ms)} "
        f"steady steps) against candidate `{_cell(result.candidate.label)}` "
        f"({len(result.candidate.step_times_ms)}). A change counts when it is significant "
        f"(Mann–Whitney U, p < {result.alpha:g}) and beyond ±{result.max_regression * 100:g} %.",
        "",
        "| measure | baseline | candidate | ratio | 95 % CI | p | verdict |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for m in result.measures:
        ratio = "–" if m.ratio is None else f"{m.ratio:.3f}"
        p_value = "–" if m.p_value is None else f"{m.p_value:.2g}"
        lines.append(
            f"| {m.label} | {_value(m, m.baseline)} | {_value(m, m.candidate)} | {ratio} | "
            f"{_interval(m)} | {p_value} | {_MARK[m.verdict]}: {_cell(m.reason)} |"
        )
    lines.append("")
    if result.findings_gained or result.findings_lost:
        for title, findings in (
            ("New findings", result.findings_gained),
            ("Findings gone", result.findings_lost),
        ):
            if findings:
                lines.append(f"**{title}:**")
                lines += [
                    f"- [{_cell(f.severity)}] `{_cell(f.rule)}`: {_cell(f.title)}" for f in findings
                ]
                lines.append("")
    else:
        lines += ["Findings: the same rules fire on both.", ""]
    lines.append(
        "Medians over steady-state steps; the interval is a seeded bootstrap of the median "
        "ratio (candidate / baseline). docs/GATE.md says how each verdict is reached."
    )
    return "\n".join(lines) + "\n"
