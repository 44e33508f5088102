"""Rules: what Pipeline Doctor checks, generated from the rules' own code and docstrings."""

from __future__ import annotations

import polars as pl
import streamlit as st

from app_ui import loaders, session
from diagnostics import views
from diagnostics.rules.docs import SECTIONS, rule_reference
from diagnostics.runs import list_runs
from diagnostics.views.calibration import calibrate, calibration_table

session.setup_page("Rules", ":material/menu_book:")
st.title(":material/menu_book: What Pipeline Doctor checks")
st.markdown(
    "Every finding comes from one of these rules. This page is generated from the rules "
    "themselves (`python -m diagnostics rules` prints the same reference)."
)

docs = rule_reference()
st.table(
    pl.DataFrame(
        {
            "rule": [d.id for d in docs],
            "severity": [d.severity for d in docs],
            "title": [d.title for d in docs],
            "needs": [d.needs_text for d in docs],
        }
    ),
    hide_index=True,
    border="horizontal",
)

st.subheader("Calibration on this folder's re-runs", anchor="calibration")
calibration = calibrate(list_runs(session.runs_dir()), loaders.run_figures_of)
st.caption(
    "Each finding predicts a saving; a re-run that applied its fix (Re-run with fix, or "
    "--parent-run-id with the same overrides) measured one, in median step time. Measured ÷ "
    "predicted near 1 is a rule whose estimate holds on this machine."
    + (
        f" {calibration.unanalysed_parents} re-run(s) left out: their first run has not "
        "been analysed since its records changed (open it, or Analyse on the Runs page)."
        if calibration.unanalysed_parents
        else ""
    )
)
if calibration.rules:
    st.dataframe(calibration_table(calibration), hide_index=True, width="stretch")
else:
    st.caption("No re-run with a finding's fix in this runs folder yet.")

for doc in docs:
    st.subheader(doc.title, anchor=doc.id)
    st.markdown(f"`{doc.id}` &nbsp; {views.severity_badge(doc.severity)}")
    st.markdown(doc.summary)
    tabs = st.tabs([name for name in SECTIONS if name in doc.sections] + ["Thresholds", "Examples"])
    for tab, name in zip(tabs, [n for n in SECTIONS if n in doc.sections], strict=False):
        tab.markdown(doc.sections[name])
    with tabs[-2]:
        if doc.thresholds:
            st.dataframe(
                pl.DataFrame(
                    {
                        "threshold": [t[0] for t in doc.thresholds],
                        "default": [str(t[1]) for t in doc.thresholds],
                        "meaning": [t[2] for t in doc.thresholds],
                        "source": [t[3] for t in doc.thresholds],
                    }
                ),
                hide_index=True,
                width="stretch",
            )
        else:
            st.caption("No tunable thresholds.")
    with tabs[-1]:
        st.markdown(
            "\n".join(
                f"- {':material/local_fire_department: fires' if fires else ':material/do_not_disturb_on: stays quiet'}: {name}"
                for name, fires in doc.examples
            )
            or "No examples."
        )
