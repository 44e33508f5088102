"""Drawing the shared parts of the run, upload and compare pages.

Each function takes results the analyser already computed and draws them; none computes
anything a test would want to check (that lives in diagnostics.views).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import polars as pl
import streamlit as st

from diagnostics import views
from diagnostics.report import plots
from diagnostics.report.metrics import key_metrics
from diagnostics.rules.base import Finding

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}

if TYPE_CHECKING:
    from diagnostics.result import AnalysisResult


def chart(fig: Any, key: str) -> None:
    st.plotly_chart(fig, config=PLOTLY_CONFIG, key=key)


def cards(result: AnalysisResult) -> None:
    columns = st.columns(5)
    for column, card in zip(columns, views.summary_cards(key_metrics(result)), strict=True):
        column.metric(card.label, card.value, help=card.help, border=True)


def notes(result: AnalysisResult) -> None:
    """The analyser's warnings and the rules it could not apply, folded away."""
    for warning in result.warnings:
        st.warning(warning, icon="⚠️")
    if result.skipped:
        with st.expander(f"{len(result.skipped)} checks did not apply to this input"):
            st.dataframe(
                pl.DataFrame(
                    {
                        "check": [s.rule for s in result.skipped],
                        "why not": [s.reason for s in result.skipped],
                    }
                ),
                hide_index=True,
                width="stretch",
            )


def findings(
    result: AnalysisResult,
    *,
    key_prefix: str,
    config: dict[str, Any] | None = None,
    can_rerun: bool = False,
    rerun_disabled_reason: str | None = None,
) -> Finding | None:
    """Findings ranked by severity, each with evidence, fix and saving.

    Returns the finding whose "Re-run with fix" button was pressed in this script run.
    """
    pressed: Finding | None = None
    if not result.findings:
        st.success("No problems found: every check that applies passed.", icon="✅")
        return None
    ranked = sorted(
        result.findings, key=lambda f: (f.severity.rank, -(f.estimated_saving_pct or 0.0))
    )
    st.caption(
        f"{len(ranked)} finding{'s' if len(ranked) != 1 else ''}, most severe first. "
        "Each shows its evidence, the fix as code and, for the reference trainer, as a "
        "config patch."
    )
    for index, finding in enumerate(ranked):
        severity = str(finding.severity)
        saving = (
            f" · saves about {views.fmt_pct(finding.estimated_saving_pct, 0)} of step time"
            if finding.estimated_saving_pct
            else ""
        )
        header = (
            f"{views.SEVERITY_ICONS.get(severity, '')} **{finding.title}** · {severity}{saving}"
        )
        with st.expander(header, expanded=index < 2):
            left, right = st.columns([3, 2])
            with left:
                st.markdown(finding.recommendation)
                figure = plots.finding_figure(finding)
                if figure is not None:
                    chart(figure, key=f"{key_prefix}-finding-{index}")
            with right:
                rows = views.evidence_rows(finding.evidence)
                if rows:
                    st.markdown("**Evidence**")
                    st.dataframe(
                        pl.DataFrame(
                            {"measure": [r[0] for r in rows], "value": [r[1] for r in rows]}
                        ),
                        hide_index=True,
                        width="stretch",
                    )
                if finding.estimated_saving_pct is not None:
                    st.metric(
                        "Expected saving",
                        views.fmt_pct(finding.estimated_saving_pct, 0),
                        help="Estimated share of step time this fix removes.",
                    )
            st.markdown("**Fix**")
            st.code(finding.fix.code, language="python")
            patch = finding.fix.config_patch
            if patch:
                st.markdown("**Config patch for the reference trainer**")
                st.dataframe(views.patch_rows(patch, config), hide_index=True, width="stretch")
                cli = " ".join(f"--set {k}={views._config_text(v)}" for k, v in patch.items())
                st.code(f"python -m trainer run {cli}", language="bash")
                if can_rerun:
                    clicked = st.button(
                        "Re-run with fix",
                        key=f"{key_prefix}-rerun-{finding.rule}-{index}",
                        type="primary",
                        icon="🔁",
                        disabled=rerun_disabled_reason is not None,
                        help=rerun_disabled_reason
                        or "Launch the same config with this patch; the runs are linked.",
                    )
                    if clicked:
                        pressed = finding
    return pressed


