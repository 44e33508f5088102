"""Kernel launch statistics as HTA defines them (get_cuda_kernel_launch_stats).

Each kernel is paired with the runtime call that launched it (same correlation id):
- launch_us: the call's duration on the host;
- launch_delay_us: kernel start - call start (how long the work sat between the host asking
  and the GPU starting it; HTA writes kernel start - call start + call duration, a sign slip
  we do not copy); over 100 µs is an outlier (HTA's launch_delay_cutoff);
- a short kernel: launched by a call of at most 50 µs (HTA's runtime_cutoff) and running for
  less time than that call took: the GPU finishes faster than the host can feed it.
"""

from __future__ import annotations

import polars as pl

from diagnostics.facts import selectors as sel
from diagnostics.facts.linking import TraceIndex

LAUNCHES_SCHEMA: dict[str, pl.DataType] = {
    "name": pl.String,
    "count": pl.UInt32,
    "kernel_us_mean": pl.Float64,
    "launch_us_mean": pl.Float64,
    "launch_delay_us_mean": pl.Float64,
    "launch_delay_us_max": pl.Float64,
    "short_count": pl.UInt32,
    "delay_outlier_count": pl.UInt32,
    "launch_outlier_count": pl.UInt32,  # launch calls over 50 µs
}


def kernel_launches(index: TraceIndex) -> pl.DataFrame:
    """One row per linked kernel: name, kernel_us, launch_us, launch_delay_us, short."""
    return index.gpu.filter((pl.col("cat") == "kernel") & pl.col("rt_id").is_not_null()).select(
        "name",
        pl.col("dur_us").alias("kernel_us"),
        pl.col("rt_dur_us").alias("launch_us"),
        (pl.col("start_us") - pl.col("rt_start_us")).alias("launch_delay_us"),
        (
            (pl.col("rt_dur_us") <= sel.SHORT_LAUNCH_MAX_US)
            & (pl.col("dur_us") < pl.col("rt_dur_us"))
        ).alias("short"),
    )


def launch_table(index: TraceIndex) -> pl.DataFrame:
    launches = kernel_launches(index)
    if launches.height == 0:
        return pl.DataFrame(schema=LAUNCHES_SCHEMA)
    return (
        launches.group_by("name")
        .agg(
            pl.len().alias("count"),
            pl.col("kernel_us").mean().alias("kernel_us_mean"),
            pl.col("launch_us").mean().alias("launch_us_mean"),
            pl.col("launch_delay_us").mean().alias("launch_delay_us_mean"),
            pl.col("launch_delay_us").max().alias("launch_delay_us_max"),
            pl.col("short").sum().alias("short_count"),
            (pl.col("launch_delay_us") > sel.LAUNCH_DELAY_OUTLIER_US)
            .sum()
            .alias("delay_outlier_count"),
            (pl.col("launch_us") > sel.SHORT_LAUNCH_MAX_US).sum().alias("launch_outlier_count"),
        )
        .cast(LAUNCHES_SCHEMA)
        .sort(["count", "name"], descending=[True, False])
    )
