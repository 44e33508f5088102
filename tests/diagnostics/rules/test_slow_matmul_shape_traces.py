"""slow-matmul-shape on real traces, checked against each GEMM's call times read from the
trace with ``json`` alone: each operator's CUDA runtime launches (inside its host range, on
its thread) tied to their kernels by correlation id, the kernels' durations summed a call,
the median over calls (the oracle below, independent of diagnostics' linking)."""

from __future__ import annotations

import bisect
import gzip
import json
import re
import statistics
from collections import defaultdict
from dataclasses import replace
from functools import cache

import pytest

from diagnostics.analyze import analyze
from diagnostics.thresholds import Thresholds
from tests.diagnostics.trace.helpers import SHARED_TRACES

RULE = "slow-matmul-shape"
GPU_RUNS = SHARED_TRACES.parent / "gpu-runs"
A100_RANK3 = SHARED_TRACES / "hta_a100_rank3_of_8.json.gz"
A100_RANK0 = SHARED_TRACES / "hta_a100_rank0_of_16.json.gz"


@cache
def median_call_us(path) -> dict[tuple[str, int, int, int], float]:
    """(operator, M, N, K) -> median over its calls of its kernels' summed duration, us,
    for aten::mm ([[M, K], [K, N]]) and aten::addmm ([bias, [M, K], [K, N]])."""
    with gzip.open(path, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    kernel_us = {
        e["args"]["correlation"]: e["dur"]
        for e in events
        if e.get("cat") == "kernel" and "correlation" in e.get("args", {})
    }
    launches = defaultdict(list)
    for e in events:
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {}):
            launches[(e["pid"], e["tid"])].append((e["ts"], e["args"]["correlation"]))
    for found in launches.values():
        found.sort()
    calls = defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or e.get("name") not in ("aten::mm", "aten::addmm"):
            continue
        dims = e["args"]["Input Dims"]
        (m, k), (_, n) = dims[0:2] if e["name"] == "aten::mm" else dims[1:3]
        on_thread = launches[(e["pid"], e["tid"])]
        at = bisect.bisect_left(on_thread, (e["ts"], -1))
        total = 0.0
        while at < len(on_thread) and on_thread[at][0] <= e["ts"] + e["dur"]:
            total += kernel_us.get(on_thread[at][1], 0.0)
            at += 1
        calls[(e["name"], m, n, k)].append(total)
    return {key: statistics.median(times) for key, times in calls.items()}


def _key(operator_and_shape: str) -> tuple[str, int, int, int]:
    name, m, n, k = re.match(r"(\S+) M=(\d+) N=(\d+) K=(\d+)", operator_and_shape).groups()
    return name, int(m), int(n), int(k)


def _check_against_the_trace(path, shapes) -> None:
    oracle = median_call_us(path)
    for shape in shapes:
        own = _key(f"{shape['operator']} {shape['shape']}")
        peer = _key(shape["outpaced_by"])
        if own not in oracle or peer not in oracle:
            continue  # an operator the oracle does not read (bmm, linear)
        assert shape["median_call_us"] == pytest.approx(oracle[own], rel=0.05, abs=1.0), own
        assert shape["outpaced_by_median_call_us"] == pytest.approx(
            oracle[peer], rel=0.05, abs=1.0
        ), peer
        # the faster GEMM did at least the work: M·N·K, and each operand's elements
        (_, m, n, k), (_, pm, pn, pk) = own, peer
        assert pm * pn * pk >= m * n * k
        assert pm * pk + pk * pn + pm * pn >= m * k + k * n + m * n
        assert oracle[own] / oracle[peer] >= Thresholds().slow_matmul_min_slowdown_x * 0.95


