"""The report as one self-contained HTML file: opens offline, reads on screen and on paper.

Safety: every string from a trace or a run is escaped with ``html.escape`` where it lands
in markup; figure data goes into one ``<script type="application/json">`` block (data, never
run) with ``<``, ``>`` and ``&`` written as ``\\u003c``/``\\u003e``/``\\u0026`` so no name can
close the block. The only executable scripts are plotly's library (inlined once, no CDN)
and the fixed bootstrap below, which draws the figures and recomputes the cost table when
the reader types a price.
"""

from __future__ import annotations

import html
import json
import math
from functools import lru_cache
from typing import Any

from diagnostics.report import fmt
from diagnostics.report.model import Report, ReportFinding
from diagnostics.report.pricing import GPU_PRICES, PRICES_DATED, CostEstimate, saving_note

PLOTLY_SCRIPT_ID = "plotly-js"
FIGURES_SCRIPT_ID = "report-figures"
BOOTSTRAP_SCRIPT_ID = "report-bootstrap"

CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #d9dee7; --bg: #ffffff; --panel: #f6f8fb;
  --high: #b42318; --medium: #b54708; --low: #175cd3; }
* { box-sizing: border-box; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
  background: var(--bg); margin: 0 auto; max-width: 1100px; padding: 24px 28px 48px; }
h1 { font-size: 1.6rem; margin: 0 0 4px; overflow-wrap: anywhere; }
h2 { font-size: 1.25rem; margin: 32px 0 10px; padding-bottom: 4px; border-bottom: 2px solid var(--line); }
h3 { font-size: 1.05rem; margin: 0 0 6px; overflow-wrap: anywhere; }
.meta { color: var(--muted); margin: 0 0 12px; }
nav a { margin-right: 14px; color: var(--low); text-decoration: none; }
table { border-collapse: collapse; width: 100%; margin: 6px 0 12px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line); vertical-align: top;
  overflow-wrap: anywhere; }
