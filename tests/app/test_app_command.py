"""``pipeline-doctor app``: the app over the runs of the folder it is started in, as
``tensorboard --logdir`` meets its writers, with no flag and no variable on either side.

A user's own folder (not the project's), a copy of tests/scripts/slow_loader.py in it:
``pipeline-doctor profile train.py`` there writes ./runs; ``pipeline-doctor app`` there
serves it, the script run's Re-run with fix is on (its script is in the folder served, and
the app is a local tool), and the re-run lands in the same ./runs, linked to its parent.
Real processes and Debian's Chromium; the launcher's folder rules are also checked without
a browser.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect

from diagnostics.runs import RunFolder, list_runs
from tests.app.conftest import REPO_ROOT, AppServer, _free_port, screenshot, served
from tests.app.test_e2e import goto, wait_idle
from tests.probe.helpers import SLOW_LOADER

ARGS = ("--steps", "8", "--sleep-ms", "10", "--hidden", "8")


def _user_env() -> dict[str, str]:
    """A shell with none of the project's variables: the folders come from where it runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_DOCTOR_")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT))
    return env


def _pipeline_doctor(*args: str) -> list[str]:
    return [sys.executable, "-m", "probe", *args]


def _serve_module():
    spec = importlib.util.spec_from_file_location("serve", REPO_ROOT / "scripts" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def serve_folders(monkeypatch, tmp_path):
    for name in ("PIPELINE_DOCTOR_RUNS_DIR", "PIPELINE_DOCTOR_SCRIPTS_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    serve = _serve_module()
    parser_args = {"runs_dir": None, "scripts_dir": None, "from_folder": None}

    def folders(mode: str = "local", **given):
        namespace = type("Args", (), {**parser_args, **given})()
        return serve._folders(namespace, mode)

    return folders


def test_the_app_command_serves_its_folders_runs_and_scripts_only_as_a_local_tool(
    serve_folders, tmp_path, monkeypatch
):
    here = {"from_folder": tmp_path}
    assert serve_folders("local", **here) == {
        "PIPELINE_DOCTOR_RUNS_DIR": str(tmp_path / "runs"),
        "PIPELINE_DOCTOR_SCRIPTS_DIR": str(tmp_path),
    }
    # signed-in visitors of a served app may run nothing the operator did not name
    for mode in ("token", "oidc", "anonymous"):
        assert serve_folders(mode, **here) == {"PIPELINE_DOCTOR_RUNS_DIR": str(tmp_path / "runs")}
    (tmp_path / "jobs").mkdir()
    named = serve_folders("token", scripts_dir=Path("jobs"), runs_dir=Path("r"), **here)
    assert named == {
        "PIPELINE_DOCTOR_RUNS_DIR": str(tmp_path / "r"),
        "PIPELINE_DOCTOR_SCRIPTS_DIR": str(tmp_path / "jobs"),
    }
    # scripts/serve.py alone (scripts/app.sh) launches no script unless told a folder
    assert "PIPELINE_DOCTOR_SCRIPTS_DIR" not in serve_folders("local")
    # the variables, when set, win over the folder the command runs in
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", "elsewhere")
    monkeypatch.setenv("PIPELINE_DOCTOR_SCRIPTS_DIR", str(tmp_path / "jobs"))
    assert serve_folders("local", **here) == {
        "PIPELINE_DOCTOR_RUNS_DIR": str(tmp_path / "elsewhere")
    }


def test_a_runs_dir_that_is_a_file_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "runs").write_text("not a folder")
    done = subprocess.run(
        _pipeline_doctor("app", "--port", str(_free_port())),
        cwd=tmp_path,
        env={**_user_env(), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"pipeline-doctor serve: --runs-dir: {tmp_path / 'runs'} is not a folder"
    )
    assert "Traceback" not in done.stderr


def _unfold(finding, button, timeout_s: float = 60.0) -> None:
    """Opens the finding's expander until ``button`` shows: a rerun of the page while it
    settles can draw the expander folded again after a click opened it."""
    deadline = time.monotonic() + timeout_s
    while not button.is_visible():
        assert time.monotonic() < deadline, "the finding did not unfold"
        finding.locator("summary").click()
        finding.page.wait_for_timeout(500)


@pytest.mark.browser
@pytest.mark.slow
def test_profile_then_app_in_one_folder_meet_and_the_rerun_is_linked(browser, tmp_path):
    project = tmp_path / "my-project"
    project.mkdir()
    shutil.copy(SLOW_LOADER, project / "train.py")
    env = {**_user_env(), "HOME": str(tmp_path)}
    done = subprocess.run(
        _pipeline_doctor("profile", "--no-trace", "train.py", *ARGS),
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = project / done.stdout.strip().splitlines()[-1]  # printed as ./runs/ID
    assert run_dir.parent == project / "runs"
    parent = run_dir.name

    port = _free_port()
    command = _pipeline_doctor("app", "--port", str(port))
    log_path = tmp_path / "app.log"
    with served(command, port=port, cwd=project, env=env, log_path=log_path) as url:
        started = log_path.read_text()
        assert f"runs folder: {project / 'runs'}" in started
        assert f"scripts may be launched from {project}" in started

        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        try:
            page = context.new_page()
            page.set_default_timeout(30_000)
            server_url = AppServer(url, project / "runs")
            goto(page, server_url, f"Run_detail?run={parent}")
            finding = page.locator('[data-testid="stExpander"]').filter(has_text="too-few-workers")
            finding = finding.first
            finding.wait_for(timeout=60_000)
            button = finding.get_by_role("button", name="Re-run with fix")
            _unfold(finding, button)
            # the command to copy names this folder's runs and the parent: a re-run from a
            # terminal is linked too
            shown = (
                f"pipeline-doctor profile --runs-dir {project / 'runs'} --parent-run-id {parent} "
                "--no-trace --override dataloader.num_workers="
            )
            expect(finding.get_by_text(shown).first).to_be_visible()
            expect(button).to_be_enabled()
            screenshot(page, "script-run-detail")
            _unfold(finding, button)  # the full-page shot's resize can fold it again
            button.click()
            page.wait_for_url(re.compile(r"/Launch\?run="), timeout=60_000)
            wait_idle(page)
            children = [r for r in list_runs(project / "runs") if r.parent_run_id == parent]
            assert len(children) == 1
            rerun = RunFolder(children[0].path)
            deadline = time.monotonic() + 180
            while not rerun.status().is_final and time.monotonic() < deadline:
                time.sleep(0.5)
            assert rerun.status().status == "completed", rerun.log_tail(2000)
            manifest = rerun.manifest()
            assert manifest.kind == "script" and manifest.config["profiler"] == {"enabled": False}
            assert list(manifest.applied_patch) == ["dataloader.num_workers"]
            goto(page, server_url, f"Run_detail?run={rerun.run_id}")
            expect(page.get_by_text(f"Re-run of {parent} with").first).to_be_visible()
            expect(page.get_by_role("link", name="Compare with the original")).to_be_visible()
        finally:
            context.close()
