"""The five traces added for issue 18 (other vendors, architectures and jobs): the findings
each must and must not show, and why, from the trace's own events.

The "why" of each expectation is a figure read here from the file with gzip + json in plain
Python (unions of kernel intervals, kernel-name shares), not from the analyser.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

import pytest

from diagnostics.analyze import analyze
from tests.diagnostics.trace.helpers import SHARED_TRACES, union_us

MI300X_QWEN = SHARED_TRACES / "tracelens_mi300x_qwen1.5-0.5b_infer_profmem.json.gz"
H100_QWEN = SHARED_TRACES / "tracelens_h100_qwen1.5-0.5b_infer_profmem.json.gz"
MI300X_DDP = SHARED_TRACES / "tracelens_mi300x_resnet_ddp_actckpt_rank0_of_8.json.gz"
B200_VLLM = SHARED_TRACES / "tracelens_b200_vllm_moe_mxfp4_rank0_of_8.json.gz"
A100_NCCL = SHARED_TRACES / "hta_a100_ddp_resnet_rank0_of_2_nccl.json.gz"


@cache
def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as handle:
        return [e for e in json.load(handle)["traceEvents"] if e.get("ph") == "X"]


@cache
def _result(path: Path):
    return analyze(path)


def _fired(path: Path) -> set[str]:
    return {f.rule for f in _result(path).findings}


def _kernels(path: Path) -> list[dict]:
    return [e for e in _events(path) if e.get("cat") == "kernel"]


def _share_of_kernel_time(path: Path, keep) -> float:
    kernels = _kernels(path)
    return (
        100.0 * sum(e["dur"] for e in kernels if keep(e["name"])) / sum(e["dur"] for e in kernels)
    )


def test_mi300x_bf16_inference_is_told_nothing_it_does_not_show():
    # hipBLASLt's Cijk_ GEMMs (bf16, "BBS") and AOTriton attention run on MFMA matrix cores:
    # over half the kernel time, so no "Tensor Cores unused"; bf16 needs no GradScaler;
    # the GPU is busy 88 % of the GPU-side step window, so no low utilisation either.
    matrix = _share_of_kernel_time(MI300X_QWEN, lambda n: n.startswith("Cijk_") or "attn_fwd" in n)
    assert matrix > 50.0
    assert _fired(MI300X_QWEN) == set()
    env = _result(MI300X_QWEN).environment
    assert (env["gpu_vendor"], env["gpu_architecture"]) == ("amd", "gfx942")


def test_h100_bf16_inference_is_told_nothing():
    # the same workload on sm_90 cuBLAS bf16 GEMMs: 90.7 % busy, no fp16, no communication
    assert _fired(H100_QWEN) == set()


def test_mi300x_ddp_rank_shows_its_exposed_rccl_time_and_nothing_about_its_cores():
    events = _events(MI300X_DDP)
    steps = [
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e["name"].startswith("ProfilerStep#") and e.get("cat") == "user_annotation"
    ]
    lo, hi = min(s for s, _ in steps), max(e for _, e in steps)
    kernels = [e for e in _kernels(MI300X_DDP) if e["ts"] < hi and e["ts"] + e["dur"] > lo]
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" in e["name"].lower()]
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" not in e["name"].lower()]
    exposed = union_us(comm + compute) - union_us(compute)
    # RCCL keeps NCCL's names (ncclDevKernel_Generic): most of the step is communication
    # nothing overlaps, so exposed-communication must fire, at the share the events give
    assert exposed / (hi - lo) > 0.5
    assert "exposed-communication" in _fired(MI300X_DDP)
    # bf16 convolutions on MFMA matrix cores and SGD without fp16: neither of these
    assert _fired(MI300X_DDP).isdisjoint({"tensor-cores-unused", "unstable-gradients"})


def test_b200_vllm_rank_finds_its_symmetric_memory_all_reduce_and_its_idle_gpu():
    kernels = _kernels(B200_VLLM)
    all_reduce = [e for e in kernels if "multimem_all_reduce" in e["name"]]
    assert all_reduce  # communication without "nccl" in its name
    families = {row["family"] for row in _result(B200_VLLM).summary["comm_families"]}
    assert "symmetric_memory" in families
    # first to last GPU activity, the GPU is busy under a sixth of the time: eager decode
    gpu = [
        (e["ts"], e["ts"] + e["dur"])
        for e in _events(B200_VLLM)
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    busy = union_us(gpu) / (max(e for _, e in gpu) - min(s for s, _ in gpu))
    assert busy < 0.2
    assert {"low-gpu-utilization", "launch-bound-kernels"} <= _fired(B200_VLLM)
    # MXFP4 bmm_Mx... and FP8 fmhaSm100 kernels run on Blackwell's tensor cores; the
    # all-reduce is a small share of the window (under the 10 % bar)
    assert _fired(B200_VLLM).isdisjoint({"tensor-cores-unused", "exposed-communication"})
    low = next(f for f in _result(B200_VLLM).findings if f.rule == "low-gpu-utilization")
    assert "recorded window" in low.title  # no ProfilerStep: not "the profiled steps"


def test_a100_nccl_rank_is_cpu_bound_and_reads_its_collectives_metadata():
    fired = _fired(A100_NCCL)
    # the host runs Python/CPU ops while the GPU idles three quarters of the steps
    assert "low-gpu-utilization" in fired
    # TF32 GEMMs on Ampere's tensor cores; 6 % exposed communication is under the bar
    assert fired.isdisjoint({"tensor-cores-unused", "exposed-communication", "unstable-gradients"})
    nccl = [e for e in _kernels(A100_NCCL) if e["name"].startswith("ncclKernel")]
    assert len(nccl) == 21  # HTA's own test asserts the same count


@pytest.mark.parametrize("path", [MI300X_QWEN, H100_QWEN, MI300X_DDP, B200_VLLM, A100_NCCL])
def test_each_new_trace_reports_its_coverage(path):
    coverage = _result(path).summary["kernel_coverage"]
    assert coverage is not None and coverage["classified_pct"] >= 90.0
