"""Three corruptions of a real trace that used to give a confident wrong answer (exit 0,
no warning), each now giving the original trace's answer plus a warning:

* every ``ProfilerStep#N`` written twice: was 12 steps at half the time and too-few-workers
  downgraded from high to medium;
* each step's range stretched to the end of the next one: was p95 307.9 ms instead of
  186.5 ms;
* every timestamp moved past 2^53 µs (integers): was a GPU busy time and breakdown off by
  the float64 rounding of 16 µs.

The original's figures are torch-tb-profiler's own (tests/diagnostics/facts/test_real_traces.py
checks them against its golden file), so "the same as the original" is the right answer.
"""

from __future__ import annotations

import copy
import gzip
import json
from functools import cache
from pathlib import Path

import polars as pl
import pytest

from diagnostics.analyze import analyze, analyze_files
from diagnostics.facts.linking import build_index
from diagnostics.facts.steps import find_steps
from diagnostics.trace.loader import load_trace_file
from tests.diagnostics.facts.trace_fixture import events_of, step
from tests.diagnostics.trace.helpers import SHARED_TRACES

RESNET = SHARED_TRACES / "kineto_resnet50_num_workers_0.pt.trace.json.gz"
GPU_RUNS = SHARED_TRACES.parent / "gpu-runs"
BEYOND_EXACT = 2**56 + 12345  # float64 spacing there is 16 µs


@cache
def resnet_doc() -> dict:
    with gzip.open(RESNET, "rt") as handle:
        return json.load(handle)


def write(path: Path, doc: dict) -> Path:
    path.write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    return path


def is_step(event: dict) -> bool:
    return str(event.get("name", "")).startswith("ProfilerStep#")


def answer(result) -> dict:
    """What a user reads off the analysis."""
    summary = result.summary
    return {
        "steps": summary["steps"],
        "step_time_ms": summary["step_time_ms"],
        "breakdown_pct": summary["breakdown_pct"],
        "gpu_busy_us": summary["gpu_busy_us"],
        "gpu_utilization_pct": summary["gpu_utilization_pct"],
        "findings": [(f.rule, str(f.severity)) for f in result.findings],
    }


@cache
def original():
    return analyze(RESNET)


def test_the_original_answer_has_no_integrity_warning():
    result = original()
    assert result.summary["steps"] == 6
    assert not [w for w in result.warnings if "ProfilerStep" in w or "2^53" in w]


def test_every_step_written_twice_counts_each_step_once_with_a_warning(tmp_path):
    doc = copy.deepcopy(resnet_doc())
    doc["traceEvents"] += [copy.deepcopy(e) for e in doc["traceEvents"] if is_step(e)]
    result = analyze(write(tmp_path / "dup.json.gz", doc))
    assert answer(result) == answer(original())
    assert (
        "removed 6 duplicate ProfilerStep range(s): #5, #6, #7, #8, #9, #10 appear more than "
        "once on the same thread with the same range; each step is counted once"
    ) in result.warnings


def test_overlapping_steps_are_cut_at_the_next_start_and_the_warning_says_which(tmp_path):
    doc = copy.deepcopy(resnet_doc())
    steps = [e for e in doc["traceEvents"] if is_step(e)]
    for this, following in zip(steps, steps[1:], strict=False):
        this["dur"] = following["ts"] + following["dur"] - this["ts"]
    result = analyze(write(tmp_path / "overlap.json.gz", doc))
    assert answer(result) == answer(original())
    [warning] = [w for w in result.warnings if "overlap" in w]
    # step #7 (176,918 µs) was stretched over #8 (181,259 µs): 181.3 ms into #8
    assert warning.startswith(
        "5 ProfilerStep range(s) overlap the next step (#5, #6, #7, #8, #9; "
        "the most: #7 by 181.3 ms)"
    )
    assert warning.endswith("Steps used: #5, #6, #7, #8, #9, #10 (6)")


