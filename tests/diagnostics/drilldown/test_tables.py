"""Overview, Operators, Kernels and Memory tables on real traces, against a json.load oracle."""

from __future__ import annotations

from collections import Counter, defaultdict

import polars as pl
import pytest

from diagnostics.drilldown import search
from diagnostics.drilldown.memory import allocator_curve, curve_peaks
from diagnostics.drilldown.operators import TENSOR_CORE_ELIGIBLE_OPS, operator_view
from diagnostics.facts.kernel_classes import is_tensor_core
from diagnostics.facts.linking import build_index
from diagnostics.facts.memory import memory_curve

# --- Overview --------------------------------------------------------------------------


def test_overview_is_the_mean_step_split_into_seven_parts(large_drill):
    table = large_drill.overview
    assert table["category"].to_list() == [
        "Kernel",
        "Memcpy",
        "Memset",
        "Runtime",
        "DataLoader",
        "CPU exec",
        "Other",
    ]
    # the parts of every step add up to the step, so their means add up to the mean step
    mean_step_ms = float(large_drill.breakdown["total_us"].mean()) / 1000.0
    assert table["mean_ms"].sum() == pytest.approx(mean_step_ms)
    assert table["pct"].sum() == pytest.approx(100.0)
    kernel_ms = float(large_drill.breakdown["kernel_us"].mean()) / 1000.0
    assert table.filter(pl.col("category") == "Kernel")["mean_ms"][0] == pytest.approx(kernel_ms)
    # this ResNet/DDP trace is GPU-heavy: kernels are the largest part
    assert table.sort("mean_ms", descending=True)["category"][0] == "Kernel"


# --- Operators -------------------------------------------------------------------------


def test_operator_calls_match_the_json(h200_drill, h200_raw):
    expected = Counter(
        e["name"]
        for e in h200_raw
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and "dur" in e
    )
    got = dict(h200_drill.operators.select("operator", "calls").iter_rows())
    assert got == dict(expected)


def test_grouping_by_shape_splits_each_operator_by_its_input_dims(h200_drill, h200_raw):
    shapes = Counter(
        str(e["args"]["Input Dims"]).replace(" ", "")
        for e in h200_raw
        if e.get("cat") == "cpu_op" and e.get("name") == "aten::mm"
    )
    by_shape = h200_drill.operators_by_shape.filter(pl.col("operator") == "aten::mm")
    assert dict(by_shape.select("input_shapes", "calls").iter_rows()) == dict(shapes)
    by_name = h200_drill.operators.filter(pl.col("operator") == "aten::mm")
    for column in ("calls", "host_self_ms", "device_self_ms", "device_total_ms"):
        assert by_shape[column].sum() == pytest.approx(by_name[column][0])


def test_operator_times_are_bounded_by_what_they_contain(h200_drill):
    ops = h200_drill.operators
    assert (ops["host_self_ms"] <= ops["host_total_ms"] + 1e-9).all()
    assert (ops["device_self_ms"] <= ops["device_total_ms"] + 1e-6).all()
    # self device time is each GPU event counted once: at most the GPU's total
    gpu_ms = float(build_index(h200_drill.trace.events).gpu["dur_us"].sum()) / 1000.0
    assert ops["device_self_ms"].sum() <= gpu_ms + 1e-6


def test_tensor_core_eligibility_is_by_operator_name(h200_drill):
    flags = dict(h200_drill.operators.select("operator", "tensor_core_eligible").iter_rows())
    assert flags["aten::mm"] and flags["aten::addmm"]
    assert not flags["aten::add_"] and not flags["aten::copy_"]
    assert {op for op, eligible in flags.items() if eligible} <= TENSOR_CORE_ELIGIBLE_OPS


def test_search_is_literal_and_case_insensitive(h200_drill):
    ops = h200_drill.operators
    assert set(search(ops, "ATEN::MM")["operator"]) == {"aten::mm"}
    assert search(ops, "(").height == 0  # a regex character is just a character
    assert search(ops, "  ").height == ops.height


def test_operator_view_rejects_an_unknown_grouping(h200_drill):
    with pytest.raises(ValueError, match="by must be"):
        operator_view(build_index(h200_drill.trace.events), "shape")  # type: ignore[arg-type]


# --- Kernels ---------------------------------------------------------------------------


