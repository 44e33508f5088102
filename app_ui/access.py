"""Who may use the served app: one rule, shared by the launcher (scripts/serve.py) and the
pages (app_ui.auth). Imports no streamlit, so the launcher decides before streamlit starts.

The rule:
- OIDC (``[auth]`` in secrets.toml, through Streamlit's st.login) when configured;
- else a shared token from ``PIPELINE_DOCTOR_TOKEN`` (at least 16 characters), typed once
  per browser session and compared in constant time;
- else, bound to a loopback address only: open, as a local tool (the default of
  scripts/app.sh), to sessions that really come from this machine: a request that carries
  a proxy's forwarding header or a non-loopback client address is refused (a reverse proxy
  on the same machine must not hand the open tool to everyone);
- else, on any other address: refused, unless ``PIPELINE_DOCTOR_ALLOW_ANONYMOUS=1``, which
  serves read-only (no Launch, no Cancel) with a warning in the log.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

TOKEN_ENV = "PIPELINE_DOCTOR_TOKEN"
ALLOW_ANONYMOUS_ENV = "PIPELINE_DOCTOR_ALLOW_ANONYMOUS"
# A shared token is the only barrier: 16 characters of a random token are ~95 bits.
MIN_TOKEN_CHARS = 16

Mode = Literal["oidc", "token", "local", "anonymous", "refused"]


@dataclass(frozen=True)
class Access:
    mode: Mode
    message: str  # one line for the log (or the page, when refused)

    @property
    def needs_login(self) -> bool:
        return self.mode in {"oidc", "token"}

    @property
    def may_act_without_login(self) -> bool:
        """Launch and Cancel without signing in: only a local tool on a loopback address."""
        return self.mode == "local"


def is_loopback(address: str | None) -> bool:
    """True for addresses only this machine reaches. Unset or empty means every interface
    (Streamlit's own default), so it is not loopback."""
    if not address:
        return False
    host = address.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def oidc_configured(secrets: Mapping[str, Any] | None) -> bool:
    """An ``[auth]`` section Streamlit's st.login can use: the shared settings and either
    one provider's client in the section itself or named ``[auth.<provider>]`` sections."""
    auth = (secrets or {}).get("auth")
    if not isinstance(auth, Mapping):
        return False
    if not auth.get("redirect_uri") or not auth.get("cookie_secret"):
        return False
    providers = [value for value in auth.values() if isinstance(value, Mapping)]
    return bool(auth.get("client_id")) or any(p.get("client_id") for p in providers)


def oidc_providers(secrets: Mapping[str, Any] | None) -> list[str]:
    """Named providers (``[auth.google]``...), empty when the section itself is one."""
    auth = (secrets or {}).get("auth") or {}
    return [name for name, value in auth.items() if isinstance(value, Mapping)]


def read_secrets(paths: Iterable[Path]) -> dict[str, Any]:
    """secrets.toml files merged in order, as Streamlit reads them (later files win)."""
    merged: dict[str, Any] = {}
    for path in paths:
        if path.is_file():
            with path.open("rb") as handle:
                merged.update(tomllib.load(handle))
    return merged


def configured_token(environ: Mapping[str, str]) -> str | None:
    token = environ.get(TOKEN_ENV, "")
    return token or None


def decide(
    address: str | None, environ: Mapping[str, str] = os.environ, secrets: Mapping | None = None
) -> Access:
    """Which access applies to a server bound to ``address``."""
    if oidc_configured(secrets):
        return Access("oidc", "authentication: OpenID Connect (st.login, [auth] in secrets.toml)")
    token = configured_token(environ)
    if token is not None:
        if len(token) < MIN_TOKEN_CHARS:
            return Access(
                "refused",
                f"{TOKEN_ENV} is {len(token)} characters; use at least {MIN_TOKEN_CHARS} "
                "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(24))'`)",
            )
        return Access("token", f"authentication: shared token from {TOKEN_ENV}")
    if is_loopback(address):
        return Access("local", f"no authentication: served on loopback {address} only")
    where = address or "every interface"
    if environ.get(ALLOW_ANONYMOUS_ENV) == "1":
        return Access(
            "anonymous",
            f"WARNING: serving on {where} WITHOUT authentication ({ALLOW_ANONYMOUS_ENV}=1): "
            "anyone who reaches the port can read every run and upload traces; Launch and "
            "Cancel are disabled",
        )
    return Access(
        "refused",
        f"refusing to serve on {where} without authentication: set {TOKEN_ENV} (a shared "
        "token), configure [auth] in .streamlit/secrets.toml (OpenID Connect), bind to "
        f"127.0.0.1, or set {ALLOW_ANONYMOUS_ENV}=1 to serve read-only without it",
    )


# Headers a reverse proxy adds (RFC 7239 and the common de-facto ones): their presence means
# the browser is on another machine even though the connection comes from loopback.
FORWARDING_HEADERS = ("forwarded", "x-forwarded-for", "x-forwarded-host", "x-real-ip")


def forwarded_by(headers: Mapping[str, str] | None, client_ip: str | None) -> str | None:
    """Why this request is not from this machine (a forwarding header, a client address
    that is not loopback), or None when it is. The local tool's openness rests on the
    loopback bind; a proxy on the same machine would otherwise hand it to anyone."""
    lowered = {str(k).lower() for k in (headers or {})}
    for header in FORWARDING_HEADERS:
        if header in lowered:
            return f"the request came through a proxy (it carries {header.title()})"
    if client_ip and not is_loopback(client_ip):
        return f"the request came from {client_ip}, another machine"
    return None


def for_session(
    decision: Access, headers: Mapping[str, str] | None, client_ip: str | None
) -> Access:
    """The server-wide decision applied to one browser session: the open local tool is
    refused to a session that reached it through a proxy or from another machine."""
    if decision.mode != "local":
        return decision
    why = forwarded_by(headers, client_ip)
    if why is None:
        return decision
    return Access(
        "refused",
        f"This server has no sign-in and is meant for this machine only, but {why}. "
        f"Set {TOKEN_ENV} (a shared token) or [auth] in .streamlit/secrets.toml "
        "(OpenID Connect) to serve it behind a proxy.",
    )


def token_matches(entered: str, expected: str) -> bool:
    """Constant time in the token's content and length (both sides hashed first)."""
    return hmac.compare_digest(
        hashlib.sha256(entered.encode()).digest(), hashlib.sha256(expected.encode()).digest()
    )
