"""Run detail: summary cards, ranked findings with evidence and fixes, charts, reports.

Opened with ?run=<run id>; "Re-run with fix" launches the same config with a finding's
patch and follows the new run on the Launch page.
"""

from __future__ import annotations

import streamlit as st

from app_ui import auth, drilldown, loaders, ranks, render, session
from app_ui.safe_text import md_code, md_text
from diagnostics import views
from diagnostics.errors import InputError
from diagnostics.runs import RunFolder, RunFolderError, list_runs
from trainer import launch, script_launch

session.setup_page("Run detail", ":material/biotech:")
runs_dir = session.runs_dir()
listings = list_runs(runs_dir)

st.title(":material/biotech: Run detail")
if not listings:
    st.info("No runs yet. Launch one to see its diagnosis here.", icon=":material/info:")
    st.page_link("pages/1_Launch.py", label="Launch a run", icon=":material/rocket_launch:")
    st.stop()

requested = st.query_params.get("run")
run = views.find_run(listings, requested)
if requested and run is None:
    st.error(
        f"Run {md_code(requested)} was not found in {md_code(runs_dir)}.", icon=":material/error:"
    )
ids = [r.run_id for r in listings]
chosen = st.selectbox(
    "Run (newest first)",
    ids,
    index=ids.index(run.run_id) if run else 0,
    format_func=lambda run_id: views.run_choice_label(views.find_run(listings, run_id)),
)
if chosen != requested:
    st.query_params["run"] = chosen
run = views.find_run(listings, chosen)
folder = RunFolder(run.path)
try:
    manifest = folder.manifest()
    status = folder.status()
except RunFolderError as exc:  # a folder from another version, or half-written by a crash
    st.error(md_text(exc), icon=":material/error:")
    st.stop()

st.subheader(md_text(run.run_id), divider="gray")
is_script = manifest.kind == "script"
st.markdown(
    (
        f"Script **{md_text(run.script)}**"
        if is_script
        else f"Scenario **{md_text(run.scenario or '—')}**"
    )
    + f" · {views.status_badge(md_text(status.status))}"
    + (f" ({md_text(status.reason)})" if status.reason else "")
    + f" · started {views.fmt_when(run.created_at)}"
    + f" · {views.fmt_seconds(views.run_duration_s(status))}"
    + f" · {md_text(manifest.environment.get('device', 'device unknown'))}"
)
render.alert_state(folder)
if is_script:  # what ran: the file, its hash, the command line (run.json's own strings)
    st.table(
        render.text_cells(views.script_table(manifest)),
        hide_index=True,
        hide_header=True,
        border="horizontal",
    )
if manifest.parent_run_id:
    st.markdown(
        f":material/replay: Re-run of **{md_text(manifest.parent_run_id)}** with "
        + md_code(views.patch_summary(manifest.applied_patch))
    )
    left, right = st.columns(2)
    left.page_link(
        "pages/3_Run_detail.py",
        label="Open the original run",
        icon=":material/arrow_back:",
        query_params={"run": manifest.parent_run_id},
    )
    right.page_link(
        "pages/5_Compare.py",
        label="Compare with the original",
        icon=":material/compare_arrows:",
        query_params={"a": manifest.parent_run_id, "b": run.run_id},
    )
for child in views.children_of(listings, run.run_id):
    st.page_link(
        "pages/5_Compare.py",
        label=md_text(f"Compare with its re-run {child.run_id} ({child.status.status})"),
        icon=":material/compare_arrows:",
        query_params={"a": run.run_id, "b": child.run_id},
    )
if status.is_active:
    st.info(
        "This run is still going; the figures below cover the steps so far.", icon=":material/sync:"
    )
    st.page_link(
        "pages/1_Launch.py",
        label="Watch it live",
        icon=":material/monitoring:",
        query_params={"run": run.run_id},
    )

try:
    result = loaders.analyse_run(run.path)
except InputError as exc:
    st.error(md_text(exc), icon=":material/error:")
    st.stop()

render.cards(result)
try:
    rank_view = views.rank_view(folder, result)
except RunFolderError as exc:  # one rank's records cut short: the rest of the page still shows
    st.error(md_text(exc), icon=":material/error:")
    rank_view = None
if rank_view is not None:  # a distributed run
    ranks.rank_section(rank_view, key_prefix="run")

busy = launch.active_runs(runs_dir)
st.subheader("Findings")
pressed = render.findings(
    result,
    key_prefix="run",
    config=manifest.config,
    can_rerun=bool(manifest.scenario) or is_script,
    rerun_disabled_reason=(
        "Sign in to launch runs."
        if not auth.is_authenticated()
        else f"{md_text(busy[0].run_id)} is using the device; re-run when it has finished."
        if busy
        else script_launch.rerun_blocker(manifest)
        if is_script
        else None
    ),
)
if pressed is not None and pressed.fix.config_patch and is_script:
    try:
        auth.authorise("Launch")
        launched = script_launch.start_rerun(manifest, pressed.fix.config_patch, runs_dir=runs_dir)
    except (launch.LaunchError, script_launch.ScriptRefused, auth.NotAllowed) as exc:
        st.error(f"Could not start the re-run: {md_text(exc)}", icon=":material/error:")
    else:
        st.session_state["watched_run_id"] = launched.run_id
        st.switch_page("pages/1_Launch.py", query_params={"run": launched.run_id})
    pressed = None
if pressed is not None and pressed.fix.config_patch:
    overrides = views.rerun_overrides(
        manifest.config,
        pressed.fix.config_patch,
        [field.key for field in launch.config_fields()],
    )
    device = str(overrides.pop("device", "auto"))
    try:
        auth.authorise("Launch")
        launched = launch.start_run(
            scenario=str(manifest.scenario),
            overrides=overrides,
            runs_dir=runs_dir,
            device=device,
            parent_run_id=run.run_id,
            applied_patch=pressed.fix.config_patch,
        )
    except (launch.LaunchError, ValueError, auth.NotAllowed) as exc:
        st.error(f"Could not start the re-run: {md_text(exc)}", icon=":material/error:")
    else:
        st.session_state["watched_run_id"] = launched.run_id
        st.switch_page("pages/1_Launch.py", query_params={"run": launched.run_id})

st.subheader("Charts")
render.run_charts(result, key_prefix="run")
render.memory_snapshot(result, key_prefix="run")
render.notes(result)

st.subheader("Drill down")
drilldown.drilldown(loaders.run_drilldowns(run.path), key_prefix="run")

st.subheader("Open the trace in TensorBoard")
if folder.trace_files():
    st.code(views.tensorboard_command(run.path), language="bash")
else:
    st.caption("This run recorded no profiler trace (instruments off or stopped early).")

st.subheader("Report")
render.downloads(
    lambda fmt: render.report_text(result, fmt), base_name=f"{run.run_id}-report", key_prefix="run"
)

with st.expander("Configuration"):
    st.dataframe(views.config_table(manifest.config), hide_index=True, width="stretch")
with st.expander("Script log (last lines)" if is_script else "Trainer log (last lines)"):
    st.code(folder.log_tail(8000) or "(empty)", language="text")
