"""fp16 training without loss scaling, from a trace: fp16 dense GEMMs and their backward, but
none of GradScaler's ops.

fp16 gradients underflow to zero without a GradScaler; bf16 has fp32's exponent range and
needs none, and fp16 *data* (embedding tables, communication buffers, quantised weights) has
no dense gradients to scale. ``diagnostics.facts.precision`` tells training from data; this
module turns its counts into the evidence unstable-gradients quotes.
"""

from __future__ import annotations

from typing import Any

from diagnostics.sources import TraceFacts


def fp16_without_scaler(trace: TraceFacts | None) -> dict[str, Any] | None:
    """fp16 training on the dense path ran but no GradScaler op did: evidence, else None.

    None too when the trace's precision facts were not computed (a hand-built TraceFacts):
    without them fp16 kernels alone cannot tell training from data.
    """
    if trace is None or trace.device != "cuda" or trace.precision is None:
        return None
    facts = trace.precision
    if not facts.fp16_dense_training or facts.scaler_ops:
        return None
    return {
        "fp16_dense_forward_ops": facts.fp16_dense_forward_ops,
        "fp16_dense_backward_ops": facts.fp16_dense_backward_ops,
        "fp16_dense_backward_kernels": facts.fp16_dense_backward_kernels,
        "fp16_dense_backward_kernel_us": round(facts.fp16_dense_backward_kernel_us, 0),
        "top_fp16_kernels": list(facts.top_fp16_dense_kernels),
        "top_fp16_kernel_us": list(facts.top_fp16_dense_kernel_us),
        # fp16 set aside as data, not training
        "fp16_embedding_kernels_ignored": facts.fp16_embedding_kernels,
        "fp16_comm_kernels_ignored": facts.fp16_comm_kernels,
        "unscale_ops_found": 0,
    }
