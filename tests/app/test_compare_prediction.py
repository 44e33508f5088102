"""Compare after a re-run: the finding's predicted saving beside the measured one, on the
page (AppTest), for the H200 slow-loader run and its re-run with the fix (real runs from
../shared/gpu-runs/h200-default, copied and linked as Re-run with fix links them)."""

from __future__ import annotations

import json
import shutil

import pytest

from app_ui.safe_text import shown
from diagnostics.analyze import analyze
from diagnostics.report.fmt import saving
from tests.app.test_pages import open_page

SLOW, FIXED = "gpu-slow-loader", "gpu-slow-loader-fixed"


@pytest.fixture
def linked_pair(repo_root, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    for name in (SLOW, FIXED):
        shutil.copytree(
            repo_root.parent / "shared" / "gpu-runs" / "h200-default" / name, runs / name
        )
    manifest = json.loads((runs / FIXED / "run.json").read_text())
    (runs / FIXED / "run.json").write_text(json.dumps({**manifest, "parent_run_id": SLOW}))
    for name in ("PIPELINE_DOCTOR_TOKEN", "PIPELINE_DOCTOR_ALLOW_ANONYMOUS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(runs))
    return runs


@pytest.mark.slow
def test_compare_sets_the_prediction_beside_the_measurement(linked_pair):
    (finding,) = [f for f in analyze(linked_pair / SLOW).findings if f.rule == "too-few-workers"]
    at = open_page("pages/5_Compare.py", {"a": SLOW, "b": FIXED})
    assert not at.exception, at.exception
    (info,) = [i.value for i in at.info if "predicted" in i.value]
    assert info.startswith(f"too-few-workers predicted {saving(finding.estimated_saving_pct)}")
    assert "; the re-run measured " in info and " of the prediction." in info


@pytest.mark.slow
def test_an_unknown_run_in_the_link_is_said_not_swapped_in_silently(linked_pair):
    at = open_page("pages/5_Compare.py", {"a": "no-such-run", "b": FIXED})
    assert not at.exception, at.exception
    (warning,) = [shown(w.value) for w in at.warning]  # as the reader sees it
    assert "No run 'no-such-run' in this runs folder: A shows another run." in warning


@pytest.mark.slow
def test_the_rules_page_keeps_each_rules_calibration_across_the_folders_re_runs(linked_pair):
    from diagnostics.compare import compare
    from diagnostics.runs import RunFolder, list_runs
    from diagnostics.views import findings_digest
    from diagnostics.views.calibration import calibrate

    # the first run not analysed yet: its re-run is said to be left out, not guessed
    before = calibrate(list_runs(linked_pair))
    assert before.rules == () and before.unanalysed_parents == 1
    at = open_page("pages/6_Rules.py")
    assert not at.exception, at.exception
    assert any("1 re-run(s) left out" in c.value for c in at.caption)

    slow, fixed = analyze(linked_pair / SLOW), analyze(linked_pair / FIXED)
    folder = RunFolder(linked_pair / SLOW)
    folder.write_findings_digest(findings_digest(slow.findings), folder.mtime_key())

    (rule,) = calibrate(list_runs(linked_pair)).rules
    (pair,) = rule.pairs
    # the same prediction and measurement Compare shows for this pair
    expected = compare(slow, fixed).prediction
    assert (rule.rule, pair.parent, pair.rerun) == ("too-few-workers", SLOW, FIXED)
    assert pair.prediction.predicted_saving_pct == expected.predicted_saving_pct
    assert pair.prediction.measured_saving_pct == pytest.approx(expected.measured_saving_pct)
    assert rule.median_ratio == pytest.approx(expected.measured_over_predicted)

    at = open_page("pages/6_Rules.py")
    assert not at.exception, at.exception
    table = next(
        df.value for df in at.dataframe if "measured ÷ predicted, median" in df.value.columns
    )
    row = table.iloc[0]
    assert row["rule"] == "too-few-workers" and row["re-runs with its fix"] == 1
    assert row["measured ÷ predicted, median"] == pytest.approx(
        round(expected.measured_over_predicted, 2)
    )