def test_an_a100_job_is_told_which_gemm_shapes_ran_slower_than_larger_ones():
    result = analyze(A100_RANK3)
    (finding,) = [f for f in result.findings if f.rule == RULE]
    shapes = finding.evidence["shapes"]
    top = shapes[0]
    assert (top["operator"], top["shape"]) == ("aten::addmm", "M=1024 N=96 K=512 bias")
    assert top["outpaced_by"] == "aten::mm M=1024 N=480 K=128"
    checked = [s for s in shapes if s["operator"] in ("aten::mm", "aten::addmm")]
    assert len(checked) >= 8
    _check_against_the_trace(A100_RANK3, checked)
    # the saving: at least the listed shapes' own, against the profiled steps' time
    with gzip.open(A100_RANK3, "rt") as handle:
        steps_us = sum(
            e["dur"]
            for e in json.load(handle)["traceEvents"]
            if str(e.get("name", "")).startswith("ProfilerStep#")
        )
    listed_ms = sum(s["saving_ms"] for s in shapes)
    assert finding.estimated_saving_pct >= round(100 * listed_ms * 1e3 / steps_us, 1) - 0.05
    assert finding.evidence["saving_share_of_gemm_pct"] >= 5.0
    # never more than the slow GEMMs' own time in the steps
    assert finding.estimated_saving_pct <= finding.evidence["slow_gemm_pct_of_step_time"]
    assert "preferred_blas_library" in finding.fix.code


def test_a_communication_bound_job_is_not_told_of_gemms_that_are_a_sliver_of_its_steps():
    """Rank 0 of 16: its weight-gradient GEMMs took 1.6x and 3.3x their equal-work twins
    (the trace says so: 147 against 92 us, 46 against 14), 20 % of GEMM time, but 0.04 %
    of its steps; without the step floor the rule names exactly those two."""
    oracle = median_call_us(A100_RANK0)
    assert oracle[("aten::mm", 64, 2798, 4096)] / oracle[("aten::addmm", 4096, 64, 2798)] > 1.5
    assert oracle[("aten::mm", 64, 100, 4096)] / oracle[("aten::addmm", 4096, 64, 100)] > 3.0
    assert RULE not in {f.rule for f in analyze(A100_RANK0).findings}
    floorless = replace(Thresholds(), slow_matmul_min_step_saving_pct=0.0)
    (finding,) = [f for f in analyze(A100_RANK0, thresholds=floorless).findings if f.rule == RULE]
    shapes = finding.evidence["shapes"]
    assert {(s["operator"], s["shape"]) for s in shapes} == {
        ("aten::mm", "M=64 N=2798 K=4096"),
        ("aten::mm", "M=64 N=100 K=4096"),
    }
    _check_against_the_trace(A100_RANK0, shapes)
    assert finding.estimated_saving_pct < 0.1


QUIET = [
    "tracelens_h100_qwen1.5-0.5b_infer_profmem.json.gz",
    "tracelens_mi300x_qwen1.5-0.5b_infer_profmem.json.gz",
    # the MoE router GEMM (888x128x2880) runs at a quarter of its peers' TFLOP/s, but a
    # GEMM of four times its work took no less time: a launch's fixed cost, not its shape
    "tracelens_b200_vllm_moe_mxfp4_rank0_of_8.json.gz",
    # its weight gradient took 1.43x its data gradient: under the 1.5x
    "kineto_resnet50_num_workers_0.pt.trace.json.gz",
]


@pytest.mark.parametrize("name", QUIET)
def test_quiet_where_every_gemm_is_as_fast_as_the_larger_ones(name):
    result = analyze(SHARED_TRACES / name)
    assert RULE not in {s.rule for s in result.skipped}  # judged, not skipped
    assert RULE not in {f.rule for f in result.findings}


def test_quiet_on_every_recorded_h200_run():
    runs = sorted(path.parent for path in GPU_RUNS.glob("*/*/run.json"))
    assert len(runs) >= 12
    for run in runs:
        result = analyze(run)
        assert RULE not in {s.rule for s in result.skipped}, run
        assert RULE not in {f.rule for f in result.findings}, run
