"""Launch bounds: what a run started from the app may cost, set by the environment and
enforced in trainer.launch (the form's check and start_run itself)."""

from __future__ import annotations

import time

import pytest

from diagnostics.runs import RunFolder, list_runs
from trainer import launch
from trainer.config import SCENARIOS, ConfigError, build_config
from trainer.launch_bounds import BOUND_DEFAULTS, LaunchBounds

SMALL = {
    "data.rows": 300,
    "data.num_workers": 0,
    "train.batch_size": 16,
    "train.pretrain_steps": 0,
    "data.sample_latency_ms": 5.0,
}


def test_defaults_cover_every_scenario_preset():
    bounds = LaunchBounds.from_environ({})
    for scenario in SCENARIOS:
        assert bounds.check(build_config(scenario)) == {}, scenario
    assert bounds.max_runtime_s == 3_600


@pytest.mark.parametrize(
    ("key", "env", "value"),
    [
        ("train.steps", "PIPELINE_DOCTOR_MAX_STEPS", 101),
        ("train.pretrain_steps", "PIPELINE_DOCTOR_MAX_PRETRAIN_STEPS", 101),
        ("train.batch_size", "PIPELINE_DOCTOR_MAX_BATCH_SIZE", 101),
        ("data.num_workers", "PIPELINE_DOCTOR_MAX_WORKERS", 9),
        ("data.rows", "PIPELINE_DOCTOR_MAX_ROWS", 1_001),
    ],
)
def test_each_bound_is_set_by_its_variable(key, env, value):
    assert BOUND_DEFAULTS[key][0] == env
    bounds = LaunchBounds.from_environ({env: str(value - 1)})
    at_bound = build_config("healthy", {key: value - 1})
    above = build_config("healthy", {key: value})
    assert bounds.check(at_bound) == {}
    assert bounds.check(above) == {
        key: f"{key}: {value:,} is above this server's launch limit; "
        f"allowed: <= {value - 1:,} ({env})"
    }


@pytest.mark.parametrize("raw", ["0", "-3", "lots", "1.5"])
def test_a_bad_bound_names_its_variable(raw):
    with pytest.raises(ConfigError, match=f"^PIPELINE_DOCTOR_MAX_WORKERS: '{raw}' is not"):
        LaunchBounds.from_environ({"PIPELINE_DOCTOR_MAX_WORKERS": raw})


def test_runtime_is_capped_never_raised():
    bounds = LaunchBounds.from_environ({"PIPELINE_DOCTOR_MAX_RUNTIME_S": "120"})
    assert bounds.runtime_s(None) == 120.0  # no budget asked for: the bound
    assert bounds.runtime_s(30.0) == 30.0
    assert bounds.runtime_s(10_000.0) == 120.0


def test_the_form_check_reports_the_bound_under_the_field(monkeypatch):
    monkeypatch.setenv("PIPELINE_DOCTOR_MAX_STEPS", "100")
    monkeypatch.setenv("PIPELINE_DOCTOR_MAX_WORKERS", "4")
    errors = launch.validate_overrides({"train.steps": 101, "data.num_workers": 64})
    assert set(errors) == {"train.steps", "data.num_workers"}
    assert "PIPELINE_DOCTOR_MAX_WORKERS" in errors["data.num_workers"]
    assert launch.validate_overrides({"train.steps": 100, "data.num_workers": 4}) == {}


def test_start_run_refuses_above_a_bound_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_DOCTOR_MAX_STEPS", "100")
    with pytest.raises(ValueError, match="train.steps: 101 is above this server's launch limit"):
        launch.start_run(scenario="healthy", overrides=SMALL, runs_dir=tmp_path, steps=101)
    # a re-run's patch is bounded too
    monkeypatch.setenv("PIPELINE_DOCTOR_MAX_WORKERS", "2")
    with pytest.raises(ValueError, match="data.num_workers: 8 is above"):
        launch.start_run(
            scenario="healthy",
            overrides=SMALL,
            runs_dir=tmp_path,
            applied_patch={"data.num_workers": 8},
        )
    assert list_runs(tmp_path) == []
    assert not (tmp_path / ".launch").exists()  # no process was started


@pytest.mark.slow
def test_a_launched_run_carries_the_runtime_bound(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_DOCTOR_MAX_RUNTIME_S", "120")
    started = launch.start_run(
        scenario="healthy",
        overrides={**SMALL, "train.max_runtime_s": 9_999},
        runs_dir=tmp_path,
        steps=400,
        device="cpu",
        instruments=False,
    )
    run = RunFolder(started.run_dir)
    assert run.manifest().config["train"]["max_runtime_s"] == 120.0
    launch.cancel_run(started.run_dir)
    deadline = time.monotonic() + 120
    while not run.status().is_final:
        assert time.monotonic() < deadline, "the run did not stop"
        time.sleep(0.2)


def test_processes_per_node_are_bounded_before_anything_starts(tmp_path, monkeypatch):
    assert LaunchBounds.from_environ({}).check_processes(8) == {}
    monkeypatch.setenv("PIPELINE_DOCTOR_MAX_PROCESSES", "2")
    assert LaunchBounds.from_environ().check_processes(2) == {}
    with pytest.raises(
        ValueError,
        match=r"^processes per node: 3 is above this server's launch limit; "
        r"allowed: <= 2 \(PIPELINE_DOCTOR_MAX_PROCESSES\)$",
    ):
        launch.start_run(
            scenario="healthy", overrides=SMALL, runs_dir=tmp_path, device="cpu", nproc_per_node=3
        )
    assert list(tmp_path.iterdir()) == []
