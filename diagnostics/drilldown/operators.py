"""Operators: per operator (or operator and input shapes), host and device time.

Times come from facts.operators.operator_instances (self/total, host/device, linked through
correlation ids); the shapes from the event table's input_shapes (record_shapes=True).
Tensor-Core eligibility is by operator name, as torch-tb-profiler decides it: the matrix
multiplies and convolutions that cuBLAS/cuDNN can run on Tensor Cores.
"""

from __future__ import annotations

from typing import Literal

import polars as pl

from diagnostics.facts.linking import TraceIndex
from diagnostics.facts.operators import operator_instances
from diagnostics.facts.peaks import DevicePeak
from diagnostics.facts.roofline import VIEW_ROOFLINE_SCHEMA, grouped_roofline, operator_roofline

# torch-tb-profiler's TC_Allowlist (tensor_cores_parser.py) plus the fused attention ops
# that dispatch to Tensor Core kernels in PyTorch 2.x.
TENSOR_CORE_ELIGIBLE_OPS: frozenset[str] = frozenset(
    {
        "aten::addmm",
        "aten::addbmm",
        "aten::baddbmm",
        "aten::bmm",
        "aten::mm",
        "aten::matmul",
        "aten::linear",
        "aten::conv1d",
        "aten::conv2d",
        "aten::conv3d",
        "aten::conv_transpose1d",
        "aten::conv_transpose2d",
        "aten::conv_transpose3d",
        "aten::convolution",
        "aten::_convolution",
        "aten::cudnn_convolution",
        "aten::cudnn_convolution_transpose",
        "aten::convolution_backward",
        "aten::cudnn_convolution_backward",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::_scaled_dot_product_efficient_attention_backward",
        "aten::_scaled_dot_product_cudnn_attention_backward",
        "aten::_flash_attention_forward",
        "aten::_flash_attention_backward",
        "aten::_efficient_attention_forward",
        "aten::_efficient_attention_backward",
        "aten::_cudnn_attention_forward",
        "aten::_cudnn_attention_backward",
        "aten::scaled_dot_product_attention",
        "aten::_scaled_mm",
    }
)
Grouping = Literal["operator", "operator+shape"]
OPERATOR_VIEW_SCHEMA: dict[str, pl.DataType] = {
    "operator": pl.String,
    "input_shapes": pl.String,  # "" when grouped by operator only or not recorded
    "calls": pl.UInt32,
    "host_self_ms": pl.Float64,
    "host_total_ms": pl.Float64,
    "device_self_ms": pl.Float64,
    "device_total_ms": pl.Float64,
    "tensor_core_eligible": pl.Boolean,
    # roofline (facts.roofline, docs/ROOFLINE.md): null where no call of the row has a FLOP
    # model or GPU time; pct_of_peak_flops and bound null on a device without a peak row
    **VIEW_ROOFLINE_SCHEMA,
}


def operator_view(
    index: TraceIndex,
    by: Grouping = "operator",
    peak: DevicePeak | None = None,
    roofline: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """OPERATOR_VIEW_SCHEMA rows, by device self time then host self time, descending.
    ``roofline``: operator_roofline(index, peak), when the caller has it already."""
    if by not in ("operator", "operator+shape"):
        raise ValueError(f"by must be 'operator' or 'operator+shape', not {by!r}")
    calls = operator_instances(index)
    if calls.height == 0:
        return pl.DataFrame(schema=OPERATOR_VIEW_SCHEMA)
    shapes = index.ops.select("op_id", pl.col("input_shapes").fill_null(""))
    calls = calls.join(shapes, on="op_id", how="left")
    keys = ["name", "input_shapes"] if by == "operator+shape" else ["name"]
    grouped = calls.group_by(keys).agg(
        pl.len().alias("calls"),
        (pl.col("host_self_us").sum() / 1000.0).alias("host_self_ms"),
        (pl.col("host_us").sum() / 1000.0).alias("host_total_ms"),
        (pl.col("device_us").sum() / 1000.0).alias("device_self_ms"),
        (pl.col("device_total_us").sum() / 1000.0).alias("device_total_ms"),
    )
    if by == "operator":
        grouped = grouped.with_columns(input_shapes=pl.lit(""))
    rates = operator_roofline(index, peak) if roofline is None else roofline
    rates = grouped_roofline(rates.join(shapes, on="op_id", how="left"), keys, peak)
    return (
        grouped.join(rates, on=keys, how="left")
        .rename({"name": "operator"})
        .with_columns(
            tensor_core_eligible=pl.col("operator").is_in(sorted(TENSOR_CORE_ELIGIBLE_OPS))
        )
        .select(list(OPERATOR_VIEW_SCHEMA))
        .cast(OPERATOR_VIEW_SCHEMA)
        .sort(
            ["device_self_ms", "host_self_ms", "operator", "input_shapes"],
            descending=[True, True, False, False],
        )
    )


def search(table: pl.DataFrame, text: str, column: str = "operator") -> pl.DataFrame:
    """Rows whose ``column`` contains ``text`` (case-insensitive, literal); all for ''."""
    text = text.strip()
    if not text:
        return table
    return table.filter(pl.col(column).str.to_lowercase().str.contains(text.lower(), literal=True))
