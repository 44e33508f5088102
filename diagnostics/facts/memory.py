"""The memory curve from ``[memory]`` instant events, and its peak against the device.

Kineto 1.10+ writes the allocator's running totals on each event (Total Allocated, Total
Reserved). PyTorch 1.9 traces carry only each event's signed Bytes; there the allocated
curve is their running sum per device (as torch-tb-profiler's memory parser does) and
reserved is unknown. Device -1 is host memory (Device Type 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from diagnostics.facts import selectors as sel

MEMORY_SCHEMA: dict[str, pl.DataType] = {
    "ts_us": pl.Float64,
    "device": pl.Int64,
    "allocated_bytes": pl.Int64,
    "reserved_bytes": pl.Int64,
}
MEMORY_PEAK_SCHEMA: dict[str, pl.DataType] = {
    "device": pl.Int64,
    "peak_allocated_bytes": pl.Int64,
    "peak_reserved_bytes": pl.Int64,
    "device_total_bytes": pl.Int64,  # deviceProperties totalGlobalMem (null for the host)
    "peak_allocated_pct": pl.Float64,  # of device_total_bytes
}


def memory_curve(events: pl.DataFrame) -> pl.DataFrame:
    """ts_us, device (-1 host), allocated_bytes, reserved_bytes, in time order."""
    device = (
        pl.when(pl.col("memory_device_type") == 0)
        .then(pl.lit(-1, pl.Int64))
        .otherwise(pl.col("memory_device_id"))
    )
    mem = sel.select_where(
        events,
        pl.col("cat") == "memory",
        pl.col("ts").alias("ts_us"),
        device.alias("device"),
        "bytes",
        "total_allocated",
        "total_reserved",
    )
    if mem.height == 0:
        return pl.DataFrame(schema=MEMORY_SCHEMA)
    mem = mem.sort("ts_us", maintain_order=True)
    running = pl.col("bytes").fill_null(0).cum_sum().over("device")
    return (
        mem.with_columns(
            pl.coalesce(pl.col("total_allocated"), running).alias("allocated_bytes"),
            pl.col("total_reserved").alias("reserved_bytes"),
        )
        .select(list(MEMORY_SCHEMA))
        .cast(MEMORY_SCHEMA)
    )


def memory_peaks(
    curve: pl.DataFrame, device_properties: Sequence[dict[str, Any]] = ()
) -> pl.DataFrame:
    """device, peak_allocated_bytes, peak_reserved_bytes, device_total_bytes,
    peak_allocated_pct (of the device's totalGlobalMem, from deviceProperties)."""
    if curve.height == 0:
        return pl.DataFrame(schema=MEMORY_PEAK_SCHEMA)
    totals = pl.DataFrame(
        {
            "device": [int(p.get("id", i)) for i, p in enumerate(device_properties)],
            "device_total_bytes": [
                int(p["totalGlobalMem"]) if p.get("totalGlobalMem") else None
                for p in device_properties
            ],
        },
        schema={"device": pl.Int64, "device_total_bytes": pl.Int64},
    )
    return (
        curve.group_by("device")
        .agg(
            pl.col("allocated_bytes").max().alias("peak_allocated_bytes"),
            pl.col("reserved_bytes").max().alias("peak_reserved_bytes"),
        )
        .join(totals, on="device", how="left")
        .with_columns(
            (pl.col("peak_allocated_bytes") / pl.col("device_total_bytes") * 100.0).alias(
                "peak_allocated_pct"
            )
        )
        .select(list(MEMORY_PEAK_SCHEMA))
        .cast(MEMORY_PEAK_SCHEMA)
        .sort("device")
    )
