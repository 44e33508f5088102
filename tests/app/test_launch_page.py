"""AppTest: the Launch page keeps its scenario and watched run, names the re-run's origin,
labels its rates, and checks the device before starting anything."""

from __future__ import annotations

import time

import polars as pl
import pytest

from diagnostics import views
from diagnostics.runs import STEP_SCHEMA, RunFolder, RunStatus, list_runs
from probe.alert import ALERT_WEBHOOK_ENV
from tests.alert_webhook import Webhook
from tests.app.test_pages import open_page, texts


@pytest.fixture
def empty_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs"


def test_cuda_without_cuda_is_an_error_under_device_and_starts_nothing(
    empty_env, no_cuda_for_children
):
    at = open_page("pages/1_Launch.py")
    device = next(s for s in at.selectbox if s.label == "Device")
    device.set_value("cuda")
    next(b for b in at.button if b.label == "Start run").click().run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any(e.startswith("device: CUDA was requested") for e in errors), errors
    assert any("1 setting needs fixing" in e for e in errors), errors
    assert list_runs(empty_env) == []


def test_the_scenario_survives_going_to_another_page_and_back(empty_env):
    at = open_page("pages/1_Launch.py")
    scenario = next(s for s in at.selectbox if s.label == "Scenario")
    scenario.set_value("slow-loader").run()
    assert at.query_params["scenario"] in ("slow-loader", ["slow-loader"])
    at.switch_page("pages/2_Runs.py").run()
    at.query_params.clear()  # the menu's links carry no query
    at.switch_page("pages/1_Launch.py").run()
    assert not at.exception
    assert next(s for s in at.selectbox if s.label == "Scenario").value == "slow-loader"
    # the form follows it: slow-loader has no workers
    assert next(n for n in at.number_input if n.label == "DataLoader workers").value == 0


def test_a_reload_with_the_scenario_in_the_url_keeps_it(empty_env):
    at = open_page("pages/1_Launch.py", {"scenario": "no-pin-memory"})
    assert next(s for s in at.selectbox if s.label == "Scenario").value == "no-pin-memory"


@pytest.mark.slow
def test_a_re_runs_panel_says_what_it_re_runs_and_the_watched_run_comes_back(
    monkeypatch, trained_runs
):
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(trained_runs.runs_dir))
    at = open_page("pages/1_Launch.py", {"run": trained_runs.fixed.name})
    assert not at.exception
    assert f"Re-run of **{trained_runs.slow.name}** with `data.num_workers = 2`" in texts(at)
    # to another page and back through the menu: the same run is followed, and in the URL
    at.switch_page("pages/2_Runs.py").run()
    at.query_params.clear()
    at.switch_page("pages/1_Launch.py").run()
    assert f"#### {trained_runs.fixed.name}" in texts(at)
    assert at.query_params["run"] in (trained_runs.fixed.name, [trained_runs.fixed.name])


def test_progress_labels_the_recent_and_the_overall_rate():
    now = time.time()
    # 30 steps: the first 10 at one a second, the last 20 at two a second
    walls = [now + i for i in range(10)] + [now + 9 + 0.5 * i for i in range(1, 21)]
    steps = pl.DataFrame(
        {"step": list(range(1, 31)), "wall_time": walls},
        schema_overrides={"step": STEP_SCHEMA["step"], "wall_time": STEP_SCHEMA["wall_time"]},
    )
    status = RunStatus(status="running", step=30, total_steps=60, started_at=now)
    progress = views.progress(status, steps)
    assert progress.steps_per_s == pytest.approx(2.0)  # 20 intervals over 10 s
    assert progress.overall_steps_per_s == pytest.approx(29 / 19)  # 29 intervals over 19 s
    assert "2.00 steps/s recent (last 20 steps)" in progress.text
    assert "1.53 steps/s overall" in progress.text


def test_a_distributed_scenario_starts_two_processes_and_refuses_one(empty_env):
    at = open_page("pages/1_Launch.py")
    next(s for s in at.selectbox if s.label == "Scenario").set_value("straggler").run()
    processes = next(n for n in at.number_input if n.label == "Processes per node")
    assert processes.value == 2  # the scenario's default: it needs two ranks
    processes.set_value(1)
    next(b for b in at.button if b.label == "Start run").click().run()
    assert not at.exception
    assert any("straggler needs two or more processes" in e.value for e in at.error)
    assert list_runs(empty_env) == []


def test_the_alert_field_refuses_a_negative_threshold_and_starts_nothing(empty_env):
    at = open_page("pages/1_Launch.py")
    alert = next(n for n in at.number_input if n.label.startswith("Alert when the run passes"))
    assert alert.value == 0.0  # off unless asked for
    alert.set_value(-5.0)
    next(b for b in at.button if b.label == "Start run").click().run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any(e.startswith("runtime.alert_after_s: -5") for e in errors), errors
    assert list_runs(empty_env) == []


@pytest.mark.slow
def test_an_alert_set_on_the_form_reaches_the_webhook(empty_env, monkeypatch):
    # a real run launched from the form, with a threshold it passes at once, posting to a
    # webhook on 127.0.0.1: the form's value is what the trainer alerts on
    with Webhook("ok") as hook:
        monkeypatch.setenv(ALERT_WEBHOOK_ENV, hook.url)
        at = open_page("pages/1_Launch.py")
        for label, value in (
            ("Fine-tuning steps", 2),
            ("Masked-LM steps first (0 = none)", 0),
            ("Alert when the run passes (seconds, 0 = off)", 0.01),
        ):
            next(n for n in at.number_input if n.label == label).set_value(value)
        next(b for b in at.button if b.label == "Start run").click().run()
        assert not at.exception, at.exception
        assert not at.error, [e.value for e in at.error]
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            runs = list_runs(empty_env)
            if runs and runs[0].status.status in {"completed", "failed", "cancelled"}:
                break
            time.sleep(0.5)
        assert runs and runs[0].status.status == "completed", runs
    run = RunFolder(runs[0].path)
    assert run.manifest().config["runtime"]["alert_after_s"] == 0.01
    state = run.alert()
    assert state.state == "sent" and state.http_status == 200
    assert len(hook.bodies) == 1 and runs[0].run_id in hook.bodies[0]["json"]["text"]


@pytest.mark.slow
def test_the_form_under_a_followed_run_holds_what_that_run_ran(monkeypatch, trained_runs):
    # after Re-run with fix the page follows the re-run: the form below must hold its
    # scenario and its settings (the fix included), not the healthy defaults, so that
    # Start repeats it
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(trained_runs.runs_dir))
    at = open_page("pages/1_Launch.py", {"run": trained_runs.fixed.name})
    assert not at.exception
    assert next(s for s in at.selectbox if s.label == "Scenario").value == "slow-loader"
    number = {n.label: n.value for n in at.number_input}
    assert number["DataLoader workers"] == 2  # the fix it ran with
    assert number["Simulated storage latency per sample (ms)"] == 20  # conftest's QUICK_RUN
    assert number["Fine-tuning steps"] == 6
    # choosing another scenario still puts that scenario's preset in the form
    next(s for s in at.selectbox if s.label == "Scenario").set_value("healthy").run()
    assert {n.label: n.value for n in at.number_input}["DataLoader workers"] != 2
