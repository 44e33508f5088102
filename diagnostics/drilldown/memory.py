"""Memory: the allocator curve (allocated and reserved over time, peak marked) and the
largest allocations with the operator that made them.

The curve is facts.memory.memory_curve (the ``[memory]`` instants' running totals, which
the profiler writes with profile_memory=True). An allocation is a ``[memory]`` event with
positive Bytes; its operator is the innermost operator on the same thread open at that
instant (facts.linking.innermost_operator, the same link runtime calls get).
"""

from __future__ import annotations

import math

import polars as pl

from diagnostics.facts.linking import TraceIndex, innermost_operator

MIB = 1024 * 1024
# Points kept per curve: the chart stays light however many [memory] events there are.
MAX_CURVE_POINTS = 4000

CURVE_SCHEMA: dict[str, pl.DataType] = {
    "device": pl.Int64,
    "time_ms": pl.Float64,  # since the trace's first event
    "allocated_mib": pl.Float64,
    "reserved_mib": pl.Float64,
}
ALLOCATION_SCHEMA: dict[str, pl.DataType] = {
    "size_mib": pl.Float64,
    "time_ms": pl.Float64,
    "device": pl.Int64,  # -1: host memory
    "operator": pl.String,  # null: outside every operator
    "allocated_after_mib": pl.Float64,
}


def trace_start_us(events: pl.DataFrame) -> float:
    start = events["ts"].min() if events.height else None
    return float(start) if start is not None else 0.0


def allocator_curve(
    curve: pl.DataFrame, start_us: float, max_points: int = MAX_CURVE_POINTS
) -> pl.DataFrame:
    """CURVE_SCHEMA from facts.memory (ts_us, device, allocated_bytes, reserved_bytes).

    Downsampled per device to about ``max_points`` by keeping, in each time bucket, the
    point with the most memory allocated: the peak always survives.
    """
    if curve.height == 0:
        return pl.DataFrame(schema=CURVE_SCHEMA)
    frame = curve.select(
        "device",
        ((pl.col("ts_us") - start_us) / 1000.0).alias("time_ms"),
        (pl.col("allocated_bytes") / MIB).alias("allocated_mib"),
        (pl.col("reserved_bytes") / MIB).alias("reserved_mib"),
    ).with_row_index("_i")
    per_device = frame.group_by("device").len()
    biggest = int(per_device["len"].max() or 0)
    if biggest > max_points:
        stride = math.ceil(biggest / max_points)
        frame = (
            frame.with_columns(_bucket=(pl.col("_i").rank("ordinal").over("device") - 1) // stride)
            .sort("allocated_mib", descending=True, nulls_last=True)
            .unique(subset=["device", "_bucket"], keep="first")
        )
    return frame.sort("device", "_i").select(list(CURVE_SCHEMA)).cast(CURVE_SCHEMA)


def curve_peaks(curve: pl.DataFrame) -> pl.DataFrame:
    """device, time_ms, allocated_mib of each device's highest allocated point."""
    if curve.height == 0:
        return curve.select("device", "time_ms", "allocated_mib")
    return (
        curve.drop_nulls("allocated_mib")
        .sort("allocated_mib", descending=True)
        .unique(subset="device", keep="first")
        .select("device", "time_ms", "allocated_mib")
        .sort("device")
    )


def top_allocations(
    events: pl.DataFrame, index: TraceIndex, start_us: float, n: int = 50
) -> pl.DataFrame:
    """ALLOCATION_SCHEMA: the ``n`` largest allocations, largest first."""
    allocs = events.filter((pl.col("cat") == "memory") & (pl.col("bytes") > 0))
    if allocs.height == 0:
        return pl.DataFrame(schema=ALLOCATION_SCHEMA)
    device = (
        pl.when(pl.col("memory_device_type") == 0)
        .then(pl.lit(-1, pl.Int64))
        .otherwise(pl.col("memory_device_id"))
    )
    top = (
        allocs.with_row_index("alloc_id")
        .sort(["bytes", "ts"], descending=[True, False])
        .head(n)
        .select(
            "alloc_id",
            "pid",
            "tid",
            pl.col("ts").alias("start_us"),
            pl.col("ts").alias("end_us"),
            "bytes",
            device.alias("device"),
            "total_allocated",
        )
    )
    linked = innermost_operator(top, index.ops, id_col="alloc_id").join(
        index.ops.select("op_id", pl.col("name").alias("operator")), on="op_id", how="left"
    )
    return (
        top.join(linked.select("alloc_id", "operator"), on="alloc_id", how="left")
        .select(
            (pl.col("bytes") / MIB).alias("size_mib"),
            ((pl.col("start_us") - start_us) / 1000.0).alias("time_ms"),
            "device",
            "operator",
            (pl.col("total_allocated") / MIB).alias("allocated_after_mib"),
        )
        .cast(ALLOCATION_SCHEMA)
        .sort(["size_mib", "time_ms"], descending=[True, False])
    )
