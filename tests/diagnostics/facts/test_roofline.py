"""Roofline figures through the whole path (loader -> links -> FLOP model -> peaks): on a
real H200 training trace of this project's trainer, and on hand-made traces for what a real
one cannot pin (an unknown device, nested models, the union of overlapping kernels)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from diagnostics.facts.assemble import compute_facts

from .trace_fixture import gpu, load_events, load_rows, op, runtime

H200_RUN = (
    Path(__file__).resolve().parents[3].parent / "shared" / "gpu-runs" / "h200-sized" / "m512l4b256"
)
BF16 = "c10::BFloat16"


@pytest.fixture(scope="module")
def h200():
    trace = next((H200_RUN / "trace").glob("*.pt.trace.json.gz"))
    events, metadata = load_events(trace)
    return compute_facts(events, metadata).roofline


def test_h200_training_gemm_flops_are_six_n_t_plus_bias_from_the_runs_config(h200):
    # run.json: hidden 512, intermediate 2048, 4 layers, batch 256 x 64 tokens, two heads on
    # the pooled [256, 512] (10 and 5 classes); 3 profiled steps. Each linear costs 2·rows·
    # in·out forward (+ rows·out bias), 2·rows·in·out for dX and again for dW backward.
    tokens, rows = 256 * 64, 256

    def linear(r: int, fan_in: int, fan_out: int) -> int:
        return 6 * r * fan_in * fan_out + r * fan_out

    layer = 4 * linear(tokens, 512, 512) + linear(tokens, 512, 2048) + linear(tokens, 2048, 512)
    per_step = 4 * layer + linear(rows, 512, 10) + linear(rows, 512, 5)
    counted_gemm = h200.calls.filter(pl.col("counted") & (pl.col("kind") == "gemm"))
    assert counted_gemm["flops"].sum() == 3 * per_step
    assert h200.peak.device == "H200 SXM"


def test_h200_backward_attention_and_nested_linear_calls(h200):
    calls = h200.calls
    # aten::linear holds aten::addmm: the outer one keeps its figures but is not counted
    assert not calls.filter(pl.col("name") == "aten::linear")["counted"].any()
    assert calls.filter(pl.col("name") == "aten::addmm")["counted"].all()
    backward = calls.filter(pl.col("name") == "aten::_scaled_dot_product_cudnn_attention_backward")
    forward = calls.filter(pl.col("name") == "aten::_scaled_dot_product_cudnn_attention")
    assert backward.height == forward.height == 12  # 4 layers x 3 steps
    # B=256 H=8 N=64 d=64, not causal: forward 4·B·H·N²·d, backward 2.5 times that
    assert forward["flops"][0] == 4 * 256 * 8 * 64 * 64 * 64
    assert backward["flops"][0] == 10 * 256 * 8 * 64 * 64 * 64
    assert backward["backward"].all()
    # every modelled call with kernels has a rate, and a bound on this known device
    timed = calls.filter(pl.col("gpu_us").is_not_null() & pl.col("bytes").is_not_null())
    assert timed.height > 0 and timed["bound"].null_count() == 0


def _addmm_trace(with_device: bool):
    # one aten::linear -> aten::addmm (M=N=K=1024, bf16) whose call launched two kernels that
    # overlap on two streams: [10, 30) and [20, 40) -> union 30 µs, not 40
    dims = [[1024], [1024, 1024], [1024, 1024], [], []]
    linear = op("aten::linear", 0, 100)
    linear["args"] = {
        "Input Dims": [[1024, 1024], [1024, 1024], [1024]],
        "Input type": [BF16, BF16, BF16],
        "Concrete Inputs": ["", "", ""],
    }
    addmm = op("aten::addmm", 1, 98)
    addmm["args"] = {
        "Input Dims": dims,
        "Input type": [BF16, BF16, BF16, "Scalar", "Scalar"],
        "Concrete Inputs": ["", "", "", "1", "1"],
    }
    rows = [
        linear,
        addmm,
        runtime("cudaLaunchKernel", 2, 1, 11),
        runtime("cudaLaunchKernel", 4, 1, 12),
        gpu("gemm_a", 10, 20, 11, stream=7),
        gpu("gemm_b", 20, 20, 12, stream=8),
    ]
    trace = load_rows(rows)
    if with_device:
        props = ({"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0},)
        trace = replace(trace, metadata=replace(trace.metadata, device_properties=props))
    return compute_facts(trace.events, trace.metadata).roofline


def test_rates_use_the_union_of_overlapping_kernels_and_an_unknown_device_gets_no_percentage():
    roofline = _addmm_trace(with_device=False)
    addmm = roofline.calls.filter(pl.col("name") == "aten::addmm").row(0, named=True)
    flops = 2 * 1024**3 + 1024 * 1024
    assert addmm["gpu_us"] == 30.0
    assert addmm["tflops_per_s"] == pytest.approx(flops / 30e-6 / 1e12)
    assert roofline.peak is None
    assert addmm["pct_of_peak_flops"] is None and addmm["bound"] is None
    summary = roofline.to_summary()
    assert summary["device_peak"] is None
    assert summary["counted_gflops"] == pytest.approx(flops / 1e9)  # the linear not again


def test_a_known_device_gives_percentages_of_its_dense_peak():
    addmm = _addmm_trace(with_device=True).calls.filter(pl.col("name") == "aten::addmm")
    row = addmm.row(0, named=True)
    flops = 2 * 1024**3 + 1024 * 1024
    assert row["pct_of_peak_flops"] == pytest.approx(100 * flops / 30e-6 / 1e12 / 989.5)
    # 2 bytes x (3 matrices of 1024² + a 1024 bias): AI = flops / that ≈ 341 > ridge 295
    moved = 2 * (3 * 1024 * 1024 + 1024)
    assert row["flops_per_byte"] == pytest.approx(flops / moved)
    assert row["bound"] == "compute"


def test_h200_addmm_backward_nodes_are_costed_from_their_forward_and_not_counted_twice(h200):
    # AddmmBackward0 carries aten::addmm's sequence number; its two aten::mm children (dX,
    # dW) recorded their own shapes, so the node keeps its figures but is not counted. Its
    # FLOPs are its children's plus the bias gradient, M·N per call: per step 4 layers x
    # (4 x 16384·512 + 16384·2048 + 16384·512) + 256·(10 + 5), over 3 steps.
    nodes = h200.calls.filter(pl.col("name") == "AddmmBackward0")
    assert nodes.height == 78 and not nodes["counted"].any()
    # every aten::mm here is one of those products (the forward linears all run addmm)
    backward_mm = h200.calls.filter(pl.col("name") == "aten::mm")
    assert backward_mm.height == 2 * nodes.height
    bias_grad = 3 * (4 * (4 * 16384 * 512 + 16384 * 2048 + 16384 * 512) + 256 * 15)
    assert nodes["flops"].sum() == backward_mm["flops"].sum() + bias_grad
    # ToCopyBackward0 shares aten::linear's sequence number (autocast's cast runs first):
    # only a node named for the forward GEMM is linked
    assert h200.calls.filter(pl.col("name").str.ends_with("Backward0"))[
        "name"
    ].unique().to_list() == ["AddmmBackward0"]


def test_a_backward_node_without_shaped_children_is_costed_from_its_forward_and_counted():
    # forward aten::mm [64, 32] @ [32, 16] with sequence number 7; later its autograd node
    # MmBackward0 (number 7) launches one kernel, and no aten op inside it recorded shapes
    forward = op("aten::mm", 0, 10)
    forward["args"] = {
        "Input Dims": [[64, 32], [32, 16]],
        "Input type": ["float", "float"],
        "Concrete Inputs": ["", ""],
        "Sequence number": 7,
        "Fwd thread id": 0,
    }
    node = op("MmBackward0", 20, 10)
    node["args"] = {
        "Sequence number": 7,
        "Fwd thread id": 1,
        "Input Dims": [[64, 16]],
        "Input type": ["float"],
        "Concrete Inputs": [""],
    }
    trace = load_rows(
        [
            forward,
            runtime("cudaLaunchKernel", 1, 1, 1),
            gpu("gemm_fwd", 2, 4, 1),
            node,
            runtime("cudaLaunchKernel", 21, 1, 2),
            gpu("gemm_bwd", 22, 8, 2),
        ]
    )
    roofline = compute_facts(trace.events, trace.metadata).roofline
    row = roofline.calls.filter(pl.col("name") == "MmBackward0").row(0, named=True)
    # dX = dY·Bᵀ and dW = Aᵀ·dY: 2·64·16·32 each; bytes: each product's 2 inputs + output
    assert row["flops"] == 2 * 2 * 64 * 16 * 32
    assert row["bytes"] == 4 * 2 * (64 * 16 + 32 * 16 + 64 * 32)
    assert row["backward"] and row["counted"] and row["gpu_us"] == 8.0
    assert roofline.counted_flops == 3 * 2 * 64 * 16 * 32  # forward + backward, once each
