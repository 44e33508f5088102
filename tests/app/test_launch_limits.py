"""The Launch form shows this server's launch bounds under the field, and starts nothing."""

from __future__ import annotations

from diagnostics.runs import list_runs
from tests.app.test_pages import open_page


def test_launch_form_shows_the_bound_under_the_field(monkeypatch, tmp_path):
    runs_dir = tmp_path / "runs"
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(runs_dir))
    monkeypatch.setenv("PIPELINE_DOCTOR_MAX_STEPS", "100")
    monkeypatch.setenv("PIPELINE_DOCTOR_MAX_WORKERS", "4")
    at = open_page("pages/1_Launch.py")
    next(w for w in at.number_input if w.label == "Fine-tuning steps").set_value(101)
    next(w for w in at.number_input if w.label == "DataLoader workers").set_value(64)
    next(b for b in at.button if b.label == "Start run").click().run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert (
        "train.steps: 101 is above this server's launch limit; "
        "allowed: <= 100 (PIPELINE_DOCTOR_MAX_STEPS)" in errors
    ), errors
    assert any(e.startswith("data.num_workers: 64 is above") for e in errors), errors
    assert any("2 settings need fixing" in e for e in errors), errors
    assert list_runs(runs_dir) == []
