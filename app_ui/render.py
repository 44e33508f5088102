"""Drawing the shared parts of the run, upload and compare pages.

Each function takes results the analyser already computed and draws them; none computes
anything a test would want to check (that lives in diagnostics.views).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import polars as pl
import streamlit as st

from app_ui import loaders
from app_ui.safe_text import md_text
from diagnostics import views
from diagnostics.errors import InputError
from diagnostics.metrics import key_metrics
from diagnostics.report import plots
from diagnostics.report.formats import REPORT_FORMATS, render_report
from diagnostics.report.model import build_comparison_report, build_report
from diagnostics.rules.base import Finding
from diagnostics.runs import RunFolder, RunFolderError, RunListing
from diagnostics.severity import order_findings

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}

if TYPE_CHECKING:
    from diagnostics.progress import WorkDone
    from diagnostics.result import AnalysisResult


def chart(fig: Any, key: str, *, compact: bool = False) -> None:
    """A plotly figure; ``compact`` for half-width columns moves the legend under the plot
    and shrinks the title so neither collides with the other."""
    if compact:
        fig.update_layout(
            legend={"orientation": "h", "yanchor": "top", "y": -0.28, "x": 0.0},
            title_font_size=14,
            margin={"t": 40, "b": 90},
        )
    st.plotly_chart(fig, config=PLOTLY_CONFIG, key=key)


class ProgressBar:
    """A bar drawn from a long analysis's progress reports (diagnostics.progress), where
    it is created; it appears at the first report and :meth:`clear` removes it."""

    def __init__(self) -> None:
        self._slot = st.empty()
        self._bar: Any = None

    def __call__(self, work: WorkDone) -> None:
        if self._bar is None:
            self._bar = self._slot.progress(0.0)
        self._bar.progress(work.fraction, text=md_text(work.text()))

    def clear(self) -> None:
        self._slot.empty()


def card_grid(count: int) -> list[Any]:
    """``count`` columns laid out in rows of at most views.CARDS_PER_ROW, in order."""
    return [column for size in views.card_rows(count) for column in st.columns(size)]


def cards(result: AnalysisResult) -> None:
    summary = views.summary_cards(key_metrics(result))
    for column, card in zip(card_grid(len(summary)), summary, strict=True):
        column.metric(card.label, card.value, help=card.help, border=True)


def memory_snapshot(result: AnalysisResult, key_prefix: str) -> None:
    """The memory snapshot's figures, sites (sortable), categories, growth and plots; nothing
    when the result holds no snapshot (diagnostics.views.memory)."""
    from diagnostics.views.memory import memory_view

    view = memory_view(result)
    if view is None:
        return
    st.subheader("Memory snapshot")
    st.table(text_cells(pl.DataFrame(list(view.rows), schema=["", "value"], orient="row")))
    tabs = st.tabs([label for label, _ in view.figures])
    for tab, (label, make) in zip(tabs, view.figures, strict=True):
        with tab:
            chart(make(), key=f"{key_prefix}-memory-{label}")
    st.markdown(f"**Allocation sites {view.sites_title}** (click a column to sort)")
    st.dataframe(view.sites, hide_index=True, width="stretch", key=f"{key_prefix}-memory-sites")
    st.markdown(f"**Categories {view.sites_title}**")
    st.dataframe(view.categories, hide_index=True, width="stretch")
    st.caption(md_text(f"How categories are inferred: {view.category_method}"))
    if view.growth is not None:
        st.markdown("**Growth by site**")
        st.caption(md_text(view.growth_caption or ""))
        st.dataframe(view.growth, hide_index=True, width="stretch")


def alert_state(run: RunFolder) -> None:
    """The too-long-run alert's line (nothing when the run asked for none)."""
    try:
        shown = views.alert_summary(run.alert())
    except RunFolderError as exc:  # a torn alert.json must not hide the rest of the page
        st.warning(md_text(exc), icon=":material/notification_important:")
        return
    if shown is not None:
        getattr(st, shown.level)(md_text(shown.text), icon=shown.icon)


def text_cells(table: pl.DataFrame) -> pl.DataFrame:
    """A table for st.table, which renders markdown in its cells: every cell as plain text
    (config values come from a run's own run.json)."""
    return pl.DataFrame(
        {name: [md_text(value) for value in table.get_column(name)] for name in table.columns},
        schema=dict.fromkeys(table.columns, pl.String),
    )


