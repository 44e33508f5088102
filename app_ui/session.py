"""Page setup and the per-browser-session defaults (no module-level mutable state)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import streamlit as st

from app_ui import auth
from diagnostics.views import resolve_runs_dir

# Every key a page keeps in st.session_state, with its default. Each browser session has
# its own copy; nothing is shared between users except the runs directory on disk.
SESSION_DEFAULTS: Mapping[str, object] = MappingProxyType(
    {
        "watched_run_id": None,  # the run the Launch page follows
        "launch_scenario": None,  # the Launch form's scenario, kept across pages
        "launch_errors": {},  # field -> message from the last rejected launch
        # ((upload key, mode), UploadSet | None, error | None)
        "upload_analysis": None,
        "upload_mode": None,  # (upload key, "ranks" | "separate"): the user's answer
        "saved_upload_dir": None,  # where the user saved the current upload, if they did
    }
)


def init_session() -> None:
    for key, value in SESSION_DEFAULTS.items():
        st.session_state.setdefault(key, value.copy() if isinstance(value, dict) else value)


# The sidebar menu (Streamlit's own is turned off in .streamlit/config.toml so that the
# entry file reads "Home" rather than "app").
NAVIGATION: tuple[tuple[str, str, str], ...] = (
    ("app.py", "Home", ":material/home:"),
    ("pages/1_Launch.py", "Launch", ":material/rocket_launch:"),
    ("pages/2_Runs.py", "Runs", ":material/table_rows:"),
    ("pages/3_Run_detail.py", "Run detail", ":material/biotech:"),
    ("pages/4_Upload_trace.py", "Upload trace", ":material/upload_file:"),
    ("pages/5_Compare.py", "Compare", ":material/compare_arrows:"),
    ("pages/6_Rules.py", "Rules", ":material/menu_book:"),
)


# The tab icon is a file shipped with the app: a ":material/…:" page icon makes the browser
# fetch an SVG from fonts.gstatic.com on every page (nothing else the app shows does; the
# fonts, Material Symbols included, ship inside Streamlit's own static files).
FAVICON = Path(__file__).resolve().parent / "static" / "favicon.png"


def setup_page(title: str, icon: str = ":material/medical_services:") -> None:
    """Page config, the login gate, session defaults and the menu: the first call on every
    page (each page script runs on its own, so each calls it). Nothing of the page, not
    even the menu, is drawn before the gate lets this session through. ``icon`` is the
    page's own icon in the menu and titles; the browser tab shows the local favicon."""
    del icon  # kept in the signature: pages pass their icon, the tab shows FAVICON
    st.set_page_config(
        page_title=f"{title} · Pipeline Doctor", page_icon=str(FAVICON), layout="wide"
    )
    auth.gate()
    init_session()
    with st.sidebar:
        st.markdown("### :material/medical_services: Pipeline Doctor")
        for page, label, page_icon in NAVIGATION:
            st.page_link(page, label=label, icon=page_icon)
        auth.account_menu()


def runs_dir() -> Path:
    """Read per call (not at import) so tests and deployments can point it elsewhere."""
    path = resolve_runs_dir(os.environ)
    path.mkdir(parents=True, exist_ok=True)
    return path
