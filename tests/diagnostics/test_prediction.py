"""A re-run checks its finding: the saving the finding predicted beside the one measured.

Real material: this project's trainer on an NVIDIA H200 (../shared/gpu-runs/h200-default),
the slow-loader run and the same run with its too-few-workers patch (data.num_workers = 8).
The shipped copies are not linked (the second was launched by hand), so the test links a
copy as Re-run with fix would (``parent_run_id``); unlinked, the pair predicts nothing.
"""

from __future__ import annotations

import json
import shutil

import pytest

from diagnostics.analyze import analyze
from diagnostics.compare import compare
from diagnostics.report import build_comparison_report, render_html, render_markdown
from diagnostics.report.fmt import saving

SLOW, FIXED = "gpu-slow-loader", "gpu-slow-loader-fixed"


@pytest.mark.parametrize(
    ("pct", "text"),
    [
        (57.0, "57 % less step time (2.33× faster)"),  # 1 / 0.43
        (27.0, "27 % less step time (1.37× faster)"),  # 1 / 0.73
        (50.0, "50 % less step time (2.00× faster)"),
        (0.4, "under 1 % less step time"),
        (-25.0, "25 % more step time (0.80× as fast)"),  # 1 / 1.25
        (None, "—"),
    ],
)
def test_a_saving_reads_as_less_time_and_as_the_speed_up_it_is(pct, text):
    assert saving(pct) == text


@pytest.fixture(scope="module")
def pair(repo_root, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    for name in (SLOW, FIXED):
        shutil.copytree(
            repo_root.parent / "shared" / "gpu-runs" / "h200-default" / name, runs / name
        )
    return runs


def _link(runs, parent: str | None) -> None:
    manifest = json.loads((runs / FIXED / "run.json").read_text())
    manifest["parent_run_id"] = parent
    (runs / FIXED / "run.json").write_text(json.dumps(manifest))


def test_the_rerun_shows_the_findings_prediction_beside_the_measured_saving(pair):
    _link(pair, SLOW)
    before, after = analyze(pair / SLOW), analyze(pair / FIXED)
    (finding,) = [f for f in before.findings if f.rule == "too-few-workers"]
    assert finding.fix.config_patch == {"data.num_workers": 8}  # what the re-run applied
    comparison = compare(before, after)
    prediction = comparison.prediction
    assert prediction is not None and prediction.rule == "too-few-workers"
    assert prediction.predicted_saving_pct == finding.estimated_saving_pct
    median_a = before.metrics.median_step_time_ms
    median_b = after.metrics.median_step_time_ms
    measured = 100.0 * (1.0 - median_b / median_a)
    assert prediction.measured_saving_pct == pytest.approx(measured)
    assert prediction.measured_over_predicted == pytest.approx(
        measured / finding.estimated_saving_pct
    )
    line = (
        f"too-few-workers predicted {saving(finding.estimated_saving_pct)}; the re-run "
        f"measured {saving(measured)}, {measured / finding.estimated_saving_pct:.2f} of the "
        "prediction."
    )
    report = build_comparison_report(comparison)
    assert f"**Predicted and measured:** {line}" in render_markdown(report)
    assert line in render_html(report)
    recorded = json.loads(json.dumps(comparison.to_dict()))["prediction"]
    assert recorded["rule"] == "too-few-workers"
    assert recorded["measured_over_predicted"] == pytest.approx(prediction.measured_over_predicted)


def test_runs_that_are_not_a_rerun_predict_nothing(pair):
    _link(pair, None)
    comparison = compare(analyze(pair / SLOW), analyze(pair / FIXED))
    assert comparison.prediction is None
    assert "Predicted and measured" not in render_markdown(build_comparison_report(comparison))
