"""Pipeline Doctor: the home page (the other pages are discovered from pages/)."""

from __future__ import annotations

import streamlit as st

from app_ui import loaders, render, session
from app_ui.safe_text import md_code, md_text
from diagnostics import views
from diagnostics.runs import list_runs

session.setup_page("Home")
runs_dir = session.runs_dir()

st.title(":material/medical_services: Pipeline Doctor")
st.markdown(
    "Finds why a PyTorch training job is slow, unstable or leaking memory — an idle GPU, a "
    "starved DataLoader, pageable copies, exploding gradients, a leak.  \n"
    "It shows the evidence, gives the fix as code and as a config patch, and re-runs with "
    "the fix to prove it."
)

launch, upload, rules = st.columns(3)
launch.page_link(
    "pages/1_Launch.py",
    label="**Launch a profiled run**",
    icon=":material/rocket_launch:",
    width="stretch",
)
upload.page_link(
    "pages/4_Upload_trace.py",
    label="**Upload a trace from your job**",
    icon=":material/upload_file:",
    width="stretch",
)
rules.page_link(
    "pages/6_Rules.py", label="**What it checks**", icon=":material/menu_book:", width="stretch"
)

listings = list_runs(runs_dir)
active = [run for run in listings if run.status.is_active]
for run in active:
    st.info(
        f"**{md_text(run.run_id)}** is running ({run.status.step:,}"
        + (f" of {run.status.total_steps:,}" if run.status.total_steps else "")
        + " steps).",
        icon=":material/sync:",
    )
    st.page_link(
        "pages/1_Launch.py",
        label="Watch it live",
        icon=":material/monitoring:",
        query_params={"run": run.run_id},
    )

st.subheader("Recent runs")
if not listings:
    st.caption(
        f"No runs yet in {md_code(runs_dir)}. Launch one, or upload a trace recorded with torch.profiler."
    )
else:
    recent = listings[:8]
    figures = {run.run_id: loaders.run_figures(run.path) for run in recent}
    render.runs_table(views.runs_table(recent, figures=figures), key="home-runs")
    st.page_link("pages/2_Runs.py", label=f"All {len(listings)} runs", icon=":material/table_rows:")
