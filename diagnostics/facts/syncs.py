"""Host-device synchronisation: the calls that block the host until the GPU catches up.

Counted: cudaStreamSynchronize / cudaDeviceSynchronize / cudaEventSynchronize (and their
driver twins), aten::item and aten::_local_scalar_dense (a device scalar read back; only on
traces with GPU work, since on a CPU tensor they block on nothing), and the runtime calls
that copy device memory into pageable host memory (``Memcpy DtoH (Device -> Pageable)``:
synchronous whatever the caller asked).

The per-name table sums each call's own wall time (nested names, e.g. aten::item around
aten::_local_scalar_dense around cudaStreamSynchronize, each count their own). The per-step
blocked time is the union of all of them clipped to the step, so nesting counts once;
sync_count there is the number of separate blocked stretches starting in the step.
"""

from __future__ import annotations

import polars as pl

from diagnostics.facts import selectors as sel
from diagnostics.facts.intervals import covered_between
from diagnostics.facts.linking import TraceIndex
from diagnostics.facts.roles import merged_role
from diagnostics.facts.steps import Steps

SYNCS_SCHEMA: dict[str, pl.DataType] = {
    "name": pl.String,
    "count": pl.UInt32,
    "total_us": pl.Float64,
    "mean_us": pl.Float64,
    "max_us": pl.Float64,
}
SYNC_PER_STEP_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64,
    "sync_us": pl.Float64,
    "sync_count": pl.UInt32,
}


def sync_calls(events: pl.DataFrame, index: TraceIndex) -> pl.DataFrame:
    """name, pid, tid, start_us, end_us, dur_us of every synchronising call (a pageable
    copy's pid/tid are its launching call's)."""
    names = sel.RUNTIME & pl.col("name").is_in(sorted(sel.SYNC_RUNTIME_NAMES))
    if index.gpu.height:
        names = names | (sel.CPU_OP & pl.col("name").is_in(sorted(sel.SYNC_OP_NAMES)))
    calls = sel.select_where(
        events,
        names & pl.col("dur").is_not_null(),
        "name",
        "pid",
        "tid",
        pl.col("ts").alias("start_us"),
        sel.END_US,
    )
    copies = (
        index.gpu.filter((pl.col("name") == sel.PAGEABLE_DTOH_COPY) & pl.col("rt_id").is_not_null())
        .unique(subset="rt_id")
        .select(
            "name",
            pl.col("rt_pid").alias("pid"),
            pl.col("rt_tid").alias("tid"),
            pl.col("rt_start_us").alias("start_us"),
            pl.col("rt_end_us").alias("end_us"),
        )
    )
    return pl.concat([calls, copies]).with_columns(
        (pl.col("end_us") - pl.col("start_us")).alias("dur_us")
    )


def sync_table(events: pl.DataFrame, index: TraceIndex) -> pl.DataFrame:
    calls = sync_calls(events, index)
    if calls.height == 0:
        return pl.DataFrame(schema=SYNCS_SCHEMA)
    return (
        calls.group_by("name")
        .agg(
            pl.len().alias("count"),
            pl.col("dur_us").sum().alias("total_us"),
            pl.col("dur_us").mean().alias("mean_us"),
            pl.col("dur_us").max().alias("max_us"),
        )
        .cast(SYNCS_SCHEMA)
        .sort(["total_us", "name"], descending=[True, False])
    )


def sync_per_step(events: pl.DataFrame, index: TraceIndex, steps: Steps) -> pl.DataFrame:
    frame = steps.frame
    if frame.height == 0:
        return pl.DataFrame(schema=SYNC_PER_STEP_SCHEMA)
    blocked = merged_role(index, "sync")
    queries = covered_between(blocked, frame.select("step", "start_us", "end_us"), "sync_us")
    starts = (
        blocked.select(pl.col("start_us").alias("_b"))
        .sort("_b")
        .join_asof(
            frame.select("step", "start_us", "end_us").sort("start_us"),
            left_on="_b",
            right_on="start_us",
            strategy="backward",
        )
        .filter(pl.col("_b") < pl.col("end_us"))
        .group_by("step")
        .agg(pl.len().alias("sync_count"))
    )
    return (
        queries.join(starts, on="step", how="left")
        .with_columns(pl.col("sync_count").fill_null(0))
        .select(list(SYNC_PER_STEP_SCHEMA))
        .cast(SYNC_PER_STEP_SCHEMA)
        .sort("step")
    )
