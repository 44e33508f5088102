"""tensor-cores-unused says it could not tell when the kernel-family table knows too little
of the kernel time, naming the kernels it could not read."""

from __future__ import annotations

from diagnostics.rules import examples as ex
from diagnostics.rules.engine import run_rules

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
