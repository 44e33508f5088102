"""python -m diagnostics: analyze's output and exit codes, and every bad input as one line."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnostics.__main__ import main
from tests.diagnostics.trace.helpers import SHARED_TRACES, kernel, trace_doc, write_json

REPO_ROOT = Path(__file__).resolve().parents[2]
SMALL_REAL = SHARED_TRACES / "hta_a100_alexnet_with_syncs.json.gz"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diagnostics", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_analyze_prints_the_result_json_in_a_real_process():
    done = run_cli("analyze", str(SMALL_REAL))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] == "pipeline-doctor/analysis/v1"
    assert doc["source"]["kind"] == "trace"
    assert doc["summary"]["device"] == "cuda"
    assert isinstance(doc["findings"], list)


def test_text_format_is_a_compact_summary(capsys):
    assert main(["analyze", str(SMALL_REAL), "--format", "text"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith(f"trace {SMALL_REAL} · cuda · NVIDIA A100")
    assert any(line.startswith("step breakdown: kernel ") for line in lines)
    # both GPU figures, each with the label that names it
    (gpu,) = [line for line in lines if line.startswith("GPU utilisation (kernel time")]
    assert "GPU busy (kernels, copies, memsets) " in gpu
    assert len(lines) < 40


def test_output_file(tmp_path, capsys):
    out = tmp_path / "result.json"
    assert main(["analyze", str(SMALL_REAL), "-o", str(out)]) == 0
    assert capsys.readouterr().out == ""
    assert json.loads(out.read_text())["summary"]["steps"] >= 1


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, what the one line must say)."""
    cases: dict[str, tuple[Path, str]] = {}

    def add(name: str, data: bytes, expect: str, suffix: str = ".json") -> None:
        path = tmp_path / f"{name}{suffix}"
        path.write_bytes(data)
        cases[name] = (path, expect)

    add("empty", b"", "is empty")
    add("not_json", b"hello, world", "is not a Chrome trace")
    add("binary", bytes(range(256)) * 4, "is not JSON (it looks like binary data)")
    whole = gzip.compress(json.dumps(trace_doc([kernel(1.0, 2.0)] * 500)).encode())
    add("truncated_gz", whole[: len(whole) // 2], "truncated gzip", ".json.gz")
    add("no_trace_events", b'{"schemaVersion": 1}', "has no traceEvents")
    add("truncated_json", b'{"traceEvents": [{"ph": "X", "ts": 1', "ends early")
    add(
        "wrong_types",
        json.dumps(trace_doc([{"ph": "X", "name": 5, "ts": "a", "dur": None}])).encode(),
        "no usable events",
    )
    add(
        "negative_durations",
        json.dumps(trace_doc([{**kernel(1.0, 1.0), "dur": -5}])).encode(),
        "1 negative dur",
    )
    cases["missing"] = (tmp_path / "missing.json", "no such file")
    return cases


BAD = [
    "empty",
    "not_json",
    "binary",
    "truncated_gz",
    "no_trace_events",
    "truncated_json",
    "wrong_types",
    "negative_durations",
    "missing",
]


@pytest.mark.parametrize("name", BAD)
def test_bad_input_is_one_line_naming_the_file_and_exit_2(tmp_path, capsys, name):
    path, expect = _bad_inputs(tmp_path)[name]
    assert main(["analyze", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"error: {path}: ")
    assert expect in captured.err
    assert captured.err.count("\n") == 1


def test_gzip_bomb_over_the_cli_cap_is_refused(tmp_path, capsys):
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b" " * (3 << 20), 9))  # 3 MiB of spaces, ~3 kB packed
    assert main(["analyze", str(bomb), "--max-decompressed-mb", "1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {bomb}: decompresses to more than 1.0 MiB of JSON (all files of the input "
        "together), the limit (raise --max-decompressed-mb or "
        "PIPELINE_DOCTOR_MAX_DECOMPRESSED_MB to read it)\n"
    )


def test_bad_input_in_a_real_process_has_no_traceback(tmp_path):
    path = tmp_path / "noise.json.gz"
    path.write_bytes(os.urandom(2048))
    done = run_cli("analyze", str(path), "--format", "text")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"error: {path}: ")


def test_some_bad_events_still_give_a_result_with_a_warning(tmp_path, capsys):
    events = [kernel(1.0, 2.0), {**kernel(3.0, 1.0), "dur": -1}, kernel(5.0, 2.0)]
    path = write_json(tmp_path / "t.json", trace_doc(events))
    assert main(["analyze", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any("skipped 1 of 3 events as malformed (1 negative dur)" in w for w in doc["warnings"])


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["analyze"], "error: the following arguments are required: path"),
        (["analyze", "x.json", "--format", "xml"], "error: argument --format: invalid choice"),
        (["analyze", "x.json", "--max-decompressed-mb", "0"], "must be positive"),
        (["frobnicate"], "error: unknown command 'frobnicate'"),
        ([], "usage: python -m diagnostics"),
    ],
)
def test_usage_errors_exit_2(capsys, argv, expect):
    assert main(argv) == 2
    assert expect in capsys.readouterr().err


def test_bad_thresholds_file_is_one_line_exit_2(tmp_path, capsys):
    thresholds = tmp_path / "t.toml"
    thresholds.write_text("[thresholds]\nno_such_threshold = 1\n")
    assert main(["analyze", str(SMALL_REAL), "--thresholds", str(thresholds)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(thresholds) in err and err.count("\n") == 1


def test_rules_subcommand_prints_the_rule_reference(capsys):
    assert main(["rules"]) == 0
    assert "too-few-workers" in capsys.readouterr().out


def test_report_subcommand_is_dispatched(tmp_path):
    out = tmp_path / "report.md"
    assert main(["report", str(SMALL_REAL), "--format", "md", "-o", str(out)]) == 0
    assert out.read_text().strip()


def test_peak_memory_says_which_memory_and_over_which_window(tiny_run, capsys):
    # a CPU run with a profiler window: its host RSS over all steps (what its Memory chart
    # draws), not the profiler's host allocations in the few steps it recorded
    with (tiny_run / "steps.jsonl").open() as handle:
        rss = max(json.loads(line)["rss_bytes"] for line in handle if line.strip())
    assert main(["analyze", str(tiny_run), "--format", "text"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (line,) = [line for line in lines if line.startswith("peak memory")]
    assert line == f"peak memory, host RSS (all steps): {rss / 2**20:,.2f} MiB"
    assert main(["analyze", str(tiny_run)]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert (summary["peak_memory_bytes"], summary["peak_memory_kind"]) == (rss, "host RSS")
    assert summary["peak_memory_window"] == "all steps"


def test_a_findings_saving_reads_as_less_time_and_the_speed_up(capsys):
    # 57 % less time is 1 / 0.43 = 2.33x faster, not "57 % faster"
    assert main(["analyze", str(SMALL_REAL)]) == 0
    doc = json.loads(capsys.readouterr().out)
    finding = {
        "severity": "high", "rule": "too-few-workers", "title": "t",
        "estimated_saving_pct": 57.0, "fix": {"config_patch": None},
    }  # fmt: skip
    from diagnostics.__main__ import render_text

    lines = render_text({**doc, "findings": [finding]}).splitlines()
    assert (
        "  [high] too-few-workers: t · expected: about 57 % less step time (2.33× faster)" in lines
    )
