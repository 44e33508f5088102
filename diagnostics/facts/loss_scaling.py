"""fp16 without loss scaling, from a trace: half-precision work but none of GradScaler's ops.

fp16 gradients underflow to zero without a GradScaler; bf16 has fp32's exponent range and
needs none. Telling them apart from a trace is the hard part: see ``fp16_without_scaler``.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from diagnostics.facts.kernel_classes import PRECISION
from diagnostics.model import TraceFacts

# the ops torch.amp.GradScaler runs each step (unscale_ + update)
UNSCALE_OPS = ("_amp_foreach_non_finite_check_and_unscale_", "_amp_update_scale")


def _formats(trace: TraceFacts) -> pl.DataFrame:
    """The trace's kernels with their float format (kernel_classes.PRECISION)."""
    return trace.kernels.with_columns(PRECISION.alias("_precision"))


def fp16_without_scaler(trace: TraceFacts | None) -> dict[str, Any] | None:
    """fp16 (not bf16) ran but no GradScaler op did: evidence, else None.

    fp16 is known from kernels named fp16 (``c10::Half``, ``_hsh_``, ``h884``...) or from
    operators whose recorded input dtypes include ``c10::Half``. Kernels that say only
    ``f16`` count as fp16 only when nothing in the trace (kernel or operator) is bf16: cuDNN
    names its fused attention ``..._wgmma_f16_...`` for bf16 inputs too, and bf16 needs no
    GradScaler.
    """
    if trace is None or trace.device != "cuda" or trace.kernels.height == 0:
        return None
    kernels = _formats(trace)
    op_ops = trace.op_half_dtypes
    op_dtypes = dict(op_ops.iter_rows()) if op_ops is not None and op_ops.height else {}
    bf16_seen = bool((kernels["_precision"] == "bf16").any()) or "c10::BFloat16" in op_dtypes
    fp16 = kernels.filter(pl.col("_precision").is_in(["fp16"] if bf16_seen else ["fp16", "half"]))
    fp16_ops = int(op_dtypes.get("c10::Half", 0))
    if fp16.height == 0 and fp16_ops == 0:
        return None
    op_names = trace.operators["name"].to_list() + kernels["name"].to_list()
    if any(marker in name for name in op_names for marker in UNSCALE_OPS):
        return None
    top = fp16.sort("device_us", descending=True).head(5)
    return {
        "fp16_kernels": fp16.height,
        "fp16_kernel_us": round(float(fp16["device_us"].sum()), 0),
        "fp16_input_ops": fp16_ops,
        "top_fp16_kernels": top["name"].to_list(),
        "top_fp16_kernel_us": top["device_us"].to_list(),
        "unscale_ops_found": 0,
    }
