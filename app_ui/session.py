"""Page setup and the per-browser-session defaults (no module-level mutable state)."""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from diagnostics.views import resolve_runs_dir

# Every key a page keeps in st.session_state, with its default. Each browser session has
# its own copy; nothing is shared between users except the runs directory on disk.
SESSION_DEFAULTS: dict[str, object] = {
    "watched_run_id": None,  # the run the Launch page follows
    "launch_errors": {},  # field -> message from the last rejected launch
    "launch_notice": None,  # one-line outcome of the last launch/cancel
    "upload_analysis": None,  # (upload key, AnalysisResult | None, error | None)
    "saved_upload_dir": None,  # where the user saved the current upload, if they did
    "rerun_notice": None,  # (run id, patch summary) after "Re-run with fix"
}


def init_session() -> None:
    for key, value in SESSION_DEFAULTS.items():
        st.session_state.setdefault(key, value.copy() if isinstance(value, dict) else value)


def setup_page(title: str, icon: str = "🩺") -> None:
    """Page config and session defaults; the first call on every page (each page runs alone)."""
    st.set_page_config(page_title=f"{title} · Pipeline Doctor", page_icon=icon, layout="wide")
    init_session()


def runs_dir() -> Path:
    """Read per call (not at import) so tests and deployments can point it elsewhere."""
    path = resolve_runs_dir(os.environ)
    path.mkdir(parents=True, exist_ok=True)
    return path
