"""AppTest: the Launch page's script form (``pipeline-doctor profile`` from the app).

Script runs are off until PIPELINE_DOCTOR_SCRIPTS_DIR names a folder; a path that leaves
it (absolute, through ``..``, through a symlink) is refused with one line and starts
nothing; a script inside it starts, and its run folder (kind ``script``) holds the
script's own output; a served app's visitor who has not signed in cannot start one.
The script is tests/scripts/slow_loader.py (a copy in the test's scripts folder), 3 steps.
"""

from __future__ import annotations

import shutil
import time

import pytest
from streamlit import config as st_config

from diagnostics.runs import RunFolder, list_runs
from tests.app.test_pages import open_page, texts
from tests.probe.helpers import SLOW_LOADER
from trainer.script_launch import NOT_ENABLED, SCRIPTS_DIR_ENV

TOKEN = "a-long-enough-test-token-123"


@pytest.fixture
def script_env(monkeypatch, tmp_path):
    """A runs folder, a scripts folder with train.py in it, and outside.py beside it."""
    for name in ("PIPELINE_DOCTOR_TOKEN", "PIPELINE_DOCTOR_ALLOW_ANONYMOUS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two cores shared by several jobs
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(SLOW_LOADER, scripts / "train.py")
    shutil.copy(SLOW_LOADER, tmp_path / "outside.py")
    (scripts / "link.py").symlink_to(tmp_path / "outside.py")
    monkeypatch.setenv(SCRIPTS_DIR_ENV, str(scripts))
    return tmp_path


def script_page(query: dict | None = None):
    return open_page("pages/1_Launch.py", {"launch": "script", **(query or {})})


def start(at, script: str, arguments: str = ""):
    next(t for t in at.text_input if t.label == "Script").set_value(script)
    next(t for t in at.text_input if t.label == "Arguments").set_value(arguments)
    return next(b for b in at.button if b.label == "Start script run").click().run()


def test_with_the_folder_unset_the_form_is_one_line_and_nothing_starts(script_env, monkeypatch):
    monkeypatch.delenv(SCRIPTS_DIR_ENV)
    at = script_page()
    assert not at.exception
    assert [i.value for i in at.info] == [NOT_ENABLED]
    assert "PIPELINE_DOCTOR_SCRIPTS_DIR" in NOT_ENABLED
    assert not [b for b in at.button if b.label == "Start script run"]


@pytest.mark.parametrize(
    "path",
    ["{tmp}/outside.py", "../outside.py", "link.py", "./sub/../../outside.py"],
    ids=["absolute", "dot-dot", "symlink", "dot-dot-inside"],
)
def test_a_script_outside_the_folder_is_refused_in_one_line(script_env, path):
    at = start(script_page(), path.format(tmp=script_env))
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "is outside the scripts folder" in errors[0], errors
    assert "\n" not in errors[0]
    assert list_runs(script_env / "runs") == []


@pytest.mark.slow
def test_a_script_inside_the_folder_runs_as_a_script_run_with_its_output(script_env):
    at = start(script_page(), "train.py", "--steps 3 --sleep-ms 1 --hidden 8")
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    (listing,) = list_runs(script_env / "runs")
    run = RunFolder(listing.path)
    manifest = run.manifest()
    assert manifest.kind == "script"
    assert manifest.extra["script"]["path"] == str(script_env / "scripts" / "train.py")
    assert manifest.extra["script"]["args"] == ["--steps", "3", "--sleep-ms", "1", "--hidden", "8"]
    # the page follows it, as it does a trainer run
    assert at.query_params["run"] in (listing.run_id, [listing.run_id])
    assert f"#### {listing.run_id}" in texts(at)
    deadline = time.monotonic() + 180
    while not run.status().is_final and time.monotonic() < deadline:
        time.sleep(0.5)
    assert run.status().status == "completed", run.log_tail(2000)
    log = (run.path / "log.txt").read_text()
    # slow_loader prints one line a step: the script's own output is kept in the run
    assert [line.split()[:2] for line in log.splitlines() if line.startswith("step ")] == [
        ["step", "1"],
        ["step", "2"],
        ["step", "3"],
    ]
    assert run.steps().height == 3


@pytest.fixture
def served_on(monkeypatch):
    original = st_config.get_option("server.address")
    yield lambda address: st_config.set_option("server.address", address)
    st_config.set_option("server.address", original)


def test_a_visitor_of_a_served_app_without_sign_in_cannot_start_a_script(
    script_env, monkeypatch, served_on
):
    served_on("0.0.0.0")
    monkeypatch.setenv("PIPELINE_DOCTOR_ALLOW_ANONYMOUS", "1")  # served read-only
    at = script_page()
    button = next(b for b in at.button if b.label == "Start script run")
    assert button.disabled
    button.proto.disabled = False  # a crafted websocket message clicks it anyway
    next(t for t in at.text_input if t.label == "Script").set_value("train.py")
    button.click().run()
    assert not at.exception
    # Streamlit drops the click; were it not dropped, the form calls auth.authorise first
    # (its refusal is test_auth.test_the_actions_check_for_themselves)
    assert list_runs(script_env / "runs") == []

    # with a token configured and not typed, only the sign-in form is drawn
    monkeypatch.delenv("PIPELINE_DOCTOR_ALLOW_ANONYMOUS")
    monkeypatch.setenv("PIPELINE_DOCTOR_TOKEN", TOKEN)
    at = script_page()
    assert not [b for b in at.button if b.label == "Start script run"]
    assert [b.label for b in at.button] == ["Sign in"]


@pytest.mark.slow
def test_the_live_panels_cancel_stops_a_script_run_and_keeps_its_records(script_env):
    at = start(script_page(), "train.py", "--steps 200 --sleep-ms 1 --hidden 8 --linger-s 0.5")
    assert not at.exception and not at.error, [e.value for e in at.error]
    (listing,) = list_runs(script_env / "runs")
    run = RunFolder(listing.path)
    deadline = time.monotonic() + 120
    while run.steps().height < 1 and time.monotonic() < deadline:  # records reach disk
        time.sleep(0.5)
    at = script_page({"run": listing.run_id})
    next(b for b in at.button if b.label == "Cancel run").click().run()
    assert not at.exception
    assert (run.path / "cancel.request").exists()
    while not run.status().is_final and time.monotonic() < deadline:
        time.sleep(0.5)
    status = run.status()
    assert (status.status, status.reason) == ("cancelled", "cancel requested")
    assert 1 <= run.steps().height < 200
