"""The Launch page's parts: form widgets from the trainer's field info, and the live panel.

The live panel is a fragment that re-reads the run folder every 1.5 s; only it reruns,
not the page, so the form keeps what the user typed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import streamlit as st

from app_ui import auth, render
from app_ui.safe_text import md_code, md_text
from diagnostics import views
from diagnostics.dotted import flatten_dotted
from diagnostics.report import plots
from diagnostics.runs import CANCEL_FILE, FINAL_STATES, RunFolder, RunFolderError
from trainer import launch
from trainer.config import build_config

REFRESH_S = 1.5
# Live charts show the most recent steps only: enough to see the pattern, cheap to redraw.
LIVE_WINDOW_STEPS = 400


def preset_values(scenario: str, size: str = "auto") -> dict[str, Any]:
    """Every dotted key's value under a scenario's preset at a size preset (what the form
    starts at; ``auto`` shows the cpu values, as the device is only known at run start)."""
    return build_config(scenario, {"model.size": size}).to_flat()


def run_preset(run: RunFolder | None, names: list[str]) -> tuple[str, dict[str, Any]] | None:
    """(scenario, every dotted key's value) of the trainer run the page follows, for the form
    under its panel: after Re-run with fix the form holds what that run ran (the fix
    included), so Start repeats it rather than launching the healthy defaults. None for a
    script run, an unreadable one, or a scenario the form does not offer."""
    if run is None:
        return None
    try:
        manifest = run.manifest()
    except (OSError, ValueError, RunFolderError):
        return None
    scenario = manifest.config.get("scenario")
    if manifest.kind != "trainer" or scenario not in names:
        return None
    ran = flatten_dotted(manifest.config)
    values = preset_values(str(scenario))
    return str(scenario), {**values, **{k: v for k, v in ran.items() if k in values}}


def remembered_scenario(names: list[str]) -> str:
    """The scenario last chosen: the URL's (?scenario=), else this session's, else the first.
    So a reload, or a visit to another page and back, keeps the form on it."""
    for name in (st.query_params.get("scenario"), st.session_state.get("launch_scenario")):
        if name in names:
            return str(name)
    return names[0]


def remember_scenario(name: str) -> None:
    st.session_state["launch_scenario"] = name
    if st.query_params.get("scenario") != name:
        st.query_params["scenario"] = name


def check_form(overrides: dict[str, Any], scenario: str) -> dict[str, str]:
    """Field -> one-line error: the trainer's validation, then whether the device exists
    here (so "cuda" on a machine without CUDA is an error under Device, not a failed run)."""
    errors = launch.validate_overrides(overrides, scenario=scenario)
    if "device" not in errors:
        problem = launch.device_error(str(overrides.get("device", "auto")))
        if problem:
            errors["device"] = f"device: {problem}"
    return errors


_PRESET_OF = "launch_form_preset"  # session_state: which preset the form's fields hold


def form_key(form_field: views.FormField) -> str:
    return f"launch-{form_field.key}"


def load_preset(form_fields: list[views.FormField], preset: dict[str, Any], preset_id: str) -> None:
    """Puts a scenario's preset into the form's fields when the scenario (or size) changed,
    and only then: the widgets keep one identity, so switching scenario changes their values
    in place (re-keyed widgets left a faded copy of the old form on a busy machine, one of
    Streamlit's stale-element races) and what the user typed survives other reruns."""
    keys = [form_key(f) for f in form_fields]
    # Streamlit drops a widget's value once a run (another page) did not draw it
    if st.session_state.get(_PRESET_OF) == preset_id and all(k in st.session_state for k in keys):
        return
    for form_field in form_fields:
        value = views.form_value(form_field, preset[form_field.key])
        if form_field.widget == "bool":
            value = bool(value)
        elif form_field.widget == "int":
            value = int(value)
        elif form_field.widget != "choice":
            value = float(value)
        st.session_state[form_key(form_field)] = value
    st.session_state[_PRESET_OF] = preset_id


def field_widget(form_field: views.FormField, info: Any) -> Any:
    """One form widget; its value is in session_state (``load_preset`` puts it there)."""
    key = form_key(form_field)
    help_text = form_field.help or info.help
    help_text = f"{help_text}. Allowed: {info.allowed}." if info.allowed else help_text
    if form_field.widget == "bool":
        return st.checkbox(form_field.label, key=key, help=help_text)
    if form_field.widget == "choice":
        return st.selectbox(form_field.label, list(info.choices or ()), key=key, help=help_text)
    if form_field.widget == "int":
        return st.number_input(form_field.label, step=1, key=key, help=help_text)
    return st.number_input(form_field.label, step=None, format="%g", key=key, help=help_text)


def watched_run(runs_dir: Path) -> RunFolder | None:
    """The run this page follows: the URL's, else this session's last launch, else the
    run currently using the device (so a reload or a second tab finds it again)."""
    for run_id in (st.query_params.get("run"), st.session_state.get("watched_run_id")):
        if run_id:
            path = views.safe_run_path(runs_dir, run_id)
            if path is not None:
                # back from another page (the menu's links carry no ?run=): put it in the
                # URL again so that a reload, which starts a new session, still finds it
                st.session_state["watched_run_id"] = run_id
                if st.query_params.get("run") != run_id:
                    st.query_params["run"] = run_id
                return RunFolder(path)
    active = launch.active_runs(runs_dir)
    if not active:
        return None
    # follow it from now on, also after it ends (and in the URL, for a reload)
    st.session_state["watched_run_id"] = active[0].run_id
    st.query_params["run"] = active[0].run_id
    return RunFolder(active[0].path)


def panel(runs_dir: Path, run: RunFolder) -> None:
    """Progress, rate, ETA, cancel and live charts; refreshes itself while the run is live."""
    try:
        # "dead" (a late heartbeat) is not final: a trainer busy building its model on a
        # loaded machine comes back, so keep refreshing until the status is final
        live_now = not run.status().is_final
    except RunFolderError:
        live_now = False
    st.fragment(run_every=REFRESH_S if live_now else None)(_panel_body)(runs_dir, run)


def _lineage(run: RunFolder) -> str | None:
    """':material/replay: Re-run of X with `patch`' for a re-run; None otherwise."""
    try:
        manifest = run.manifest()
    except RunFolderError:
        return None
    if not manifest.parent_run_id:
        return None
    return (
        f":material/replay: Re-run of **{md_text(manifest.parent_run_id)}** with "
        f"{md_code(views.patch_summary(manifest.applied_patch))}"
    )


def _panel_body(runs_dir: Path, run: RunFolder) -> None:
    try:
        status = run.status()
        steps = run.steps()
        samples = run.samples()
    except RunFolderError as exc:
        st.error(md_text(exc), icon=":material/error:")
        return
    progress = views.progress(status, steps)
    seen_key = f"live-status-{run.run_id}"
    previous = st.session_state.get(seen_key)
    st.session_state[seen_key] = status.status
    if previous is not None and previous not in FINAL_STATES and status.is_final:
        # the run just ended: redraw the whole page so the form's Start button comes back
        st.rerun(scope="app")

    with st.container(border=True):
        head, action = st.columns([5, 1])
        head.markdown(
            f"#### {md_text(run.run_id)} &nbsp; {views.status_badge(md_text(status.status))}"
        )
        lineage = _lineage(run)
        if lineage:
            head.markdown(lineage)
        if status.is_active:
            cancel_requested = (run.path / CANCEL_FILE).exists()
            may_cancel = auth.is_authenticated()
            if action.button(
                "Cancel run",
                icon=":material/stop_circle:",
                key=f"cancel-{run.run_id}",
                disabled=cancel_requested or not may_cancel,
                help="Stops cleanly at the end of the current step; the data is kept."
                if may_cancel
                else "Sign in to cancel runs.",
                width="stretch",
            ):
                try:
                    auth.authorise("Cancel")
                except auth.NotAllowed as exc:
                    st.error(str(exc), icon=":material/block:")
                else:
                    launch.cancel_run(run.path)
                    st.toast(
                        "Cancel requested: the run stops after its current step.",
                        icon=":material/stop_circle:",
                    )
            if cancel_requested:
                st.caption("Cancel requested: stopping after the current step…")
        else:
            action.page_link(
                "pages/3_Run_detail.py",
                label="Open diagnosis",
                icon=":material/biotech:",
                query_params={"run": run.run_id},
            )
        st.progress(progress.fraction, text=progress.text)
        render.alert_state(run)
        if status.status == "completed":
            st.success(
                "Finished. Open the diagnosis to see the findings.", icon=":material/check_circle:"
            )
        elif status.status in {"failed", "dead"}:
            st.error(
                f"The run {md_text(status.status)}: {md_text(status.reason or 'no reason recorded')}",
                icon=":material/error:",
            )
            tail = run.log_tail(3000)
            if tail:
                st.code(tail, language="text")
        elif status.status in {"cancelled", "preempted"}:
            st.warning(
                f"The run was {md_text(status.status)}; its records so far are kept.",
                icon=":material/stop_circle:",
            )

        if steps.height == 0:
            st.caption("Waiting for the first step (building the model and the data)…")
            return
        recent = steps.tail(LIVE_WINDOW_STEPS)
        left, right = st.columns(2)
        with left:
            render.chart(
                plots.step_time_figure(recent), key=f"live-steps-{run.run_id}", compact=True
            )
            render.chart(
                plots.memory_figure(recent, samples), key=f"live-memory-{run.run_id}", compact=True
            )
        with right:
            render.chart(
                plots.loss_gradnorm_figure(recent), key=f"live-loss-{run.run_id}", compact=True
            )
            render.chart(
                plots.system_figure(samples), key=f"live-system-{run.run_id}", compact=True
            )
