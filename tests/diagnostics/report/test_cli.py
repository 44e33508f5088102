from __future__ import annotations

import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from diagnostics.report.cli import main

REPO = Path(__file__).resolve().parents[3]
SMALL_TRACE = REPO.parent / "shared" / "traces" / "hta_a100_alexnet_with_syncs.json.gz"
RANK_TRACE = REPO.parent / "shared" / "traces" / "hta_a100_rank3_of_8.json.gz"
ORDER = {"high": 0, "medium": 1, "low": 2}


def _report_json(path: Path, tmp_path: Path) -> dict:
    out = tmp_path / f"{path.name}.report.json"
    # without --fail-on the exit is 0 whatever was found
    assert main(["report", str(path), "--format", "json", "-o", str(out)]) == 0
    return json.loads(out.read_text())


# --fail-on level -> exit code, written down rather than worked out from the same report:
# alexnet_with_syncs' GPU is busy 0.5 % of its window (low-gpu-utilization, high) and it
# copies 233 MiB from pageable memory (missing-pin-memory, medium), so every level fails;
# rank3_of_8's worst is communication nothing overlaps, 18.9 % of step time (medium).
FAIL_ON_CODES = {
    SMALL_TRACE: {"high": 1, "medium": 1, "low": 1},
    RANK_TRACE: {"high": 0, "medium": 1, "low": 1},
}


@pytest.mark.parametrize("trace", [SMALL_TRACE, RANK_TRACE], ids=lambda p: p.name)
def test_fail_on_exit_codes_follow_the_worst_finding(trace, tmp_path, capsys):
    for level, expected in FAIL_ON_CODES[trace].items():
        code = main(
            [str(trace), "--format", "md", "-o", str(tmp_path / "r.md"), "--fail-on", level]
        )
        assert code == expected, level
    # Without --fail-on the report is written and the exit is 0 whatever was found.
    assert main([str(trace), "--format", "md", "-o", str(tmp_path / "r.md")]) == 0
    err = capsys.readouterr().err
    assert "written to" in err


def test_the_gate_sees_both_outcomes(tmp_path):
    # Guard for the test above: across the two traces some --fail-on level must pass and
    # some must fail, or that test never compared a real 0 with a real 1.
    codes = set()
    for trace in (SMALL_TRACE, RANK_TRACE):
        severities = [f["severity"] for f in _report_json(trace, tmp_path)["report"]["findings"]]
        for level in ("high", "medium", "low"):
            codes.add(1 if any(ORDER[s] <= ORDER[level] for s in severities) else 0)
    assert codes == {0, 1}


def test_html_report_written_and_parsable(tmp_path):
    out = tmp_path / "report.html"
    assert main([str(SMALL_TRACE), "--format", "html", "-o", str(out), "--price", "2.5"]) == 0
    document = out.read_text(encoding="utf-8")
    HTMLParser().feed(document)
    assert 'id="findings"' in document and "$2.50 per GPU-hour" in document


def test_comparison_from_the_cli(tmp_path):
    out = tmp_path / "compare.json"
    assert (
        main([str(SMALL_TRACE), "--compare", str(RANK_TRACE), "--format", "json", "-o", str(out)])
        == 0
    )
    document = json.loads(out.read_text())
    assert document["schema"] == "pipeline-doctor/comparison/v1"
    assert document["report"]["comparison"]["label_b"] == RANK_TRACE.name


@pytest.mark.parametrize(
    ("make_args", "names"),
    [
        (lambda d: [str(d / "missing.json.gz")], "missing.json.gz"),
        (lambda d: [str(_write(d / "bad.json", "{ not json"))], "bad.json"),
        (lambda d: [str(_write(d / "empty.json", ""))], "empty.json"),
        (lambda d: [str(SMALL_TRACE), "--format", "pdf"], "--format"),
        (lambda d: [str(SMALL_TRACE), "--price", "-1"], "usd_per_gpu_hour"),
        (lambda d: [str(SMALL_TRACE), "--fail-on", "critical"], "--fail-on"),
        (lambda d: [str(SMALL_TRACE), "--gpu", "TPU v9"], "gpu: unknown GPU price entry"),
        (lambda d: [str(SMALL_TRACE), "-o", str(d / "no" / "such" / "dir" / "r.html")], "r.html"),
    ],
    ids=["missing", "not-json", "empty", "format", "price", "fail-on", "gpu", "unwritable"],
)
def test_unusable_input_exits_2_with_one_line(make_args, names, tmp_path, capsys):
    assert main(make_args(tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and names in err
    assert "Traceback" not in err


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_module_entry_point_dispatches_to_report(tmp_path):
    out = tmp_path / "r.md"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "diagnostics",
            "report",
            str(SMALL_TRACE),
            "--format",
            "md",
            "-o",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    # Markdown escapes the underscores of the file name (they render as plain underscores).
    assert out.read_text().startswith(
        "# Pipeline Doctor report: trace hta\\_a100\\_alexnet\\_with\\_syncs"
    )
    bad = subprocess.run(
        [sys.executable, "-m", "diagnostics", "report", str(tmp_path / "nope.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "nope.json" in bad.stderr