def test_kernel_calls_times_and_occupancy_match_the_json(large_drill, large_raw):
    calls: Counter[str] = Counter()
    total: defaultdict[str, float] = defaultdict(float)
    occupancy: defaultdict[str, float] = defaultdict(float)
    for e in large_raw:
        if e.get("cat") == "kernel" and e.get("ph") == "X":
            calls[e["name"]] += 1
            total[e["name"]] += e["dur"]
            occupancy[e["name"]] += e["dur"] * e["args"]["est. achieved occupancy %"]
    table = large_drill.kernels
    assert dict(table.select("kernel", "calls").iter_rows()) == dict(calls)
    for name, total_us, occ in table.select("kernel", "total_us", "occupancy_pct").iter_rows():
        assert total_us == pytest.approx(total[name])
        if total[name] > 0:  # weighted by duration, as torch-tb-profiler does
            assert occ == pytest.approx(occupancy[name] / total[name])
    assert (table["min_us"] <= table["mean_us"]).all() and (
        table["mean_us"] <= table["max_us"]
    ).all()


def test_kernels_carry_the_rules_tensor_core_class_and_the_launching_operator(h200_drill):
    table = h200_drill.kernels
    for name, flag in table.select("kernel", "tensor_core").iter_rows():
        assert flag == is_tensor_core(name)
    tensor_core = table.filter(pl.col("tensor_core"))
    assert tensor_core.height > 0  # a bf16 run on an H200
    # every Tensor Core kernel here is a GEMM or attention launched from its operator
    assert set(tensor_core["operator"]) <= TENSOR_CORE_ELIGIBLE_OPS


def test_nccl_kernels_are_launched_by_the_collective(large_drill):
    nccl = large_drill.kernels.filter(pl.col("kernel").str.starts_with("ncclKernel"))
    assert nccl.height > 0
    assert set(nccl["operator"]) == {"record_param_comms"}


# --- Memory ----------------------------------------------------------------------------


def test_memory_curve_peak_is_the_largest_total_allocated(h200_drill, h200_raw):
    peak = max(
        e["args"]["Total Allocated"]
        for e in h200_raw
        if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1
    )
    gpu = h200_drill.memory_peaks.filter(pl.col("device") == 0)
    assert gpu["allocated_mib"][0] == pytest.approx(peak / 2**20)


def test_downsampling_keeps_the_peak(large_drill):
    full = memory_curve(large_drill.trace.events)
    small = allocator_curve(full, 0.0, max_points=50)
    assert small.group_by("device").len()["len"].max() <= 60
    peak = full.filter(pl.col("device") == 1)["allocated_bytes"].max() / 2**20
    assert curve_peaks(small).filter(pl.col("device") == 1)["allocated_mib"][0] == peak


def test_top_allocations_are_the_largest_with_their_operator(h200_drill, h200_raw):
    sizes = sorted(
        (
            e["args"]["Bytes"]
            for e in h200_raw
            if e.get("name") == "[memory]" and e["args"]["Bytes"] > 0
        ),
        reverse=True,
    )
    table = h200_drill.allocations
    assert table.height == 50
    assert table["size_mib"].to_list() == pytest.approx([b / 2**20 for b in sizes[:50]])
    assert table["operator"].null_count() == 0  # the trainer allocates inside operators


def test_operators_by_shape_carry_the_roofline_of_their_calls(h200_drill):
    # m768l6b256 (run.json): batch 256 x 128 tokens = 32768 rows, hidden 768, FFN 3072, bf16
    # on an H200 (989.5 dense bf16 TFLOP/s). The FFN up-projection's addmm: 2·M·N·K + M·N.
    table = h200_drill.operators_by_shape
    up = table.filter(
        (pl.col("operator") == "aten::addmm")
        & (pl.col("input_shapes") == "[[3072],[32768,768],[768,3072],[],[]]")
    ).row(0, named=True)
    per_call = 2 * 32768 * 3072 * 768 + 32768 * 3072
    assert up["gflops"] == pytest.approx(up["calls"] * per_call / 1e9)
    assert up["bound"] == "compute"
    assert up["pct_of_peak_flops"] == pytest.approx(100 * up["tflops_per_s"] / 989.5)
    # operators without a FLOP model have no roofline figures, never zeros
    view = table.filter(pl.col("operator") == "aten::view")
    assert view.height and view["tflops_per_s"].null_count() == view.height


def test_kernels_carry_the_rate_of_the_operators_that_launched_them(h200_drill):
    kernels = h200_drill.kernels
    # cuBLAS's nvjet_sm90_* GEMMs here: the Tensor Core kernels the family table knows
    gemm = kernels.filter(pl.col("tensor_core") & pl.col("tflops_per_s").is_not_null())
    assert gemm.height
    top = gemm.row(0, named=True)
    # H200 dense bf16 peak 989.5: a real GEMM kernel runs well below it, and above 10 %
    assert 10 < top["pct_of_peak_flops"] < 100