def notes(result: AnalysisResult) -> None:
    """The analyser's warnings and the rules it could not apply, folded away."""
    for warning in result.warnings:  # may quote a file name or a trace's own strings
        st.warning(md_text(warning), icon=":material/warning:")
    coverage = views.coverage_rows(result.summary)
    if coverage:
        with st.expander("Kernel coverage: what the kernel table and operator links account for"):
            st.table(
                text_cells(
                    pl.DataFrame({"": [r[0] for r in coverage], "value": [r[1] for r in coverage]})
                )
            )
    roofline = views.roofline_summary_rows(result.summary)
    if roofline:
        with st.expander("Roofline: FLOPs from the recorded shapes against the device's peak"):
            st.table(
                text_cells(
                    pl.DataFrame({"": [r[0] for r in roofline], "value": [r[1] for r in roofline]})
                )
            )
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
        st.success(
            "No problems found: every check that applies passed.", icon=":material/check_circle:"
        )
        return None
    ranked = order_findings(result.findings)
    st.caption(
        f"{len(ranked)} finding{'s' if len(ranked) != 1 else ''}, most severe first. "
        + (
            "Each shows its evidence, the fix as code and as a config patch for a re-run."
            if result.is_run_folder
            else "Each shows its evidence and the fix as code for your own training script."
        )
    )
    for index, finding in enumerate(ranked):
        severity = str(finding.severity)
        saving = (
            f" · expected saving: {views.fmt_step_time_saving(finding.estimated_saving_pct)}"
            if finding.estimated_saving_pct
            else ""
        )
        header = f"{views.severity_badge(severity)} **{finding.title}** · `{finding.rule}`{saving}"
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
                    st.table(
                        # st.table renders markdown in its cells; values can be a trace's strings
                        pl.DataFrame(
                            {
                                "measure": [md_text(r[0]) for r in rows],
                                "value": [md_text(r[1]) for r in rows],
                            }
                        ),
                        hide_index=True,
                        hide_header=True,
                        border="horizontal",
                    )
                if finding.estimated_saving_pct is not None:
                    st.metric(
                        "Expected saving",
                        views.fmt_saving(finding.estimated_saving_pct),
                        help="Estimated share of step time this fix removes: "
                        f"{views.fmt_step_time_saving(finding.estimated_saving_pct)}.",
                    )
            st.markdown("**Fix**")
            st.code(finding.fix.code, language="python")
            patch = finding.fix.config_patch if result.is_run_folder else None
            if patch:
                for_script = views.is_script_patch(patch)
                st.markdown(
                    "**DataLoader overrides for a re-run of your script (no edit)**"
                    if for_script
                    else "**Config patch for the reference trainer**"
                )
                # a script's config holds only what was overridden; its loader's actual
                # arguments are in the finding's evidence
                before = (
                    {"dataloader": finding.evidence.get("dataloader")} if for_script else config
                )
                st.table(
                    text_cells(views.patch_rows(patch, before)),
                    hide_index=True,
                    border="horizontal",
                )
                st.code(views.patch_command(patch, config, finding.evidence), language="bash")
                if can_rerun:
                    clicked = st.button(
                        "Re-run with fix",
                        key=f"{key_prefix}-rerun-{finding.rule}-{index}",
                        type="primary",
                        icon=":material/replay:",
                        disabled=rerun_disabled_reason is not None,
                        help=rerun_disabled_reason
                        or (
                            "Launch the same script, unedited, with these overrides; the runs "
                            "are linked."
                            if for_script
                            else "Launch the same config with this patch; the runs are linked."
                        ),
                    )
                    if clicked:
                        pressed = finding
    return pressed


