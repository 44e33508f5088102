"""Kernel coverage, device identity and tensor-cores-unused on real traces of four GPUs.

Expected figures come from a plain json.load of each file: summed ``dur`` of the kernel
events whose names the libraries' own naming marks (hipBLASLt's ``Cijk_``, AOTriton's
``attn_fwd``, TensorRT-LLM's ``bmm_...MxE2m1``, ``fmhaSm100...QkvE4m3``, cuBLAS/FlashAttention
on the H100), over all kernel time; never from the analyser's own tables.
"""

from __future__ import annotations

import bisect
import gzip
import json
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

from diagnostics.analyze import analyze

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
MI300X_QWEN = "tracelens_mi300x_qwen1.5-0.5b_infer_profmem.json.gz"
B200 = "tracelens_b200_vllm_moe_mxfp4_rank0_of_8.json.gz"
H100_QWEN = "tracelens_h100_qwen1.5-0.5b_infer_profmem.json.gz"
V100_RESNET = "kineto_resnet50_num_workers_0.pt.trace.json.gz"


@cache
def _events(name: str) -> list[dict]:
    with gzip.open(TRACES / name, "rt") as handle:
        return json.load(handle)["traceEvents"]


@cache
def _result(name: str):
    return analyze(TRACES / name)


def _kernels(name: str) -> list[tuple[str, float]]:
    return [
        (e["name"], float(e["dur"]))
        for e in _events(name)
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"
    ]


def _share_pct(name: str, keep) -> float:
    kernels = _kernels(name)
    total = sum(dur for _, dur in kernels)
    return 100.0 * sum(dur for kernel, dur in kernels if keep(kernel)) / total


def _coverage(name: str) -> dict:
    return _result(name).to_json()["summary"]["kernel_coverage"]


def _env(name: str) -> dict:
    return _result(name).to_json()["environment"]


def _tensor_core_findings(name: str) -> list:
    return [f for f in _result(name).findings if f.rule == "tensor-cores-unused"]


# -- AMD MI300X, Qwen1.5-0.5B bf16 inference ------------------------------------------------


def _mi300x_matrix(kernel: str) -> bool:
    return kernel.startswith("Cijk_") or kernel == "attn_fwd"


def test_mi300x_qwen_is_an_amd_gfx942_mi300x():
    env = _env(MI300X_QWEN)
    assert (env["gpu_vendor"], env["gpu_architecture"], env["gpu_model"]) == (
        "amd",
        "gfx942",
        "MI300X",
    )
    # HIP writes computeMajor/Minor 9/4, which is gfx942, not an NVIDIA compute capability
    assert env["gpu_compute_capability"] is None


def test_mi300x_qwen_gemms_run_on_matrix_cores_and_the_rule_is_silent():
    """hipBLASLt (Cijk_, 17.0 ms) and AOTriton attention (5.7 ms) are MFMA work: most of the
    kernel time is on Matrix Cores, so no 'Tensor-Core-eligible work run without them'."""
    coverage = _coverage(MI300X_QWEN)
    matrix_pct = _share_pct(MI300X_QWEN, _mi300x_matrix)
    assert matrix_pct > 50
    assert coverage["by_unit_pct"]["matrix"] == pytest.approx(matrix_pct, abs=1e-6)
    assert coverage["classified_pct"] == pytest.approx(100.0)
    assert _tensor_core_findings(MI300X_QWEN) == []
    assert "tensor-cores-unused" not in {s.rule for s in _result(MI300X_QWEN).skipped}


def test_mi300x_qwen_matrix_core_time_is_mostly_bf16():
    """The bf16 hipBLASLt GEMMs (type letter B: ``Cijk_Alik_Bljk_B_BS_...``) are most of the
    Matrix Core time; bf16 overall adds the elementwise kernels on c10::BFloat16."""
    bf16_gemm_pct = _share_pct(MI300X_QWEN, lambda k: k.startswith("Cijk_Alik_Bljk_B_BS_"))
    assert bf16_gemm_pct > 0.5 * _share_pct(MI300X_QWEN, _mi300x_matrix)
    bf16_pct = _share_pct(
        MI300X_QWEN,
        lambda k: (
            k.startswith("Cijk_Alik_Bljk_B_BS_") or "bfloat16" in k.lower() or "c10::BFloat16" in k
        ),
    )
    assert _coverage(MI300X_QWEN)["by_precision_pct"]["bf16"] == pytest.approx(bf16_pct, abs=1e-6)


