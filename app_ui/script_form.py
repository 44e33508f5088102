"""The Launch page's form for a user's own script (``pipeline-doctor profile``).

Widgets only: what may start, and how, is trainer.script_launch. The run it starts is
followed by the same live panel (app_ui.live) and cancelled the same way as a trainer run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import streamlit as st

from app_ui import auth
from app_ui.safe_text import md_code, md_text
from diagnostics.runs import RunListing
from trainer import script_launch
from trainer.launch import LaunchError

# "unchanged" keeps what the script's own DataLoader(...) call passes
UNCHANGED = "as the script sets it"
_ERROR_KEY = "script_launch_error"


def start_button(label: str, busy: list[RunListing], may_launch: bool) -> bool:
    """A launch form's submit button, held while another run uses the device (one run at a
    time, said above it) or while the visitor may not launch."""
    if busy:
        st.warning(
            f"**{md_text(busy[0].run_id)}** is using the device. One run at a time: wait "
            "for it to finish or cancel it above, then start this one.",
            icon=":material/hourglass_top:",
        )
    return st.form_submit_button(
        label,
        type="primary",
        icon=":material/play_arrow:",
        disabled=bool(busy) or not may_launch,
        help=None if may_launch else "Sign in to launch runs.",
        width="stretch",
    )


def _overrides(num_workers: int, pin_memory: str, persistent: str, prefetch: int) -> dict:
    chosen: dict[str, Any] = {}
    if num_workers >= 0:
        chosen["num_workers"] = int(num_workers)
    for name, value in (("pin_memory", pin_memory), ("persistent_workers", persistent)):
        if value != UNCHANGED:
            chosen[name] = value == "true"
    if prefetch > 0:
        chosen["prefetch_factor"] = int(prefetch)
    return chosen


def draw(runs_dir: Path, busy: list[RunListing], may_launch: bool) -> None:
    """The script form, or the one line saying how to enable it."""
    try:
        folder = script_launch.scripts_dir()
    except script_launch.ScriptRefused as exc:
        st.error(md_text(exc), icon=":material/error:")
        return
    if folder is None:
        st.info(script_launch.NOT_ENABLED, icon=":material/info:")
        return
    st.caption(f"Scripts under {md_code(folder)} run unmodified under the instruments.")
    with st.form("launch-script"):
        script = st.text_input(
            "Script",
            placeholder="train.py",
            help="A path under the scripts folder (relative to it, or absolute).",
        )
        arguments = st.text_input(
            "Arguments",
            placeholder="--epochs 1 --batch-size 64",
            help="Split as a shell would, but never run by one.",
        )
        nproc_column, steps_column, alert_column = st.columns(3)
        nproc = nproc_column.number_input(
            "Processes per node",
            min_value=1,
            max_value=64,
            value=1,
            help="More than one: the script runs under torchrun.",
        )
        steps = steps_column.number_input(
            "Steps (0: as many as the script takes)", min_value=0, value=0, step=1
        )
        alert_after_s = alert_column.number_input(
            "Alert when the run passes (seconds, 0 = off)",
            min_value=0.0,
            value=0.0,
            format="%g",
            help="posts once to the webhook in $PIPELINE_DOCTOR_ALERT_WEBHOOK "
            "(Slack-compatible) with the run, its step, elapsed time and ETA; never stops it",
        )
        st.markdown("**DataLoader overrides** (applied as the script builds its loaders)")
        columns = st.columns(4)
        workers = columns[0].number_input(
            "num_workers (-1: unchanged)", min_value=-1, value=-1, step=1
        )
        pin = columns[1].selectbox("pin_memory", [UNCHANGED, "true", "false"])
        persistent = columns[2].selectbox("persistent_workers", [UNCHANGED, "true", "false"])
        prefetch = columns[3].number_input(
            "prefetch_factor (0: unchanged)", min_value=0, value=0, step=1
        )
        submitted = start_button("Start script run", busy, may_launch)
    if submitted:
        try:
            auth.authorise("Launch")
            request = script_launch.ScriptRequest(
                script=script,
                arguments=script_launch.split_arguments(arguments),
                steps=int(steps) or None,
                nproc_per_node=int(nproc),
                overrides=_overrides(int(workers), pin, persistent, int(prefetch)),
                alert_after_s=float(alert_after_s) or None,
            )
            launched = script_launch.start_script_run(request, runs_dir=runs_dir)
        except (script_launch.ScriptRefused, LaunchError, auth.NotAllowed) as exc:
            st.session_state[_ERROR_KEY] = str(exc)
        else:
            st.session_state.pop(_ERROR_KEY, None)
            st.session_state["watched_run_id"] = launched.run_id
            st.query_params["run"] = launched.run_id
        st.rerun()
    if st.session_state.get(_ERROR_KEY):
        st.error(md_text(st.session_state[_ERROR_KEY]), icon=":material/error:")