def run_charts(result: AnalysisResult, key_prefix: str) -> None:
    """Plotly charts with units: run records first, then what the trace shows."""
    run, facts = result.run, result.facts
    tabs: list[tuple[str, Callable[[], None]]] = []
    if run is not None and run.steps.height:
        spikes = _evidence_list(result.findings, "unstable-gradients", "spike_steps")
        slope = _evidence_number(result.findings, "memory-leak", "slope_bytes_per_step")
        tabs.append(
            ("Step time", lambda: chart(plots.step_time_figure(run.steps), f"{key_prefix}-steps"))
        )
        tabs.append(
            (
                "Loss and gradients",
                lambda: chart(plots.loss_gradnorm_figure(run.steps, spikes), f"{key_prefix}-loss"),
            )
        )
        tabs.append(
            (
                "Memory",
                lambda: chart(
                    plots.memory_figure(run.steps, run.samples, slope), f"{key_prefix}-memory"
                ),
            )
        )
    if run is not None and run.samples.height:
        tabs.append(
            ("GPU and CPU", lambda: chart(plots.system_figure(run.samples), f"{key_prefix}-system"))
        )
    if facts is not None:
        tabs.append(
            (
                "Trace breakdown",
                lambda: chart(plots.breakdown_figure(facts.breakdown), f"{key_prefix}-breakdown"),
            )
        )
        if facts.operators.height:
            tabs.append(
                (
                    "Top operators",
                    lambda: chart(
                        plots.top_figure(
                            facts.operators,
                            "device_us" if facts.device == "cuda" else "host_us",
                            title="Top operators by "
                            + ("GPU time (ms)" if facts.device == "cuda" else "CPU time (ms)"),
                        ),
                        f"{key_prefix}-operators",
                    ),
                )
            )
        if facts.kernels.height:
            tabs.append(
                (
                    "Top kernels",
                    lambda: chart(
                        plots.top_figure(
                            facts.kernels, "device_us", title="Top GPU kernels by time (ms)"
                        ),
                        f"{key_prefix}-kernels",
                    ),
                )
            )
    if not tabs:
        st.info("Nothing to chart yet: no step records, samples or trace.")
        return
    for tab, (_, draw) in zip(st.tabs([name for name, _ in tabs]), tabs, strict=True):
        with tab:
            draw()


def _evidence_for(findings_: Sequence[Finding], rule: str) -> dict[str, Any]:
    return next((f.evidence for f in findings_ if f.rule == rule), {})


def _evidence_list(findings_: Sequence[Finding], rule: str, key: str) -> list[int]:
    value = _evidence_for(findings_, rule).get(key)
    return [int(v) for v in value if isinstance(v, int | float)] if isinstance(value, list) else []


def _evidence_number(findings_: Sequence[Finding], rule: str, key: str) -> float | None:
    value = _evidence_for(findings_, rule).get(key)
    return float(value) if isinstance(value, int | float) else None


REPORT_FORMATS: tuple[tuple[str, str, str], ...] = (
    ("HTML report", "html", "text/html"),
    ("Markdown report", "md", "text/markdown"),
    ("JSON report", "json", "application/json"),
)


def downloads(make: Callable[[str], str], base_name: str, key_prefix: str) -> None:
    """One download button per report format; each report is rendered only when clicked."""
    columns = st.columns(len(REPORT_FORMATS))
    for column, (label, extension, mime) in zip(columns, REPORT_FORMATS, strict=True):
        with column:
            st.download_button(
                label,
                data=lambda extension=extension: make(extension),
                file_name=f"{base_name}.{extension}",
                mime=mime,
                key=f"{key_prefix}-download-{extension}",
                icon="⬇️",
                on_click="ignore",
                width="stretch",
            )


def runs_table(table: pl.DataFrame, key: str) -> None:
    """The runs table; selecting a row opens the run's detail page."""
    event = st.dataframe(
        table.drop("note") if table.get_column("note").str.len_chars().max() == 0 else table,
        hide_index=True,
        width="stretch",
        on_select="rerun",
        selection_mode="single-row",
        key=key,
        column_config={
            "run": st.column_config.TextColumn("Run", width="large"),
            "scenario": "Scenario",
            "status": "Status",
            "progress": st.column_config.ProgressColumn(
                "Progress", min_value=0.0, max_value=1.0, format="percent"
            ),
            "steps": "Steps",
            "started": "Started",
            "duration": "Duration",
            "re-run of": "Re-run of",
            "note": "Note",
            "open": st.column_config.LinkColumn("Open", display_text="Open ↗"),
        },
    )
    rows = event.selection.rows if event is not None else []
    if rows:
        run_id = table.get_column("run")[rows[0]]
        st.switch_page("pages/3_Run_detail.py", query_params={"run": run_id})


def report_text(result: AnalysisResult, fmt: str) -> str:
    """A finished report in one of REPORT_FORMATS' extensions (html, md, json)."""
    from diagnostics.report import render_html, render_json, render_markdown
    from diagnostics.report.model import build_report

    report = build_report(result)
    renderer = {"html": render_html, "md": render_markdown, "json": render_json}[fmt]
    return renderer(report)


def comparison_report_text(comparison: Any, fmt: str) -> str:
    from diagnostics.report import render_html, render_json, render_markdown
    from diagnostics.report.model import build_comparison_report

    report = build_comparison_report(comparison)
    renderer = {"html": render_html, "md": render_markdown, "json": render_json}[fmt]
    return renderer(report)
