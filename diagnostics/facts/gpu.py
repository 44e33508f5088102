"""GPU busy time and utilisation per device, over the span of the profiler steps.

busy_us: the union of kernel, memcpy and memset ranges on the device, all streams together
(overlapping streams count once), inside [first step start, last step end].
utilization_pct: torch-tb-profiler's "GPU Utilization" (gpu_metrics_parser.py
calculate_gpu_utilization): the union of *kernel* ranges on the device inside that span,
divided by the span. Copies do not count there; busy_pct (with copies) is alongside.
"""

from __future__ import annotations

import polars as pl

from diagnostics.facts.intervals import clip_to, merge_intervals
from diagnostics.facts.linking import TraceIndex
from diagnostics.facts.steps import Steps

GPU_SCHEMA: dict[str, pl.DataType] = {
    "device": pl.Int64,
    "busy_us": pl.Float64,
    "kernel_busy_us": pl.Float64,
    "span_us": pl.Float64,
    "utilization_pct": pl.Float64,
    "busy_pct": pl.Float64,
}


def busy_intervals(index: TraceIndex, *, kernels_only: bool = False) -> pl.DataFrame:
    """Merged busy ranges per device over the whole trace: device, start_us, end_us."""
    key = f"busy:{kernels_only}"
    if key not in index.memo:
        gpu = index.gpu
        if kernels_only:
            gpu = gpu.filter(pl.col("cat") == "kernel")
        index.memo[key] = merge_intervals(gpu.select("device", "start_us", "end_us"), by=["device"])
    return index.memo[key]


def gpu_utilization(index: TraceIndex, steps: Steps) -> pl.DataFrame:
    """device, busy_us, kernel_busy_us, span_us, utilization_pct, busy_pct."""
    span = steps.span
    if span is None or index.gpu.height == 0 or span[1] <= span[0]:
        return pl.DataFrame(schema=GPU_SCHEMA)
    lo, hi = span
    length = hi - lo

    def per_device(ranges: pl.DataFrame, out: str) -> pl.DataFrame:
        return (
            clip_to(ranges, lo, hi)
            .group_by("device")
            .agg((pl.col("end_us") - pl.col("start_us")).sum().alias(out))
        )

    devices = index.gpu.select(pl.col("device").unique()).filter(pl.col("device").is_not_null())
    return (
        devices.join(per_device(busy_intervals(index), "busy_us"), on="device", how="left")
        .join(
            per_device(busy_intervals(index, kernels_only=True), "kernel_busy_us"),
            on="device",
            how="left",
        )
        .with_columns(
            pl.col("busy_us").fill_null(0.0),
            pl.col("kernel_busy_us").fill_null(0.0),
            pl.lit(length).alias("span_us"),
        )
        .with_columns(
            (pl.col("kernel_busy_us") / pl.col("span_us") * 100.0).alias("utilization_pct"),
            (pl.col("busy_us") / pl.col("span_us") * 100.0).alias("busy_pct"),
        )
        .select(list(GPU_SCHEMA))
        .cast(GPU_SCHEMA)
        .sort("device")
    )
