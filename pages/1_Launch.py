"""Launch: configure a profiled run of the reference trainer or of the user's own script
(?launch=script; app_ui.script_form), start it, watch it live.

The trainer runs as its own process (trainer.launch.start_run); this page only reads its
run folder. The run being watched is in the URL (?run=<id>) and is otherwise found again
from the runs folder, so reloading or leaving the page loses nothing.
"""

from __future__ import annotations

import streamlit as st

from app_ui import auth, live, script_form, session
from app_ui.safe_text import md_text
from diagnostics import views
from trainer import launch

session.setup_page("Launch", ":material/rocket_launch:")
runs_dir = session.runs_dir()
st.title(":material/rocket_launch: Launch a profiled run")

watched = live.watched_run(runs_dir)
if watched is not None:
    live.panel(runs_dir, watched)

busy = launch.active_runs(runs_dir)
may_launch = auth.is_authenticated()
LAUNCH_KINDS = {"trainer": "The reference trainer", "script": "Your own script"}
kind = st.radio(
    "Run",
    list(LAUNCH_KINDS),
    index=1 if st.query_params.get("launch") == "script" else 0,
    format_func=LAUNCH_KINDS.__getitem__,
    horizontal=True,
)
if kind == "script":
    st.query_params["launch"] = "script"
    script_form.draw(runs_dir, busy, may_launch)
    st.stop()
st.query_params.pop("launch", None)
described = {**launch.SCENARIOS, **launch.DISTRIBUTED_SCENARIOS}
names = list(described)
if watched is not None and st.session_state.get("launch_form_run") != watched.run_id:
    # a run newly followed (a launch, a Re-run with fix, a link): the form takes its config
    st.session_state["launch_form_run"] = watched.run_id
    followed = live.run_preset(watched, names)
    st.session_state["launch_form_values"] = followed
    if followed is not None:
        live.remember_scenario(followed[0])
        st.session_state[live.form_key(views.SIZE_FIELD)] = "auto"
scenario = st.selectbox(
    "Scenario",
    names,
    index=names.index(live.remembered_scenario(names)),
    format_func=lambda name: f"{name} — {described[name]}",
    help="A preset of the settings below; change any of them before starting.",
)
live.remember_scenario(scenario)
fields = {info.key: info for info in launch.config_fields()}
st.session_state.setdefault(live.form_key(views.SIZE_FIELD), "auto")
size = live.field_widget(views.SIZE_FIELD, fields["model.size"])
preset = live.preset_values(scenario, size)
errors: dict[str, str] = st.session_state["launch_errors"]
# switching either puts that preset into the form's fields; the followed run's own values
# while the form is still on its scenario
ran = st.session_state.get("launch_form_values")
form_fields = [f for _, section_fields in views.LAUNCH_FORM for f in section_fields]
if ran is not None and ran[0] == scenario and size == "auto":
    live.load_preset(form_fields, ran[1], f"run-{st.session_state['launch_form_run']}")
else:
    live.load_preset(form_fields, preset, f"{scenario}-{size}")

with st.form("launch"):
    values: dict[str, object] = {}
    for section, form_fields in views.LAUNCH_FORM:
        st.markdown(f"**{section}**")
        columns = st.columns(len(form_fields))
        for column, form_field in zip(columns, form_fields, strict=True):
            with column:
                values[form_field.key] = live.field_widget(form_field, fields[form_field.key])
                if form_field.key in errors:
                    st.error(errors[form_field.key], icon=":material/warning:")
    st.markdown("**Processes** (a DDP job under torchrun when more than one)")
    nproc_column, nodes_column, endpoint_column = st.columns(3)
    nproc = nproc_column.number_input(
        "Processes per node",
        min_value=1,
        max_value=64,
        value=2 if scenario in launch.DISTRIBUTED_SCENARIOS else 1,
        help="One per GPU on CUDA (nccl); on CPU each takes one core (gloo).",
    )
    nnodes = nodes_column.number_input("Nodes", min_value=1, max_value=1024, value=1)
    endpoint = endpoint_column.text_input(
        "Rendezvous HOST:PORT",
        placeholder="this node's address:29500",
        help="Nodes > 1: node 0's address, reachable by every node. The runs folder must "
        "be on a file system all nodes share.",
    )
    submitted = script_form.start_button("Start run", busy, may_launch)

if submitted:
    overrides = {**views.form_overrides(values, preset), "model.size": size}
    errors = live.check_form(overrides, scenario)
    st.session_state["launch_errors"] = errors
    if not errors:
        device = str(overrides.pop("device"))
        try:
            auth.authorise("Launch")
            launched = launch.start_run(
                scenario=scenario,
                overrides=overrides,
                runs_dir=runs_dir,
                device=device,
                nproc_per_node=int(nproc),
                nnodes=int(nnodes),
                rdzv_endpoint=endpoint or None,
            )
        except (launch.LaunchError, ValueError, auth.NotAllowed) as exc:
            st.session_state["launch_errors"] = {"": str(exc)}
        else:
            st.session_state["watched_run_id"] = launched.run_id
            st.query_params["run"] = launched.run_id
            st.session_state["other_node_commands"] = [
                launch.other_node_command(list(launched.command), rank)
                for rank in range(1, int(nnodes))
            ]
    st.rerun()
for command in st.session_state.get("other_node_commands", []):
    st.markdown("Run on the other node (same runs folder, on the shared file system):")
    st.code(command, language="bash")
other_errors, summary = views.form_error_summary(errors)
for (
    message
) in other_errors:  # a launch failure (the trainer's own last line) or a check across fields
    st.error(md_text(message), icon=":material/error:")
if summary:
    st.error(summary, icon=":material/warning:")
