"""Compare: two runs (a run and its re-run with a fix, or any two) side by side.

Opened with ?a=<run id>&b=<run id>; A is read as "before", B as "after".
"""

from __future__ import annotations

import html

import streamlit as st

from app_ui import loaders, render, session
from app_ui.safe_text import md_text
from diagnostics import views
from diagnostics.compare import compare
from diagnostics.errors import InputError
from diagnostics.report import plots
from diagnostics.runs import list_runs
from diagnostics.views.memory import snapshot_growth_between

session.setup_page("Compare", ":material/compare_arrows:")
st.title(":material/compare_arrows: Compare two runs")
listings = list_runs(session.runs_dir())
if len(listings) < 2:
    st.info(
        "Comparing needs two runs. Launch another, or re-run one with a fix.",
        icon=":material/info:",
    )
    st.page_link("pages/1_Launch.py", label="Launch a run", icon=":material/rocket_launch:")
    st.stop()

ids = [run.run_id for run in listings]
default_a, default_b = views.default_pair(listings)
asked = {side: st.query_params.get(side) for side in ("a", "b")}
for side, run_id in asked.items():
    if run_id and run_id not in ids:  # a stale or mistyped link: say so, never swap silently
        st.warning(
            md_text(f"No run {run_id!r} in this runs folder: {side.upper()} shows another run."),
            icon=":material/warning:",
        )
wanted_a = asked["a"] if asked["a"] in ids else default_a
wanted_b = asked["b"] if asked["b"] in ids else default_b
label = lambda run_id: views.run_choice_label(views.find_run(listings, run_id))  # noqa: E731
pick_a, pick_b = st.columns(2)
run_a = pick_a.selectbox("A (before)", ids, index=ids.index(wanted_a), format_func=label)
run_b = pick_b.selectbox("B (after)", ids, index=ids.index(wanted_b), format_func=label)
st.query_params.update({"a": run_a, "b": run_b})
if run_a == run_b:
    st.warning("Pick two different runs.", icon=":material/warning:")
    st.stop()

try:
    result_a = loaders.analyse_run(views.find_run(listings, run_a).path)
    result_b = loaders.analyse_run(views.find_run(listings, run_b).path)
except InputError as exc:
    st.error(md_text(exc), icon=":material/error:")
    st.stop()
comparison = compare(result_a, result_b, label_a=run_a, label_b=run_b)

line = views.headline(comparison)
if line:
    st.subheader(line)
checked = views.prediction_line(comparison.prediction)
if checked:  # B re-ran A with one of A's fixes: its prediction beside the measurement
    st.info(md_text(checked), icon=":material/fact_check:")
columns = render.card_grid(len(comparison.rows))
for column, row in zip(columns, comparison.rows, strict=True):
    card = views.comparison_card(row)
    column.metric(
        card.label,
        card.value,
        card.delta,
        delta_color=card.delta_color,
        delta_arrow=card.delta_arrow,
        help=card.help,
        border=True,
    )
st.dataframe(views.comparison_table(comparison.rows, "A", "B"), hide_index=True, width="stretch")
rank_table = views.rank_comparison_table(result_a, result_b, "A", "B")
if rank_table is not None:  # one of them is distributed
    st.markdown("**Ranks**")
    st.caption(
        "The figures above read rank 0's step records (throughput counts every rank); "
        "here each rank's median step time."
    )
    st.table(render.text_cells(rank_table))
if comparison.config_changes:
    st.markdown("**What changed in the config**")
    st.dataframe(
        views.config_changes_table(comparison.config_changes),
        hide_index=True,
        width="stretch",
    )

memory_growth = snapshot_growth_between(result_a, result_b)
if memory_growth is not None:  # both runs recorded memory/*.pickle
    st.markdown("**Memory snapshots: growth by allocation site**")
    st.caption(md_text(memory_growth[1]))
    st.dataframe(memory_growth[0], hide_index=True, width="stretch")

st.subheader("Findings")
gone, new, kept = st.columns(3)
with gone:
    st.markdown(f"**:material/check_circle: Gone in B ({len(comparison.findings_gone)})**")
    for finding in comparison.findings_gone:
        st.markdown(f"- {finding.title}")
    if not comparison.findings_gone:
        st.caption("None")
with new:
    st.markdown(f"**:material/fiber_new: New in B ({len(comparison.findings_new)})**")
    for finding in comparison.findings_new:
        st.markdown(f"- {finding.title}")
    if not comparison.findings_new:
        st.caption("None")
with kept:
    st.markdown(f"**:material/sync_alt: In both ({len(comparison.findings_kept)})**")
    for _, finding in comparison.findings_kept:
        st.markdown(f"- {finding.title} (in B)")
    if not comparison.findings_kept:
        st.caption("None")

st.subheader("Step time, overlaid")
if result_a.run is not None and result_b.run is not None:
    render.chart(
        # plotly reads <a href> and other tags in trace names: the ids are escaped for it
        plots.compare_steps_figure(
            result_a.run.steps, result_b.run.steps, html.escape(run_a), html.escape(run_b)
        ),
        key="compare-steps",
        compact=True,
    )

st.subheader("Report")
render.downloads(
    lambda fmt: render.comparison_report_text(comparison, fmt),
    base_name=f"compare-{run_a}-vs-{run_b}",
    key_prefix="compare",
)
