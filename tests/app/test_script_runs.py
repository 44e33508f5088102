"""AppTest: a script run (``pipeline-doctor profile``) on Runs, Run detail, Compare and in
the reports, and its Re-run with fix: the same script, unedited, with ``--override``.

One real run shared by the module: tests/scripts/slow_loader.py (a copy in the test's
scripts folder), 8 steps, each sample sleeping 10 ms in ``__getitem__`` with
``num_workers=0``: about 40 ms of loading against well under a millisecond of compute a
step, so too-few-workers fires with a ``dataloader.num_workers`` patch.
"""

from __future__ import annotations

import hashlib
import shutil
import time

import pytest

from diagnostics.analyze import analyze
from diagnostics.report import build_report, render_markdown
from diagnostics.runs import RunFolder, list_runs
from tests.app.test_pages import open_page, texts
from tests.probe.helpers import SLOW_LOADER, profile, run_folder
from trainer.script_launch import NOT_ENABLED, SCRIPTS_DIR_ENV

ARGS = ("--steps", "8", "--sleep-ms", "10", "--hidden", "8")


@pytest.fixture(scope="module")
def script_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("script-runs")
    scripts = root / "scripts"
    scripts.mkdir()
    shutil.copy(SLOW_LOADER, scripts / "train.py")
    done = profile(root / "runs", "--no-trace", str(scripts / "train.py"), *ARGS)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, RunFolder(run_folder(done))


@pytest.fixture
def env(monkeypatch, script_run):
    root, _ = script_run
    for name in ("PIPELINE_DOCTOR_TOKEN", "PIPELINE_DOCTOR_ALLOW_ANONYMOUS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(root / "runs"))
    monkeypatch.setenv(SCRIPTS_DIR_ENV, str(root / "scripts"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return script_run


def rerun_button(at):
    return next(b for b in at.button if b.label == "Re-run with fix")


@pytest.mark.slow
def test_runs_names_the_script(env):
    _, run = env
    at = open_page("pages/2_Runs.py")
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table["scenario"]) == ["script train.py"]


@pytest.mark.slow
def test_run_detail_shows_the_script_its_hash_and_a_profile_command_not_the_trainers(env):
    root, run = env
    at = open_page("pages/3_Run_detail.py", {"run": run.run_id})
    assert not at.exception
    page = texts(at)
    assert "Script **train.py**" in page and "Scenario **—**" not in page
    script = root / "scripts" / "train.py"
    rows = at.table[0].value
    shown = dict(zip(rows["measure"], rows["value"], strict=True))
    assert shown["script"] == str(script.resolve())
    assert shown["script sha256"] == hashlib.sha256(script.read_bytes()).hexdigest()
    assert shown["script arguments"] == " ".join(ARGS)
    assert "DataLoader overrides for a re-run of your script (no edit)" in page
    assert "Config patch for the reference trainer" not in page
    codes = [c.value for c in at.code]
    # into the same runs folder, linked to this run: a re-run from a terminal pairs too
    rerun = (
        f"pipeline-doctor profile --runs-dir {(root / 'runs').resolve()} "
        f"--parent-run-id {run.run_id} --no-trace --override dataloader.num_workers="
    )
    assert any(c.startswith(rerun) for c in codes), codes
    assert not any("python -m trainer" in c or "--set " in c for c in codes)
    assert "Script log (last lines)" in [e.label for e in at.expander]


@pytest.mark.slow
def test_the_reports_of_a_script_run_give_the_profile_command(env):
    _, run = env
    markdown = render_markdown(build_report(analyze(run.path)))
    assert "**DataLoader overrides** (your script, no edit)" in markdown
    assert (
        f"pipeline-doctor profile --runs-dir {run.path.resolve().parent} "
        f"--parent-run-id {run.run_id} --no-trace --override dataloader.num_workers="
    ) in markdown
    assert "python -m trainer run" not in markdown and "(reference trainer)" not in markdown
    assert f"| script | {run.manifest().extra['script']['path']} |" in markdown


@pytest.mark.slow
def test_rerun_with_fix_is_off_with_the_reason_when_script_runs_are_off(env, monkeypatch):
    _, run = env
    monkeypatch.delenv(SCRIPTS_DIR_ENV)
    at = open_page("pages/3_Run_detail.py", {"run": run.run_id})
    button = rerun_button(at)
    assert button.disabled and button.help == NOT_ENABLED


@pytest.mark.slow
def test_rerun_with_fix_launches_the_same_script_with_the_override(env):
    root, run = env
    first = analyze(run.path)
    (finding,) = [f for f in first.findings if f.rule == "too-few-workers"]
    patch = finding.fix.config_patch
    at = open_page("pages/3_Run_detail.py", {"run": run.run_id})
    rerun_button(at).click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    (child,) = [r for r in list_runs(root / "runs") if r.parent_run_id == run.run_id]
    rerun = RunFolder(child.path)
    manifest = rerun.manifest()
    assert manifest.kind == "script"
    assert manifest.applied_patch == patch
    assert manifest.extra["script"]["sha256"] == run.manifest().extra["script"]["sha256"]
    assert manifest.extra["script"]["args"] == list(ARGS)
    deadline = time.monotonic() + 180
    while not rerun.status().is_final and time.monotonic() < deadline:
        time.sleep(0.5)
    assert rerun.status().status == "completed", rerun.log_tail(2000)
    (loader,) = rerun.dataloaders()
    # the script's own call passed num_workers=0; the wrapper applied the finding's value
    assert loader.num_workers == patch["dataloader.num_workers"]
    assert loader.overridden == {"num_workers": 0}

    # Compare: both runs by what they ran, the re-run's applied override as the difference
    at = open_page("pages/5_Compare.py", {"a": run.run_id, "b": child.run_id})
    assert not at.exception, at.exception
    pickers = [s for s in at.selectbox if s.value in (run.run_id, child.run_id)]
    labels = {s.format_func(s.value) for s in pickers}
    assert {label.split(" · ")[1] for label in labels} == {"script train.py"}
