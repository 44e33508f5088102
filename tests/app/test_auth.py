"""Authentication of the served app: the rule (app_ui.access), the gate on every page
(AppTest), Launch and Cancel refused in the action itself, and the launcher
(scripts/serve.py) run for real: it refuses a public address without authentication.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from app_ui import access
from diagnostics.runs import RunWriter, list_runs
from tests.app.conftest import REPO_ROOT, _free_port
from tests.app.test_pages import PAGES, TIMEOUT_S

TOKEN = "correct-horse-battery-staple-42"
LOCK_TITLE = ":material/lock: Pipeline Doctor"
OIDC = {
    "redirect_uri": "http://localhost:8501/oauth2callback",
    "cookie_secret": "a-long-random-cookie-secret-for-tests",
    "client_id": "pipeline-doctor",
    "client_secret": "not-a-real-secret",
    "server_metadata_url": "https://idp.invalid/.well-known/openid-configuration",
}


# --- the rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "environ", "secrets", "mode"),
    [
        ("127.0.0.1", {}, None, "local"),
        ("localhost", {}, None, "local"),
        ("::1", {}, None, "local"),
        ("0.0.0.0", {}, None, "refused"),
        ("", {}, None, "refused"),  # unset: Streamlit listens on every interface
        ("10.1.2.3", {}, None, "refused"),
        ("app.example.com", {}, None, "refused"),  # a name may resolve anywhere
        ("0.0.0.0", {"PIPELINE_DOCTOR_ALLOW_ANONYMOUS": "1"}, None, "anonymous"),
        ("0.0.0.0", {"PIPELINE_DOCTOR_ALLOW_ANONYMOUS": "yes"}, None, "refused"),
        ("0.0.0.0", {"PIPELINE_DOCTOR_TOKEN": TOKEN}, None, "token"),
        ("127.0.0.1", {"PIPELINE_DOCTOR_TOKEN": TOKEN}, None, "token"),  # asked for: required
        ("0.0.0.0", {"PIPELINE_DOCTOR_TOKEN": "short"}, None, "refused"),
        ("0.0.0.0", {}, {"auth": OIDC}, "oidc"),
        ("0.0.0.0", {}, {"auth": {"redirect_uri": "x", "cookie_secret": "y"}}, "refused"),
        ("0.0.0.0", {}, {"auth": {**OIDC, "client_id": None, "google": OIDC}}, "oidc"),
    ],
)
def test_who_may_use_the_app(address, environ, secrets, mode):
    assert access.decide(address, environ, secrets).mode == mode


@pytest.mark.parametrize(
    ("headers", "client_ip", "mode"),
    [
        ({}, "127.0.0.1", "local"),
        ({"Host": "127.0.0.1:8501"}, "::1", "local"),
        ({}, None, "local"),  # no request behind the run (a script): the bind decides
        ({"X-Forwarded-For": "203.0.113.7"}, "127.0.0.1", "refused"),  # nginx on the box
        ({"forwarded": "for=203.0.113.7"}, "127.0.0.1", "refused"),
        ({"X-Real-IP": "203.0.113.7"}, "127.0.0.1", "refused"),
        ({}, "10.0.0.9", "refused"),  # a port forward from another machine
    ],
)
def test_the_local_tool_is_only_for_sessions_from_this_machine(headers, client_ip, mode):
    decided = access.for_session(access.decide("127.0.0.1", {}), headers, client_ip)
    assert decided.mode == mode
    if mode == "refused":
        assert access.TOKEN_ENV in decided.message and "\n" not in decided.message


def test_a_proxied_session_keeps_the_sign_in_it_was_given():
    # with a token or OIDC the proxy is fine: the session still has to sign in
    token = access.decide("127.0.0.1", {access.TOKEN_ENV: TOKEN})
    assert access.for_session(token, {"X-Forwarded-For": "203.0.113.7"}, "127.0.0.1") is token


def test_token_comparison():
    assert access.token_matches(TOKEN, TOKEN)
    assert not access.token_matches(TOKEN[:-1], TOKEN)
    assert not access.token_matches("", TOKEN)


# --- the gate on every page ------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in ("PIPELINE_DOCTOR_TOKEN", "PIPELINE_DOCTOR_ALLOW_ANONYMOUS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs"


@pytest.fixture
def bind_address():
    """Sets server.address for in-process AppTests (what `--server.address` sets when served)."""
    original = st_config.get_option("server.address")
    yield lambda address: st_config.set_option("server.address", address)
    st_config.set_option("server.address", original)


def app(page: str, *, secrets: dict | None = None, user: dict | None = None) -> AppTest:
    at = AppTest.from_file(str(REPO_ROOT / "app.py"), default_timeout=TIMEOUT_S)
    if secrets:
        at.secrets.update(secrets)
    if user is not None:
        at.user = user
    if page != "app.py":
        at.switch_page(page)
    return at


def only_the_gate(at: AppTest) -> bool:
    """Nothing of the page drawn: the lock title alone, no menu, no run, no form but login."""
    return (
        [t.value for t in at.title] == [LOCK_TITLE]
        and not at.sidebar.children
        and not at.dataframe
        and not at.selectbox
        and not at.file_uploader
        and all(b.label in {"Sign in", "Log in"} for b in at.button)
    )


@pytest.mark.parametrize("page", PAGES)
def test_token_gates_every_page(clean_env, monkeypatch, page):
    monkeypatch.setenv("PIPELINE_DOCTOR_TOKEN", TOKEN)
    at = app(page).run()
    assert not at.exception
    assert only_the_gate(at), [t.value for t in at.title]
    assert [w.label for w in at.text_input] == ["Access token"]


def test_a_wrong_token_is_refused_and_the_right_one_opens_every_page(clean_env, monkeypatch):
    monkeypatch.setenv("PIPELINE_DOCTOR_TOKEN", TOKEN)
    at = app("pages/2_Runs.py").run()
    at.text_input[0].input(TOKEN + "x")
    at.button[0].click().run()
    assert only_the_gate(at)
    assert [e.value for e in at.error] == ["That token is not right."]
    at.text_input[0].input(TOKEN)
    at.button[0].click().run()
    assert not at.exception
    assert [t.value for t in at.title] == [":material/table_rows: Runs"]
    # typed once per browser session: the other pages open without asking again
    at.switch_page("pages/1_Launch.py").run()
    assert [t.value for t in at.title] == [":material/rocket_launch: Launch a profiled run"]
    assert "Sign out" in [b.label for b in at.sidebar.button]


def test_oidc_shows_only_the_login_until_signed_in(clean_env, monkeypatch):
    monkeypatch.setenv("PIPELINE_DOCTOR_TOKEN", TOKEN)  # OIDC, when configured, wins
    at = app("app.py", secrets={"auth": OIDC}, user={"is_logged_in": False}).run()
    assert not at.exception
    assert only_the_gate(at)
    assert [b.label for b in at.button] == ["Log in"]
    assert not at.text_input  # no token form next to it
    at = app("app.py", secrets={"auth": OIDC}, user={"is_logged_in": True, "email": "a@b.c"})
    at.run()
    assert not at.exception
    assert [t.value for t in at.title] == [":material/medical_services: Pipeline Doctor"]
    assert "Log out" in [b.label for b in at.sidebar.button]


@pytest.mark.parametrize("page", PAGES)
def test_a_public_address_without_authentication_shows_nothing(clean_env, bind_address, page):
    bind_address("0.0.0.0")
    at = app(page).run()
    assert not at.exception
    assert only_the_gate(at)
    assert not at.text_input
    assert "refusing to serve on 0.0.0.0 without authentication" in at.error[0].value


def test_anonymous_opt_in_is_read_only(clean_env, monkeypatch, bind_address):
    """Launch and Cancel are refused in the action itself, not only by a disabled button."""
    bind_address("0.0.0.0")
    monkeypatch.setenv("PIPELINE_DOCTOR_ALLOW_ANONYMOUS", "1")
    at = app("pages/1_Launch.py").run()
    assert not at.exception
    start = next(b for b in at.button if b.label == "Start run")
    assert start.disabled
    start.proto.disabled = False  # a crafted websocket message clicks it anyway
    start.click().run()
    assert not at.exception
    assert list_runs(clean_env) == []

    busy = RunWriter.create(clean_env, {"scenario": "healthy"}, {}, run_id="busy", total_steps=9)
    busy.append_step({"step": 1, "wall_time": time.time(), "step_time_ms": 10.0})
    busy.heartbeat()
    at = app("pages/1_Launch.py").run()
    cancel = next(b for b in at.button if b.label == "Cancel run")
    assert cancel.disabled
    cancel.proto.disabled = False
    cancel.click().run()
    assert not (clean_env / "busy" / "cancel.request").exists()
    busy.finalise("cancelled")


def _action_script() -> None:
    import streamlit as st

    from app_ui import auth

    for action in ("Launch", "Cancel"):
        try:
            auth.authorise(action)
        except auth.NotAllowed as exc:
            st.error(str(exc))
        else:
            st.success(f"{action} allowed")


@pytest.mark.parametrize(
    ("address", "environ", "allowed"),
    [
        ("127.0.0.1", {}, True),  # the local tool
        ("0.0.0.0", {"PIPELINE_DOCTOR_ALLOW_ANONYMOUS": "1"}, False),
        ("0.0.0.0", {"PIPELINE_DOCTOR_TOKEN": TOKEN}, False),  # token not typed
    ],
)
def test_the_actions_check_for_themselves(
    clean_env, monkeypatch, bind_address, address, environ, allowed
):
    """Streamlit drops a forged click on a disabled button; the action checks again anyway."""
    bind_address(address)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    at = AppTest.from_function(_action_script).run()
    assert not at.exception
    if allowed:
        assert [s.value for s in at.success] == ["Launch allowed", "Cancel allowed"]
    else:
        assert [e.value for e in at.error] == [
            "Launch needs a signed-in user; this session is not signed in",
            "Cancel needs a signed-in user; this session is not signed in",
        ]


# --- the launcher, run for real ---------------------------------------------------------------


def serve(tmp_path: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("PIPELINE_DOCTOR_", "STREAMLIT_"))
    }
    environ = {
        **clean,
        "HOME": str(tmp_path),  # no ~/.streamlit/secrets.toml but the test's own
        "PIPELINE_DOCTOR_RUNS_DIR": str(tmp_path / "runs"),
        **env,
    }
    return subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "scripts" / "serve.py"), *args],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def healthy(port: int, process: subprocess.Popen[str], timeout_s: float = 90.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                return True
        except OSError:
            time.sleep(0.3)
    return False


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--address", "0.0.0.0"], {}, "refusing to serve on 0.0.0.0 without authentication"),
        ([], {"PIPELINE_DOCTOR_ADDRESS": "0.0.0.0"}, "refusing to serve on 0.0.0.0"),
        (["--address", "0.0.0.0"], {"PIPELINE_DOCTOR_TOKEN": "short"}, "at least 16"),
        (["--server.address=0.0.0.0"], {}, "give the bind address with --address"),
    ],
)
def test_serve_refuses_a_public_address_without_authentication(tmp_path, args, env, message):
    process = serve(tmp_path, *args, "--port", str(_free_port()), **env)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr  # one line, no traceback


def test_serve_refuses_oidc_without_authlib(tmp_path):
    import importlib.util

    if importlib.util.find_spec("authlib") is not None:
        pytest.fail("Authlib is installed here: this case needs an environment without it")
    (tmp_path / ".streamlit").mkdir()
    lines = [f'{key} = "{value}"' for key, value in OIDC.items()]
    (tmp_path / ".streamlit" / "secrets.toml").write_text("[auth]\n" + "\n".join(lines) + "\n")
    process = serve(tmp_path, "--address", "0.0.0.0", "--port", str(_free_port()))
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "Authlib is not installed" in stderr


@pytest.mark.slow
def test_serve_with_the_anonymous_opt_in_warns_and_serves(tmp_path):
    port = _free_port()
    process = serve(
        tmp_path, "--address", "0.0.0.0", "--port", str(port), PIPELINE_DOCTOR_ALLOW_ANONYMOUS="1"
    )
    try:
        assert healthy(port, process), process.stderr.read() if process.poll() else "no answer"
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert "WARNING: serving on 0.0.0.0 WITHOUT authentication" in stderr


@pytest.mark.browser
@pytest.mark.slow
def test_in_chromium_a_proxied_request_to_the_local_tool_sees_no_run(app_server, browser):
    """The open local tool behind a reverse proxy on the same machine: the connection comes
    from loopback, but the proxy's header says the browser is elsewhere."""
    writer = RunWriter.create(
        app_server.runs_dir, {"scenario": "healthy"}, {}, run_id="run-visible-locally"
    )
    writer.finalise("completed")
    direct = browser.new_context()
    proxied = browser.new_context(extra_http_headers={"X-Forwarded-For": "203.0.113.7"})
    try:
        page = direct.new_page()
        page.goto(f"{app_server.url}/Runs")
        # the table is drawn on a canvas; its accessible cells carry the text
        page.get_by_text("run-visible-locally").first.wait_for(state="attached", timeout=60_000)
        page = proxied.new_page()
        page.goto(f"{app_server.url}/Runs")
        page.get_by_text("came through a proxy").wait_for(timeout=60_000)
        assert "run-visible-locally" not in page.content()
    finally:
        direct.close()
        proxied.close()
