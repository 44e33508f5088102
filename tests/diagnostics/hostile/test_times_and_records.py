"""Hostile and odd input, round two (issue 23): numbers validated where they enter.

Each case is built at test time from a real shared trace or H200 run folder (one field
changed, written to tmp_path). Before, each gave exit 0 and a figure that moved with no
warning (the issue's probe); now each is excluded or left out with a warning naming the
count and the effect, and the figures are the ones the untouched input supports.
"""

from __future__ import annotations

import copy
import gzip
import json
import shutil
from functools import cache
from pathlib import Path

import pytest

from diagnostics.analyze import analyze
from tests.diagnostics.trace.helpers import SHARED_TRACES

RESNET = SHARED_TRACES / "kineto_resnet50_num_workers_0.pt.trace.json.gz"
SLOW_LOADER_RUN = SHARED_TRACES.parent / "gpu-runs" / "h200-default" / "gpu-slow-loader"


@cache
def _doc() -> dict:
    with gzip.open(RESNET, "rt") as handle:
        return json.load(handle)


@cache
def _original():
    return analyze(RESNET)


def _write(tmp_path: Path, name: str, doc: dict) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def _kernels(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if str(e.get("cat", "")).lower() == "kernel"]


def test_every_kernel_at_zero_duration_leaves_the_gpu_figures_unknown(tmp_path):
    doc = copy.deepcopy(_doc())
    kernels = _kernels(doc)
    for kernel in kernels:
        kernel["dur"] = 0
    result = analyze(_write(tmp_path, "zero_dur", doc))
    # before: busy 603,558 -> 12,026 µs, with new low-utilisation and launch-bound findings
    assert any(
        f"{len(kernels):,} of {len(kernels):,} kernels have zero duration" in w
        for w in result.warnings
    )
    assert result.summary["device"] == "cuda"
    assert result.summary["gpu_busy_us"] is None and result.summary["gpu_utilization_pct"] is None
    fired = {f.rule for f in result.findings}
    assert fired.isdisjoint({"low-gpu-utilization", "launch-bound-kernels", "tensor-cores-unused"})


def test_one_kernel_far_in_the_future_is_left_out_and_the_steps_stand(tmp_path):
    doc = copy.deepcopy(_doc())
    _kernels(doc)[100]["ts"] = 1e30
    result = analyze(_write(tmp_path, "far_ts", doc))
    # before: a median step of 0.0 ms, with a warning about µs rounding only
    assert any(
        "1 event whose timestamp lies far outside the recording" in w for w in result.warnings
    )
    original = _original().summary
    assert result.summary["steps"] == original["steps"]
    p50, expected = result.summary["step_time_ms"]["p50"], original["step_time_ms"]["p50"]
    # one kernel fewer: the steps end where their other GPU work ends (within that kernel)
    assert abs(p50 - expected) <= _kernels(_doc())[100]["dur"] / 1000.0 + 1e-9


def test_a_kernel_longer_than_the_recording_is_left_out(tmp_path):
    doc = copy.deepcopy(_doc())
    victim = _kernels(doc)[100]
    original_dur = victim["dur"]
    victim["dur"] = 1e18
    result = analyze(_write(tmp_path, "long_dur", doc))
    assert any("1 event that last longer than the whole recording" in w for w in result.warnings)
    busy, expected = result.summary["gpu_busy_us"], _original().summary["gpu_busy_us"]
    # the union loses at most that kernel's own time
    assert expected - original_dur - 1e-6 <= busy <= expected + 1e-6


def test_a_correlation_id_shared_by_many_runtime_calls_is_said(tmp_path):
    doc = copy.deepcopy(_doc())
    calls = [
        e
        for e in doc["traceEvents"]
        if str(e.get("cat", "")).lower() in ("runtime", "cuda_runtime")
        and "correlation" in e.get("args", {})
    ]
    shared = calls[0]["args"]["correlation"]
    for call in calls[1:1001]:
        call["args"]["correlation"] = shared
    result = analyze(_write(tmp_path, "shared_id", doc))
    # before: -8.8 % busy, and a warning only above a 25 % unlinked share
    parts = result.summary["trace_parts"]
    assert parts["shared_id_calls"] == 1001
    assert any("1001 runtime calls share 1 correlation id(s)" in w for w in result.warnings)
    # the other calls' own GPU events now have no call: said whatever their share
    assert parts["gpu_unlinked_in_recording"] > 0
    assert any("although the recording was running" in w for w in result.warnings)


def test_a_run_record_of_the_wrong_type_is_left_out_with_a_warning(tmp_path):
    corrupt, reference = tmp_path / "corrupt", tmp_path / "reference"
    for folder in (corrupt, reference):
        shutil.copytree(SLOW_LOADER_RUN, folder)
        (folder / "steps.parquet").unlink()  # a live run has only its line records
    lines = (SLOW_LOADER_RUN / "steps.jsonl").read_text().splitlines()
    record = json.loads(lines[10])
    record["step"] = "eleven"
    (corrupt / "steps.jsonl").write_text(
        "\n".join([*lines[:10], json.dumps(record), *lines[11:]]) + "\n"
    )
    (reference / "steps.jsonl").write_text("\n".join([*lines[:10], *lines[11:]]) + "\n")
    result, expected = analyze(corrupt), analyze(reference)
    # before: the record was kept with a null step, moving the statistics without a word
    assert result.summary["step_time_ms"] == expected.summary["step_time_ms"]
    assert result.summary["steps"] == expected.summary["steps"] == len(lines) - 1
    assert any("left out 1 of" in w and "step (1)" in w for w in result.warnings)
    assert not any("left out" in w for w in expected.warnings)


@pytest.mark.parametrize("value", ["fast", True, [1.0]])
def test_a_non_numeric_step_time_is_not_read_as_a_number(tmp_path, value):
    folder = tmp_path / "run"
    shutil.copytree(SLOW_LOADER_RUN, folder)
    (folder / "steps.parquet").unlink()
    lines = (folder / "steps.jsonl").read_text().splitlines()
    record = json.loads(lines[5])
    record["step_time_ms"] = value
    lines[5] = json.dumps(record)
    (folder / "steps.jsonl").write_text("\n".join(lines) + "\n")
    result = analyze(folder)
    assert result.summary["steps"] == len(lines) - 1
    assert any("step_time_ms (1)" in w for w in result.warnings)


def test_a_trace_whose_every_event_is_out_of_bounds_is_one_line(tmp_path):
    # found by the property test: every event beyond the physical bound left nothing to say
    # "the others lie within" about (a TypeError before)
    from diagnostics.errors import InputError
    from diagnostics.trace.loader import load_trace_file

    path = _write(
        tmp_path,
        "all_far",
        {
            "traceEvents": [
                {"ph": "X", "name": "k", "ts": 1e18, "dur": 1},
                {"ph": "X", "name": "k", "ts": 2e18, "dur": 1},
            ]
        },
    )
    with pytest.raises(InputError) as caught:
        load_trace_file(path)
    message = str(caught.value)
    assert "\n" not in message and "far outside the recording" in message