# -- NVIDIA B200, vLLM gpt-oss MXFP4 MoE ------------------------------------------------------


def test_b200_is_sm100_and_its_mxfp4_and_fp8_kernels_carry_their_precision():
    env = _env(B200)
    assert (env["gpu_vendor"], env["gpu_architecture"], env["gpu_model"]) == (
        "nvidia",
        "sm_100",
        "B200",
    )
    assert env["gpu_compute_capability"] == "10.0"
    precision = _coverage(B200)["by_precision_pct"]
    mxfp4 = _share_pct(B200, lambda k: k.startswith("bmm_") and "MxE2m1" in k)
    fp8 = _share_pct(B200, lambda k: k.startswith("fmhaSm100") and "QkvE4m3" in k)
    assert mxfp4 > 40 and fp8 > 1
    assert precision["mxfp4"] == pytest.approx(mxfp4, abs=1e-6)
    assert precision["fp8_e4m3"] == pytest.approx(fp8, abs=1e-6)


def test_b200_communication_includes_symmetric_memory_all_reduce():
    comm = _share_pct(B200, lambda k: "nccl" in k or "multimem_all_reduce" in k)
    assert _coverage(B200)["by_unit_pct"]["communication"] == pytest.approx(comm, abs=1e-6)


# -- NVIDIA H100, the same Qwen workload ------------------------------------------------------


def test_h100_qwen_matrix_share_and_silent_rule():
    env = _env(H100_QWEN)
    assert (env["gpu_architecture"], env["gpu_model"], env["gpu_compute_capability"]) == (
        "sm_90",
        "H100",
        "9.0",
    )
    matrix = _share_pct(
        H100_QWEN, lambda k: "xmma" in k and "ffma" not in k or "pytorch_flash::" in k
    )
    assert _coverage(H100_QWEN)["by_unit_pct"]["matrix"] == pytest.approx(matrix, abs=1e-6)
    assert _tensor_core_findings(H100_QWEN) == []


def _attributed_pct_oracle(name: str) -> float:
    """Kernel time whose correlation id names a runtime call lying inside a cpu_op on the
    same thread, over all kernel time."""
    events = [e for e in _events(name) if e.get("ph") == "X"]
    ops: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op":
            ops[(e["pid"], e["tid"])].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    starts = {key: sorted(spans) for key, spans in ops.items()}
    inside: set = set()
    for e in events:
        if e.get("cat") not in ("cuda_runtime", "cuda_driver"):
            continue
        spans = starts.get((e["pid"], e["tid"]), [])
        ts, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        before = spans[: bisect.bisect_right(spans, (ts, float("inf")))]
        if any(s <= ts and end <= f for s, f in before):
            inside.add(e["args"]["correlation"])
    kernels = [e for e in events if e.get("cat") == "kernel"]
    total = sum(float(e["dur"]) for e in kernels)
    linked = sum(float(e["dur"]) for e in kernels if e["args"].get("correlation") in inside)
    return 100.0 * linked / total


def test_h100_qwen_kernel_time_attributed_to_operators():
    assert _coverage(H100_QWEN)["operator_attributed_pct"] == pytest.approx(
        _attributed_pct_oracle(H100_QWEN), abs=1e-6
    )


# -- NVIDIA V100, ResNet-50 fp32 training ----------------------------------------------------


def test_v100_resnet_verdict_kept():
    """fp32 training on Volta: no kernel on Tensor Cores, the rule fires as before; the
    table knows all but the cuDNN offset helpers and torch's softmax/NLL kernels."""
    (finding,) = _tensor_core_findings(V100_RESNET)
    assert finding.evidence["tensor_core_kernel_pct"] == 0.0
    assert "Tensor Cores" in finding.recommendation and "Matrix" not in finding.recommendation
    env = _env(V100_RESNET)
    assert (env["gpu_architecture"], env["gpu_model"]) == ("sm_70", "V100")
    coverage = _coverage(V100_RESNET)
    assert coverage["by_unit_pct"]["matrix"] == 0.0
    unknown = {k["name"] for k in coverage["unknown_kernels"]}
    unknown_pct = _share_pct(V100_RESNET, lambda k: k in unknown)
    assert coverage["classified_pct"] == pytest.approx(100.0 - unknown_pct, abs=1e-6)
    assert coverage["unknown_kernel_count"] == len(unknown)  # all of them listed (< 10)
