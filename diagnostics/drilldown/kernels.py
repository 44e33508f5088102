"""Kernels: per kernel name, time, launch figures, Tensor/Matrix Cores and the launching operator.

blocks_per_sm and occupancy_pct are CUPTI's per-launch figures (Kineto args "blocks per SM",
"est. achieved occupancy %"), averaged weighted by duration as torch-tb-profiler does, so a
long launch counts more than a short one; null where the trace does not carry them. The
Tensor Core column (Matrix Cores on AMD) is the rule's classification (facts.kernel_classes);
the launching operator is the innermost operator around the runtime call that launched the kernel
(correlation id, facts.linking), the most frequent one when several launch it.
"""

from __future__ import annotations

import polars as pl

from diagnostics.facts import kernel_classes
from diagnostics.facts.linking import TraceIndex
from diagnostics.facts.peaks import DevicePeak
from diagnostics.facts.roofline import kernel_roofline, operator_roofline

KERNEL_VIEW_SCHEMA: dict[str, pl.DataType] = {
    "kernel": pl.String,
    "calls": pl.UInt32,
    "total_us": pl.Float64,
    "mean_us": pl.Float64,
    "min_us": pl.Float64,
    "max_us": pl.Float64,
    "blocks_per_sm": pl.Float64,
    "occupancy_pct": pl.Float64,
    "tensor_core": pl.Boolean,
    "operator": pl.String,  # the launching operator (most frequent); null when unlinked
    "operators": pl.UInt32,  # how many different operators launch it
    # roofline of the modelled operator calls that launched it, their FLOPs and bytes split
    # over their kernels by duration (facts.roofline.kernel_roofline); null: none modelled
    "tflops_per_s": pl.Float64,
    "tb_per_s": pl.Float64,
    "flops_per_byte": pl.Float64,
    "pct_of_peak_flops": pl.Float64,
    "bound": pl.String,
}


def _weighted(column: str) -> pl.Expr:
    have = pl.col(column).is_not_null() & (pl.col("dur_us") > 0)
    weight = pl.when(have).then(pl.col("dur_us")).otherwise(0.0)
    total = weight.sum()
    return pl.when(total > 0).then((pl.col(column).fill_null(0.0) * weight).sum() / total)


def with_tensor_core(frame: pl.DataFrame) -> pl.DataFrame:
    """Adds tensor_core: the rule's classification of each kernel ``name`` (the one place
    this view reads it, so a new classification reaches the table unchanged)."""
    return frame.with_columns(kernel_classes.TENSOR_CORE.alias("tensor_core"))


def kernel_view(
    index: TraceIndex, peak: DevicePeak | None = None, roofline: pl.DataFrame | None = None
) -> pl.DataFrame:
    """KERNEL_VIEW_SCHEMA rows, by total time descending. ``roofline``:
    operator_roofline(index, peak), when the caller has it already."""
    kernels = index.gpu.filter(pl.col("cat") == "kernel")
    if kernels.height == 0:
        return pl.DataFrame(schema=KERNEL_VIEW_SCHEMA)
    stats = kernels.group_by("name").agg(
        pl.len().alias("calls"),
        pl.col("dur_us").sum().alias("total_us"),
        pl.col("dur_us").mean().alias("mean_us"),
        pl.col("dur_us").min().alias("min_us"),
        pl.col("dur_us").max().alias("max_us"),
        _weighted("blocks_per_sm").alias("blocks_per_sm"),
        _weighted("occupancy_pct").alias("occupancy_pct"),
    )
    launchers = (
        kernels.filter(pl.col("op_id").is_not_null())
        .join(index.ops.select("op_id", pl.col("name").alias("op_name")), on="op_id")
        .group_by("name", "op_name")
        .agg(pl.len().alias("_n"))
        .sort(["name", "_n", "op_name"], descending=[False, True, False])
        .group_by("name", maintain_order=True)
        .agg(
            pl.col("op_name").first().alias("operator"), pl.col("op_name").len().alias("operators")
        )
    )
    calls = operator_roofline(index, peak) if roofline is None else roofline
    rates = kernel_roofline(index, calls, peak).select(
        "name", "tflops_per_s", "tb_per_s", "flops_per_byte", "pct_of_peak_flops", "bound"
    )
    table = (
        stats.join(launchers, on="name", how="left")
        .with_columns(pl.col("operators").fill_null(0))
        .join(rates, on="name", how="left")
    )
    return (
        with_tensor_core(table)
        .rename({"name": "kernel"})
        .select(list(KERNEL_VIEW_SCHEMA))
        .cast(KERNEL_VIEW_SCHEMA)
        .sort(["total_us", "kernel"], descending=[True, False])
    )


def no_kernels_text(device_properties: object) -> str:
    """What the Kernels view says instead of an empty table. Kineto writes
    deviceProperties only when CUDA was there, so a trace without them is a CPU run."""
    if device_properties:
        return "No GPU kernels in this trace (the profiler recorded no CUDA activity)."
    return "No GPU kernels in this trace (a CPU run)."
