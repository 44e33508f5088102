"""tensor-cores-unused says it could not tell when the kernel-family table knows too little
of the kernel time, naming the kernels it could not read."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from diagnostics.facts.assemble import compute_facts
from diagnostics.rules import examples as ex
from diagnostics.rules.engine import run_rules
from diagnostics.rules.tensor_cores_unused import classified_kernels, coverage_of
from diagnostics.trace.loader import load

TRACES = Path(__file__).resolve().parents[4] / "shared" / "traces"

# Real names the table does not know: an older Inductor kernel (hta_a100_rank0_of_16) and
# cutlass's fp32 memory-efficient attention (H200 m768l6b256-fp32); 8 of 10 ms unknown.
UNKNOWN_TRITON = "triton__0d1d2d3d4d5d6d7d8d9d10d11d12d13d14"
UNKNOWN_FMHA = (
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, "
    "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)"
)


def _inputs():
    return ex.inputs(
        trace=ex.trace(
            kernels=[
                ex.kernel(UNKNOWN_TRITON, 100, 5000.0),
                ex.kernel(UNKNOWN_FMHA, 100, 3000.0),
                ex.kernel("ampere_sgemm_128x64_tn", 100, 2000.0),
            ]
        )
    )


def test_could_not_tell_below_the_classified_share():
    outcome = run_rules(_inputs())
    assert "tensor-cores-unused" not in {f.rule for f in outcome.findings}
    (reason,) = [s.reason for s in outcome.skipped if s.rule == "tensor-cores-unused"]
    # 2 of 10 ms classified (the sgemm): 20.0 % against the default 90 %
    assert reason.startswith("could not tell: only 20.0 % of kernel time")
    assert UNKNOWN_TRITON in reason and "(5.00 ms)" in reason


def test_a_lower_threshold_lets_the_rule_judge():
    outcome = run_rules(_inputs(), {"kernel_classified_min_pct": 10.0})
    assert "tensor-cores-unused" not in {s.rule for s in outcome.skipped}


REAL = (
    "hta_v100_rank1_of_2_large.json.gz",
    "hta_a100_rank0_of_16.json.gz",
    "tracelens_mi300x_qwen1.5-0.5b_infer_profmem.json.gz",
    "tracelens_b200_vllm_moe_mxfp4_rank0_of_8.json.gz",
    "tracelens_h100_qwen1.5-0.5b_infer_profmem.json.gz",
)


@pytest.mark.parametrize("name", REAL)
def test_the_facts_classes_give_the_coverage_the_names_give(name):
    # coverage_of reads the kernel table's family/unit/precision where the facts wrote them
    # (classifying 27 families' regexes again cost 15 ms a call); on real traces that is
    # the coverage the names alone give, unknown kernels and all
    trace = compute_facts(load(TRACES / name).traces[0].events)
    assert {"family", "unit", "precision"} <= set(trace.kernels.columns)
    by_names = coverage_of(
        replace(trace, kernels=trace.kernels.drop("family", "unit", "precision"))
    )
    assert coverage_of(trace) == by_names
    assert by_names is not None and by_names.kernel_us > 0


@pytest.mark.parametrize("name", REAL)
def test_the_rule_reads_the_classes_the_names_give(name):
    # the rule's Tensor-Core and CUDA-core shares come from the facts' columns: they are
    # the classes of the names (classifying again cost 8 ms of the rules' 15 ms)
    trace = compute_facts(load(TRACES / name).traces[0].events)
    classes = ["name", "family", "unit", "precision", "tensor_core", "cuda_core_gemm"]
    from_facts = classified_kernels(trace).select(classes)
    bare = trace.kernels.drop("family", "unit", "precision", "tensor_core", "cuda_core_gemm")
    assert_frame_equal(from_facts, classified_kernels(replace(trace, kernels=bare)).select(classes))
    assert from_facts["tensor_core"].any() or from_facts["cuda_core_gemm"].any()


def test_a_hand_set_flag_is_not_read_as_a_class():
    # an example's kernel row carries tensor_core as given; the rule classifies its name
    trace = ex.trace(kernels=[ex.kernel("ampere_sgemm_128x64_tn", 10, 100.0, tensor_core=True)])
    row = classified_kernels(trace).row(0, named=True)
    assert row["tensor_core"] is False and row["cuda_core_gemm"] is True
