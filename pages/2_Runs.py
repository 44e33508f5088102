"""Runs: every run folder, filtered by status and scenario; a row opens the run."""

from __future__ import annotations

import streamlit as st

from app_ui import loaders, render, session
from diagnostics import views
from diagnostics.runs import list_runs

session.setup_page("Runs", ":material/table_rows:")
st.title(":material/table_rows: Runs")

listings = list_runs(session.runs_dir())
if not listings:
    st.info("No runs yet. Launch one to see it here.", icon=":material/info:")
    st.page_link("pages/1_Launch.py", label="Launch a run", icon=":material/rocket_launch:")
    st.stop()

status_col, scenario_col = st.columns(2)
statuses = status_col.multiselect(
    "Status",
    views.RUN_STATES,
    placeholder="All statuses",
)
scenarios = scenario_col.multiselect(
    "Scenario",
    sorted({views.run_label(run) for run in listings}),
    placeholder="All scenarios",
)
shown = views.filter_runs(listings, statuses=statuses, scenarios=scenarios)
figures = {run.run_id: loaders.run_figures(run.path) for run in shown}
st.caption(f"{len(shown)} of {len(listings)} runs · select a row to open it")
render.runs_table(views.runs_table(shown, figures=figures), key="runs-table")
render.analyse_runs(views.not_analysed(shown, figures), key="runs-analyse")