th { background: var(--panel); font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.better, td.worse, td.same { white-space: nowrap; }
table.kv th { width: 30%; }
.finding { border: 1px solid var(--line); border-left: 6px solid var(--muted); border-radius: 6px;
  padding: 12px 16px; margin: 14px 0; background: var(--bg); }
.finding.sev-high { border-left-color: var(--high); }
.finding.sev-medium { border-left-color: var(--medium); }
.finding.sev-low { border-left-color: var(--low); }
.badge { display: inline-block; font-size: .75rem; font-weight: 700; text-transform: uppercase;
  padding: 1px 8px; border-radius: 10px; color: #fff; background: var(--muted); margin-right: 6px; }
.badge.sev-high { background: var(--high); } .badge.sev-medium { background: var(--medium); }
.badge.sev-low { background: var(--low); } .badge.status { background: #475467; }
pre { background: var(--panel); border: 1px solid var(--line); border-radius: 4px; padding: 10px;
  overflow-x: auto; font: 13px/1.45 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: .92em; }
.chart { width: 100%; min-height: 260px; margin: 8px 0 18px; }
.note { color: var(--muted); font-size: .9rem; }
.better { color: #067647; font-weight: 600; } .worse { color: var(--high); font-weight: 600; }
label.price { display: inline-block; margin: 4px 0 10px; }
label.price input { width: 7em; margin-left: 6px; }
@page { margin: 14mm; }
@media print {
  body { max-width: none; padding: 0; font-size: 11pt; -webkit-print-color-adjust: exact;
    print-color-adjust: exact; }
  nav, label.price { display: none; }
  .finding, .chart, table, pre { break-inside: avoid; }
  h2 { break-after: avoid; }
  pre { white-space: pre-wrap; overflow-wrap: anywhere; }
  a { color: inherit; text-decoration: none; }
}
"""

# Draws every figure from the JSON block; re-lays them out for print; recomputes the cost
# cells (data-gpu-hours = GPU-hours of the row) when the reader types a price.
BOOTSTRAP_JS = """
(function () {
  var block = document.getElementById("report-figures");
  var figures = block ? JSON.parse(block.textContent) : {};
  var config = {responsive: true, displaylogo: false};
  Object.keys(figures).forEach(function (id) {
    var el = document.getElementById(id);
    if (el && window.Plotly) { Plotly.newPlot(el, figures[id].data, figures[id].layout, config); }
  });
  window.addEventListener("beforeprint", function () {
    Object.keys(figures).forEach(function (id) {
      var el = document.getElementById(id);
      if (el && window.Plotly) { Plotly.Plots.resize(el); }
    });
  });
  var input = document.getElementById("price-input");
  if (input) {
    input.addEventListener("input", function () {
      var price = parseFloat(input.value);
      document.querySelectorAll("[data-gpu-hours]").forEach(function (cell) {
        var hours = parseFloat(cell.getAttribute("data-gpu-hours"));
        cell.textContent = isFinite(price) && price >= 0 ? "$" + (hours * price).toFixed(2) : "—";
      });
    });
  }
})();
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def json_for_script(payload: Any) -> str:
    """JSON that cannot end the ``<script>`` element holding it nor open a comment in it."""
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, default=str)
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


@lru_cache(maxsize=1)
def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    # The library holds no "</script" today; escaping keeps that true for any version.
    return get_plotlyjs().replace("</script", "<\\/script")


def _table(
    rows: Any, head: tuple[str, ...] | None = None, css: str = "kv", numeric_from: int = 99
) -> str:
    parts = [f'<table class="{css}">']
    if head:
        parts.append("<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead>")
    parts.append("<tbody>")
    for row in rows:
        cells = []
        for index, value in enumerate(row):
            if index == 0 and css == "kv":
                cells.append(f"<th>{esc(value)}</th>")
            elif index >= numeric_from:
                cells.append(f'<td class="num">{esc(value)}</td>')
            else:
                cells.append(f"<td>{esc(value)}</td>")
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</tbody></table>")
    return "".join(parts)


class _Figures:
    """Collects figures as plain JSON under element ids, in page order."""

    def __init__(self) -> None:
        self.payload: dict[str, Any] = {}

    def add(self, figure: Any, title: str) -> str:
        fig_id = f"fig-{len(self.payload) + 1}"
        self.payload[fig_id] = _clean(json.loads(figure.to_json()))
        return f'<div class="chart" id="{fig_id}" role="img" aria-label="{esc(title)}"></div>'


def _clean(value: Any) -> Any:
    """NaN and infinity are not JSON: they become null (a gap in the chart)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _clean(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_clean(item) for item in value]
    return value


def _finding_html(finding: ReportFinding, figures: _Figures, anchor: str) -> str:
    sev = esc(finding.severity)
    parts = [f'<article class="finding sev-{sev}" id="{anchor}">']
    status = f'<span class="badge status">{esc(finding.status)}</span>' if finding.status else ""
    parts.append(
        f'<h3><span class="badge sev-{sev}">{sev}</span>{status}{esc(finding.title)}</h3>'
        f'<p class="note">rule <code>{esc(finding.rule)}</code>'
        + (
            f" · expected saving: about {esc(fmt.saving(finding.estimated_saving_pct))}"
            if finding.estimated_saving_pct is not None
            else ""
        )
        + "</p>"
    )
    if finding.recommendation:
        parts.append(f"<p>{esc(finding.recommendation)}</p>")
    if finding.evidence_rows:
        parts.append("<h4>Evidence</h4>" + _table(finding.evidence_rows))
    if finding.figure is not None:
        parts.append(figures.add(finding.figure, finding.title))
    if finding.fix_code:
        parts.append(f"<h4>Fix</h4><pre><code>{esc(finding.fix_code)}</code></pre>")
    if finding.config_patch:
        patch = json.dumps(finding.config_patch, indent=2, default=str)
        heading = (
            "DataLoader overrides (your script, no edit)"
            if finding.for_script
            else "Config patch (reference trainer)"
        )
        parts.append(
            f"<h4>{heading}</h4>"
            f"<pre><code>{esc(patch)}</code></pre>"
            f'<p class="note">Re-run with it: <code>{esc(finding.rerun_command or "")}</code></p>'
        )
    parts.append("</article>")
    return "".join(parts)


def _cost_html(cost: CostEstimate, before: CostEstimate | None) -> str:
    hours = cost.gpus / 3600.0  # GPU-hours per second of wall time

    def money(seconds: float | None) -> str:
        if seconds is None:
            return f"<td class=num>{esc(fmt.MISSING)}</td>"
        gpu_hours = seconds * hours
        return (
            f'<td class="num" data-gpu-hours="{gpu_hours:.9f}">'
            f"{esc(fmt.usd(gpu_hours * cost.usd_per_gpu_hour))}</td>"
        )

    origin = (
        f"default estimate for {cost.gpu}, {cost.tier.replace('_', '-')} (prices gathered {PRICES_DATED})"
        if cost.price_is_default
        else "set by you"
    )
    epoch_label = (
        f"per epoch ({fmt.number(cost.steps_per_epoch)} steps)"
        if cost.steps_per_epoch
        else "per epoch"
    )
    rows = [
        ("per 1,000 steps", cost.time_per_1000_steps_s, cost.after_time_per_1000_steps_s),
        (epoch_label, cost.time_per_epoch_s, cost.after_time_per_epoch_s),
    ]
    head = "<tr><th></th><th>time now</th><th>cost now</th><th>time after fixes</th><th>cost after fixes</th>"
    head += "<th>measured before (a)</th></tr>" if before else "</tr>"
    body = []
    before_rows = (
        [before.time_per_1000_steps_s, before.time_per_epoch_s] if before else [None, None]
    )
    for (label, now_s, after_s), before_s in zip(rows, before_rows, strict=True):
        cells = (
            f"<tr><th>{esc(label)}</th><td class=num>{esc(fmt.seconds(now_s))}</td>{money(now_s)}"
            f"<td class=num>{esc(fmt.seconds(after_s))}</td>{money(after_s)}"
        )
        if before:
            cells += f"<td class=num>{esc(fmt.seconds(before_s))}</td>"
        body.append(cells + "</tr>")
    price_rows = "".join(
        f"<tr><td>{esc(p.name)}</td><td>per {esc(p.unit)}-hour</td>"
        f"<td class=num>{esc(fmt.unit_price(p.on_demand_usd_per_hour))}</td>"
        f"<td class=num>{esc(fmt.unit_price(p.spot_usd_per_hour))}</td><td>{esc(p.source)}</td></tr>"
        for p in GPU_PRICES
    )
    return (
        '<section id="cost"><h2>Cost</h2>'
        f"<p>At <strong>{esc(fmt.unit_price(cost.usd_per_gpu_hour))} per {esc(cost.unit)}-hour</strong> "
        f"({esc(origin)}) × {cost.gpus} {esc(cost.unit)}(s), mean step time "
        f"{esc(fmt.ms(cost.step_time_ms))}.</p>"
        f'<label class="price">Your price per {esc(cost.unit)}-hour (USD)<input id="price-input" '
        f'type="number" min="0" step="0.0001" value="{cost.usd_per_gpu_hour:.4g}"></label>'
        f"<table>{head}{''.join(body)}</table>"
        f'<p class="note">Steps per epoch: {esc(cost.steps_per_epoch_note)}. '
        f"{esc(saving_note(cost))} Estimates, not quotes.</p>"
        "<details open><summary>Default prices (estimates, "
        f"gathered {esc(PRICES_DATED)}; they vary by provider and region)</summary>"
        "<table><tr><th>device</th><th>unit</th><th>on-demand</th><th>spot / preemptible</th>"
        f"<th>source</th></tr>{price_rows}</table></details></section>"
    )


def _comparison_html(report: Report) -> str:
    section = report.comparison
    if section is None:
        return ""
    rows = "".join(
        f"<tr><th>{esc(label)}</th><td class=num>{esc(a)}</td><td class=num>{esc(b)}</td>"
        f'<td class=num>{esc(ratio)}</td><td class="{esc(verdict)}">{esc(verdict)}</td></tr>'
        for label, a, b, ratio, verdict in section.rows
    )
    parts = [
        '<section id="comparison"><h2>Before and after</h2>',
        (
            f"<p><strong>Predicted and measured:</strong> {esc(section.prediction)}</p>"
            if section.prediction
            else ""
        ),
        f"<table><tr><th>metric</th><th>{esc(section.label_a)} (a)</th>"
        f"<th>{esc(section.label_b)} (b)</th><th>ratio b/a</th><th></th></tr>{rows}</table>",
    ]
    for title, findings in (
        ("Findings gone", section.gone),
        ("Findings new", section.new),
        ("Findings kept", section.kept),
    ):
        listed = (
            "".join(
                f"<li><span class='badge sev-{esc(f.severity)}'>{esc(f.severity)}</span>"
                f"<code>{esc(f.rule)}</code> {esc(f.title)}</li>"
                for f in findings
            )
            or "<li>none</li>"
        )
        parts.append(f"<h3>{esc(title)}</h3><ul>{listed}</ul>")
    if section.config_changes:
        parts.append(
            "<h3>Config changes</h3>"
            + _table(section.config_changes, ("key", "a", "b"), css="grid")
        )
    parts.append("</section>")
    return "".join(parts)


def _memory_html(report: Report) -> str:
    if not report.memory_tables:
        return ""
    parts = ['<section id="memory"><h2>Memory snapshot</h2>']
    for table in report.memory_tables:
        if table.key == "memory_snapshot":
            parts.append(_table(table.rows))
            continue
        parts.append(f"<h3>{esc(table.title)}</h3>")
        parts.append(
            _table(table.rows, table.head, css="grid", numeric_from=table.numeric_from)
            if table.rows
            else "<p>none</p>"
        )
    parts.append("</section>")
    return "".join(parts)


def render_html(report: Report) -> str:
    figures = _Figures()
    findings_html = (
        "".join(
            _finding_html(finding, figures, f"finding-{i}")
            for i, finding in enumerate(report.findings, 1)
        )
        or "<p>No findings: no rule fired on this input.</p>"
    )
    findings_table = (
        _table(
            (
                (f.severity, f.rule, f.title, fmt.pct(f.estimated_saving_pct, 0))
                for f in report.findings
            ),
            ("severity", "rule", "finding", "expected saving"),
            css="grid",
            numeric_from=3,
        )
        if report.findings
        else ""
    )
    charts_html = "".join(figures.add(chart.figure, chart.title) for chart in report.charts)
    nav = [("summary", "Summary"), ("findings", "Findings"), ("cost", "Cost"), ("charts", "Charts")]
    if report.comparison:
        nav.insert(1, ("comparison", "Before and after"))
    if report.memory_tables:
        nav.insert(1, ("memory", "Memory snapshot"))
    sections = [
        f"<header><h1>{esc(report.title)}</h1>"
        f'<p class="meta">Generated {esc(report.generated_at)} by Pipeline Doctor · '
        f"{len(report.findings)} finding(s)</p>"
        "<nav>"
        + "".join(f'<a href="#{key}">{esc(label)}</a>' for key, label in nav)
        + "</nav></header>",
        '<section id="source"><h2>Source</h2>' + _table(report.source_rows) + "</section>",
        '<section id="environment"><h2>Environment</h2>'
        + (_table(report.environment_rows) if report.environment_rows else "<p>unknown</p>")
        + "</section>",
        '<section id="summary"><h2>Summary</h2>' + _table(report.summary_rows) + "</section>",
        _comparison_html(report),
        _memory_html(report),
        (
            '<section id="ranks"><h2>Ranks</h2>'
            + _table(report.ranks_table[1], report.ranks_table[0], css="grid", numeric_from=1)
            + "</section>"
        )
        if report.ranks_table
        else "",
        f'<section id="findings"><h2>Findings</h2>{findings_table}{findings_html}</section>',
        _cost_html(report.cost, report.comparison.cost_a if report.comparison else None)
        if report.cost
        else "",
        f'<section id="charts"><h2>Charts</h2>{charts_html or "<p>No chart data.</p>"}</section>',
    ]
    if report.config_rows:
        sections.append(
            '<section id="config"><h2>Run config</h2>' + _table(report.config_rows) + "</section>"
        )
    if report.skipped:
        sections.append(
            '<section id="skipped"><h2>Rules not applied</h2>'
            + _table(report.skipped, ("rule", "why"), css="grid")
            + "</section>"
        )
    if report.warnings:
        sections.append(
            '<section id="warnings"><h2>Warnings</h2><ul>'
            + "".join(f"<li>{esc(w)}</li>" for w in report.warnings)
            + "</ul></section>"
        )
    if report.notes:
        sections.append(
            '<section id="notes"><h2>Notes</h2><ul>'
            + "".join(f"<li>{esc(n)}</li>" for n in report.notes)
            + "</ul></section>"
        )
    body = "\n".join(part for part in sections if part)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(report.title)}</title><style>{CSS}</style>"
        f'<script id="{PLOTLY_SCRIPT_ID}">{plotly_js()}</script></head>\n<body>\n{body}\n'
        f'<footer class="note"><p>Pipeline Doctor report, schema pipeline-doctor/report/v1.</p></footer>\n'
        f'<script type="application/json" id="{FIGURES_SCRIPT_ID}">'
        f"{json_for_script(figures.payload)}</script>\n"
        f'<script id="{BOOTSTRAP_SCRIPT_ID}">{BOOTSTRAP_JS}</script>\n</body></html>\n'
    )
