"""``pipeline-doctor gate`` on real H200 run folders of this project's trainer
(../shared/gpu-runs/h200-default, PROVENANCE.md): slow-loader and its re-run with the
too-few-workers fix ``{"data.num_workers": 8}``. The expected figures come from the runs'
steps.jsonl read with json (steady steps: each phase less its first step, as
diagnostics.metrics.steady_steps documents), not from the gate."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from diagnostics.__main__ import main as diagnostics_main
from diagnostics.analyze import analyze
from probe.cli import main as pipeline_doctor_main

RUNS = Path(__file__).resolve().parents[3].parent / "shared" / "gpu-runs" / "h200-default"
SLOW, FIXED = RUNS / "gpu-slow-loader", RUNS / "gpu-slow-loader-fixed"


def test_the_shared_runs_are_there():
    # a missing ../shared/gpu-runs fails here (and in every test below) instead of skipping
    sized = RUNS.parent / "h200-sized"
    for run in (SLOW, FIXED, sized / "m768l6b256", sized / "m768l6b256-fp32"):
        assert (run / "steps.jsonl").is_file(), f"{run}: a shared H200 run (PROVENANCE.md)"


def _steady_step_times(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    by_phase: dict[str, list[float]] = {}
    for row in sorted(rows, key=lambda r: r["step"]):
        by_phase.setdefault(row["phase"], []).append(row["step_time_ms"])
    return [t for times in by_phase.values() for t in (times[1:] if len(times) > 2 else times)]


@pytest.fixture(scope="module")
def improvement(tmp_path_factory):
    out = tmp_path_factory.mktemp("gate")
    code = pipeline_doctor_main(
        ["gate", str(SLOW), str(FIXED), "--json", str(out / "gate.json"),
         "--markdown", str(out / "gate.md"), "--save-baseline", str(out / "fixed.json")]
    )  # fmt: skip
    return code, json.loads((out / "gate.json").read_text()), out


def _measure(doc, key):
    return next(m for m in doc["measures"] if m["key"] == key)


def test_slow_loader_against_its_fix_is_an_improvement(improvement):
    code, doc, _ = improvement
    slow, fixed = _steady_step_times(SLOW), _steady_step_times(FIXED)
    assert (len(slow), len(fixed)) == (36, 36)
    # every fixed step is faster than every slow one: U = 0, exact p = 2 / C(72, 36)
    assert max(fixed) < min(slow)
    step = _measure(doc, "step_time_ms")
    assert step["verdict"] == "improvement"
    assert step["ratio"] == pytest.approx(statistics.median(fixed) / statistics.median(slow))
    assert step["ratio"] == pytest.approx(14.45 / 91.10, abs=1e-3)  # PROVENANCE: 91.3 -> 14.6
    assert step["p_value"] == pytest.approx(2 / math.comb(72, 36))
    assert step["ci_low"] <= step["ratio"] <= step["ci_high"] < 1.0
    assert _measure(doc, "throughput")["verdict"] == "improvement"
    # CUDA peak memory is the same 108,463,616 bytes in both runs' steps.jsonl
    assert _measure(doc, "peak_memory_bytes")["verdict"] == "no change"
    # MFU from the config: the same model and batch on both sides, so its ratio follows the
    # step times (per step FLOPs / step time; the median of per-step values, pretrain and
    # finetune steps mixed, is not exactly 1 / the step-time ratio)
    mfu = _measure(doc, "mfu_pct")
    assert mfu["verdict"] == "improvement"
    assert mfu["ratio"] == pytest.approx(
        analyze(FIXED).metrics.mfu_pct / analyze(SLOW).metrics.mfu_pct
    )
    assert 5.0 < mfu["ratio"] < 8.0  # the step time fell 6.3x
    # the default model's counted operators hold under half the GPU time (optimizer,
    # LayerNorm, dropout kernels have no FLOP formula): unknown, not a floor read as a figure
    assert _measure(doc, "counted_flops_utilization_pct")["verdict"] == "inconclusive"
    assert "too-few-workers" in [f["rule"] for f in doc["findings_lost"]]
    assert (code, doc["failed"]) == (0, False)


def test_the_reverse_is_a_regression_and_exits_1(improvement, capsys):
    code = diagnostics_main(["gate", str(FIXED), str(SLOW), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["failed"]
    step = _measure(doc, "step_time_ms")
    assert step["verdict"] == "regression"
    assert step["ratio"] == pytest.approx(1 / _measure(improvement[1], "step_time_ms")["ratio"])
    assert "too-few-workers" in [f["rule"] for f in doc["findings_gained"]]


def test_a_saved_baseline_gates_like_the_run_it_was_saved_from(improvement, capsys):
    _, _, out = improvement
    saved = json.loads((out / "fixed.json").read_text())
    assert saved["schema"] == "pipeline-doctor/gate-baseline/v1"
    assert saved["step_times_ms"] == pytest.approx(_steady_step_times(FIXED))
    assert (out / "fixed.json").stat().st_size < 10_000  # measures, not the run
    code = diagnostics_main(["gate", str(out / "fixed.json"), str(SLOW), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert _measure(doc, "step_time_ms")["verdict"] == "regression"


def test_the_markdown_summary_is_a_table_with_each_verdict(improvement):
    text = (improvement[2] / "gate.md").read_text()
    assert text.startswith("## Pipeline Doctor gate: ✅ passed")
    assert "| median step time | 91.1 ms | 14.4 ms | 0.159 |" in text
    assert "✅ improvement" in text and "`too-few-workers`" in text


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["/nonexistent/run", str(SLOW)], "/nonexistent/run: "),
        ([str(SLOW)], "--save-baseline"),
        ([str(SLOW), str(FIXED), "--max-regression", "lots"], "--max-regression"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle, capsys):
    assert diagnostics_main(["gate", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_report_with_a_baseline_writes_the_report_and_gates_it(improvement, tmp_path, capsys):
    saved = improvement[2] / "fixed.json"
    out = tmp_path / "report.md"
    code = diagnostics_main(
        ["report", str(SLOW), "--format", "md", "-o", str(out), "--baseline", str(saved)]
    )
    err = capsys.readouterr().err
    assert code == 1 and out.read_text().strip()
    assert "gate failed: regression beyond 5 %: median step time +530.6 %" in err


def test_an_output_that_is_not_a_regular_file_is_refused_before_any_analysis(tmp_path, capsys):
    folder = tmp_path / "folder"
    folder.mkdir()
    code = diagnostics_main(["gate", str(SLOW), str(FIXED), "--markdown", str(folder)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {folder}: is a ") and err.count("\n") == 1
    assert folder.is_dir() and list(folder.iterdir()) == []


def test_bf16_against_fp32_utilisations_are_not_compared(capsys):
    # h200-sized: the fp32 run is 5.6x slower yet a larger share of its (fp32) peak
    sized = RUNS.parent / "h200-sized"
    code = diagnostics_main(
        ["gate", str(sized / "m768l6b256"), str(sized / "m768l6b256-fp32"), "--format", "json"]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and _measure(doc, "step_time_ms")["verdict"] == "regression"
    for key in ("mfu_pct", "counted_flops_utilization_pct"):
        measure = _measure(doc, key)
        assert measure["verdict"] == "inconclusive", measure
        assert "bf16 989.5 TFLOP/s against one of H200 SXM dense fp32 67" in measure["reason"]
        assert measure["candidate"] > measure["baseline"]  # 65.3 against 24.9: not better