def test_integer_timestamps_beyond_2_to_the_53_keep_full_precision(tmp_path):
    doc = copy.deepcopy(resnet_doc())
    for event in doc["traceEvents"]:
        if isinstance(event.get("ts"), int):
            event["ts"] += BEYOND_EXACT
    path = write(tmp_path / "big-ts.json.gz", doc)
    result = analyze(path)
    assert answer(result) == answer(original())
    assert not [w for w in result.warnings if "2^53" in w]
    # the table holds exact offsets from a base (an integer ts of the file) taken out of
    # every ts: the same offsets as the unshifted trace's from that base, to the µs
    trace = load_trace_file(path)
    plain = load_trace_file(RESNET)
    base = trace.metadata.ts_base_us
    assert base is not None and base > 2**53
    assert trace.events["ts"].equals(plain.events["ts"] - float(base - BEYOND_EXACT))


def test_fractional_timestamps_beyond_2_to_the_53_give_a_warning(tmp_path):
    doc = copy.deepcopy(resnet_doc())
    for event in doc["traceEvents"]:
        if isinstance(event.get("ts"), int):
            event["ts"] = event["ts"] + BEYOND_EXACT + 0.5
    result = analyze(write(tmp_path / "big-float-ts.json.gz", doc))
    [warning] = [w for w in result.warnings if "2^53" in w]
    assert "timestamps are fractional numbers beyond 2^53 µs" in warning


def test_rank_files_with_huge_timestamps_stay_on_one_clock(tmp_path):
    # two files 1 s apart, both past 2^53: each gets its own base; loaded together they
    # share one and keep their 1,000,000 µs distance exactly
    def one(ts: int) -> dict:
        return {"traceEvents": [step(1, ts, 100), step(2, ts + 100, 100)]}

    a = write(tmp_path / "rank0.json.gz", one(BEYOND_EXACT))
    b = write(tmp_path / "rank1.json.gz", one(BEYOND_EXACT + 1_000_000))
    result = analyze_files([a, b])
    starts = [f.steps["start_us"][0] for f in result.rank_facts]
    assert starts == [0.0, 1_000_000.0]


@pytest.mark.parametrize("run", ["h200-default/gpu-healthy", "h200-default/gpu-leak"])
def test_gpu_side_profiler_steps_of_current_pytorch_are_not_duplicates(run):
    # current PyTorch writes each ProfilerStep#N twice: on the host (user_annotation) and
    # on the GPU timeline (gpu_user_annotation); only the host range is a step.
    # Named runs, one trace each: a missing ../shared fails here instead of leaving no case.
    (path,) = (GPU_RUNS / run / "trace").glob("*.pt.trace.json.gz")
    loaded = load_trace_file(path)
    names = loaded.events.filter(pl.col("name").str.starts_with("ProfilerStep#"))
    assert set(names["cat"]) == {"user_annotation", "gpu_user_annotation"}
    steps = find_steps(loaded.events, build_index(loaded.events))
    host = names.filter(pl.col("cat") == "user_annotation")
    assert steps.frame.height == host.height == 3
    assert not [w for w in steps.warnings if "duplicate" in w or "overlap" in w]


def test_same_step_number_with_a_different_range_is_not_a_duplicate():
    found = find_steps(events_of(step(1, 0, 100), step(1, 300, 100), step(2, 100, 100)))
    assert found.frame["step"].to_list() == [1, 2, 1]
    assert not [w for w in found.warnings if "duplicate" in w]


def test_near_identical_copies_are_duplicates():
    # 0.5 µs apart on a 100 µs step: within the 1 µs tolerance
    found = find_steps(events_of(step(1, 0, 100), step(1, 0.5, 100), step(2, 100, 100)))
    assert found.frame.select("step", "host_start_us", "host_end_us").rows() == [
        (1, 0.0, 100.0),
        (2, 100.0, 200.0),
    ]
    assert any("removed 1 duplicate" in w for w in found.warnings)
