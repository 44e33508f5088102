"""GPU copies and memsets by direction and memory kind, with bytes and bandwidth.

Kineto names copies ``Memcpy HtoD (Pageable -> Device)``: the direction, then the source and
destination memory kinds. A host-to-device copy from Pageable memory is staged through a
driver-owned pinned buffer and blocks the host; from Pinned memory it is a plain DMA that
can overlap compute (the evidence for ``pin_memory=True``). Memsets are ``Memset (Device)``.
bandwidth_gb_s = bytes / dur_us / 1e3 (bytes per µs is MB/s), Kineto's own formula.
"""

from __future__ import annotations

import polars as pl

from diagnostics.facts.linking import TraceIndex

COPIES_SCHEMA: dict[str, pl.DataType] = {
    "direction": pl.String,  # HtoD | DtoH | DtoD | HtoH | PtoP | Memset
    "src_memory": pl.String,  # Pageable | Pinned | Device | Managed | Array | ... (null: memset)
    "dst_memory": pl.String,
    "count": pl.UInt32,
    "bytes": pl.Int64,
    "dur_us": pl.Float64,
    "bandwidth_gb_s": pl.Float64,
    "host_us": pl.Float64,  # time in the runtime calls that issued them (the host's share)
}
_COPY = r"^Memcpy\s+(\w+)\s*\(\s*(\w+)\s*->\s*(\w+)\s*\)"
_MEMSET = r"^Memset\s*\(\s*(\w+)\s*\)"


def copy_events(index: TraceIndex) -> pl.DataFrame:
    """One row per copy/memset with direction, src_memory, dst_memory parsed from its name."""
    moves = index.gpu.filter(pl.col("cat").is_in(["gpu_memcpy", "gpu_memset"]))
    name = pl.col("name")
    is_memset = pl.col("cat") == "gpu_memset"
    return moves.with_columns(
        pl.when(is_memset)
        .then(pl.lit("Memset"))
        .otherwise(name.str.extract(_COPY, 1))
        .alias("direction"),
        pl.when(is_memset)
        .then(pl.lit(None, pl.String))
        .otherwise(name.str.extract(_COPY, 2))
        .alias("src_memory"),
        pl.when(is_memset)
        .then(name.str.extract(_MEMSET, 1))
        .otherwise(name.str.extract(_COPY, 3))
        .alias("dst_memory"),
    ).with_columns(
        # Old or unusual names without the memory kinds keep their direction from the name.
        pl.col("direction").fill_null(name.str.extract(r"(HtoD|DtoH|DtoD|HtoH|PtoP)", 1))
    )


def copy_table(index: TraceIndex) -> pl.DataFrame:
    moves = copy_events(index)
    if moves.height == 0:
        return pl.DataFrame(schema=COPIES_SCHEMA)
    # One runtime call may issue several GPU events; count its host time once.
    host = (
        moves.filter(pl.col("rt_id").is_not_null())
        .unique(subset="rt_id")
        .group_by(["direction", "src_memory", "dst_memory"])
        .agg(pl.col("rt_dur_us").sum().alias("host_us"))
    )
    keys = ["direction", "src_memory", "dst_memory"]
    return (
        moves.group_by(keys)
        .agg(
            pl.len().alias("count"),
            pl.col("bytes").sum().alias("bytes"),
            pl.col("dur_us").sum().alias("dur_us"),
        )
        .join(host, on=keys, how="left", nulls_equal=True)
        .with_columns(
            pl.when(pl.col("dur_us") > 0)
            .then(pl.col("bytes") / pl.col("dur_us") / 1e3)
            .otherwise(None)
            .alias("bandwidth_gb_s"),
            pl.col("host_us").fill_null(0.0),
        )
        .select(list(COPIES_SCHEMA))
        .cast(COPIES_SCHEMA)
        .sort(["direction", "src_memory", "dst_memory"], nulls_last=True)
    )