def run_charts(result: AnalysisResult, key_prefix: str) -> None:
    """Plotly charts with units, in tabs: run records first, then what the trace shows."""
    run, facts = result.run, result.facts
    charts: list[tuple[str, Any]] = []
    if run is not None and run.steps.height:
        slope, slope_column = views.leak_slope(result.findings)
        charts += [
            ("Step time", lambda: plots.step_time_figure(run.steps)),
            (
                "Loss and gradients",
                lambda: plots.loss_gradnorm_figure(run.steps, views.spike_steps(result.findings)),
            ),
            (
                "Memory",
                lambda: plots.memory_figure(
                    run.steps, run.samples, slope, slope_column=slope_column
                ),
            ),
        ]
    if run is not None and run.samples.height:
        charts.append(("GPU and CPU", lambda: plots.system_figure(run.samples)))
    if facts is not None:
        charts.append(("Trace breakdown", lambda: plots.breakdown_figure(facts.breakdown)))
        operators, kernels = facts.operators, facts.kernels
        if operators.height:
            value = views.operator_time_column(operators)
            charts.append(
                (
                    "Top operators",
                    lambda: plots.top_figure(
                        operators, value, title=f"Top operators by {value[:-3]} time (ms)"
                    ),
                )
            )
        if kernels.height:
            charts.append(
                (
                    "Top kernels",
                    lambda: plots.top_figure(
                        kernels, "device_us", title="Top GPU kernels by time (ms)"
                    ),
                )
            )
    if not charts:
        st.info("Nothing to chart yet: no step records, samples or trace.", icon=":material/info:")
        return
    for index, (tab, (_, figure)) in enumerate(
        zip(st.tabs([name for name, _ in charts]), charts, strict=True)
    ):
        with tab:
            chart(figure(), key=f"{key_prefix}-chart-{index}")


def downloads(make: Callable[[str], str], base_name: str, key_prefix: str) -> None:
    """One download button per report format; each report is rendered only when clicked."""
    columns = st.columns(len(REPORT_FORMATS))
    for column, fmt in zip(columns, REPORT_FORMATS, strict=True):
        with column:
            st.download_button(
                fmt.label,
                data=lambda name=fmt.name: make(name),
                file_name=f"{base_name}.{fmt.name}",
                mime=fmt.mime,
                key=f"{key_prefix}-download-{fmt.name}",
                icon=":material/download:",
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
                "Progress", min_value=0.0, max_value=1.0, format="percent", width="small"
            ),
            "steps": "Steps",
            "median step (ms)": st.column_config.NumberColumn(
                "Median step (ms)",
                format="%.1f",
                help="Median step time over the steady steps (each phase's first left out), "
                "as the run's Step time card says.",
            ),
            "findings": st.column_config.TextColumn(
                "Findings",
                help="Findings by severity from the run's last analysis: made when its Run "
                "detail opens or by Analyse on the Runs page, and dropped once its records "
                "change.",
            ),
            "worst finding": "Worst finding",
            "started": "Started",
            "duration": "Duration",
            "re-run of": st.column_config.TextColumn("Re-run of", width="small"),
            "note": "Note",
            "open": st.column_config.LinkColumn("Open", display_text="Open ↗"),
        },
    )
    rows = event.selection.rows if event is not None else []
    if rows:
        run_id = table.get_column("run")[rows[0]]
        st.switch_page("pages/3_Run_detail.py", query_params={"run": run_id})


def analyse_runs(runs: list[RunListing], key: str) -> None:
    """A button that analyses these runs (finished, not analysed since their records
    changed) one by one with a progress bar, so the runs table shows their findings."""
    if not runs or not st.button(
        f"Analyse {len(runs)} run{'s' if len(runs) > 1 else ''} not analysed yet",
        icon=":material/biotech:",
        key=key,
        help="Runs each one's analysis (as its Run detail page would) and keeps its "
        "findings in brief in the run folder.",
    ):
        return
    bar = st.progress(0.0, text="Analysing…")
    failed = []
    for done, run in enumerate(runs):
        bar.progress(done / len(runs), text=f"Analysing {run.run_id} ({done + 1} of {len(runs)})…")
        try:
            loaders.analyse_run(run.path)
        except InputError as exc:
            failed.append(f"{run.run_id}: {exc}")
    bar.progress(1.0, text=f"Analysed {len(runs) - len(failed)} of {len(runs)}.")
    for line in failed:
        st.error(md_text(line), icon=":material/error:")
    if not failed:
        st.rerun()


def report_text(result: AnalysisResult, fmt: str) -> str:
    """A finished report in one of REPORT_FORMATS' names (html, md, json)."""
    return render_report(build_report(result), fmt)


def comparison_report_text(comparison: Any, fmt: str) -> str:
    return render_report(build_comparison_report(comparison), fmt)
