"""The login gate every page passes before drawing anything (from session.setup_page), and
the check that Launch and Cancel make in the action itself.

The rule (which mode applies) is app_ui.access; this module only draws it: Streamlit's
st.login for OpenID Connect, a token form for a shared token, a refusal page when the
server is reachable from other machines with nothing configured.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import streamlit as st

from app_ui import access

_TOKEN_OK = "auth_token_ok"  # session_state: this browser session typed the right token
# A wrong token costs a second: slows guessing through one session to a crawl.
WRONG_TOKEN_DELAY_S = 1.0


class NotAllowed(RuntimeError):
    """An action (Launch, Cancel) asked for by someone who is not signed in."""


def _secrets() -> Mapping[str, Any] | None:
    return st.secrets.to_dict() if st.secrets.load_if_toml_exists() else None


def current() -> access.Access:
    """The access rule for this browser session (the server's, then this request's)."""
    server_wide = access.decide(st.get_option("server.address"), os.environ, _secrets())
    return access.for_session(server_wide, _request_headers(), _client_ip())


def _request_headers() -> Mapping[str, str]:
    try:
        return dict(st.context.headers)
    except Exception:  # no request behind this script run (AppTest, a bare script)
        return {}


def _client_ip() -> str | None:
    try:
        address = st.context.ip_address
    except Exception:
        return None
    return address if isinstance(address, str) else None  # AppTest has no real client


def _oidc_logged_in() -> bool:
    return bool(getattr(st.user, "is_logged_in", False))


def is_authenticated() -> bool:
    """Signed in through OIDC or the token, or the local tool on a loopback address."""
    mode = current().mode
    if mode == "oidc":
        return _oidc_logged_in()
    if mode == "token":
        return bool(st.session_state.get(_TOKEN_OK))
    return mode == "local"


def authorise(action: str) -> None:
    """Raises NotAllowed unless this session may run ``action`` (checked in the action,
    not only by hiding its button: a stale page or a crafted message still reaches it)."""
    if not is_authenticated():
        raise NotAllowed(f"{action} needs a signed-in user; this session is not signed in")


def gate() -> None:
    """Draws the login (or the refusal) and stops the page unless this session may see it."""
    decision = current()
    if decision.mode in {"local", "anonymous"}:
        return
    if decision.mode == "oidc" and _oidc_logged_in():
        return
    if decision.mode == "token" and st.session_state.get(_TOKEN_OK):
        return
    st.title(":material/lock: Pipeline Doctor")
    if decision.mode == "refused":
        # the words are ours (env var names and the bind address from the server's config)
        st.error(decision.message, icon=":material/block:")
    elif decision.mode == "oidc":
        st.markdown("Sign in to see the runs and diagnoses.")
        providers = access.oidc_providers(_secrets())
        for provider in providers or [None]:
            label = f"Log in with {provider}" if provider else "Log in"
            if st.button(label, icon=":material/login:", type="primary"):
                st.login(provider)
    else:
        _token_form()
    st.stop()


def _token_form() -> None:
    st.markdown("Enter the access token this server was started with.")
    with st.form("login"):
        entered = st.text_input("Access token", type="password", autocomplete="current-password")
        submitted = st.form_submit_button("Sign in", icon=":material/login:", type="primary")
    if not submitted:
        return
    expected = access.configured_token(os.environ) or ""
    if entered and access.token_matches(entered, expected):
        st.session_state[_TOKEN_OK] = True
        st.rerun()
    time.sleep(WRONG_TOKEN_DELAY_S)
    st.error("That token is not right.", icon=":material/error:")


def account_menu() -> None:
    """Who is signed in, and a way out (in the sidebar)."""
    mode = current().mode
    if mode == "oidc" and _oidc_logged_in():
        name = getattr(st.user, "email", None) or getattr(st.user, "name", None) or "signed in"
        st.text(f"Signed in as {name}")  # st.text: an e-mail claim is not markdown
        if st.button("Log out", icon=":material/logout:"):
            st.logout()
    elif mode == "token" and st.session_state.get(_TOKEN_OK):
        if st.button("Sign out", icon=":material/logout:"):
            st.session_state[_TOKEN_OK] = False
            st.rerun()
    elif mode == "anonymous":
        st.caption("Read-only: this server has no sign-in, so Launch and Cancel are off.")
