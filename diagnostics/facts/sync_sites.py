"""Where in the user's code the host syncs: each blocked stretch inside the profiled steps,
named by the innermost user frame around it (facts/python_stacks.py), summed by site.

A blocked stretch is the union of the sync calls on one thread (facts/syncs.py lists them):
``aten::item`` around ``aten::_local_scalar_dense`` around ``cudaStreamSynchronize`` is one
call of ``.item()``, counted once, under its outermost (longest) call's name, ``op``. It
belongs to the step it starts in. A stretch with no user frame around it (a sync inside
library code called from nowhere the trace shows) is kept as a row with null file, so that
the sites' blocked time still adds up to the steps'.

No python_function events in the trace (recorded without ``with_stack=True``): None, since
no site can be named.
"""

from __future__ import annotations

import polars as pl

from diagnostics.facts.intervals import merge_intervals
from diagnostics.facts.linking import TraceIndex
from diagnostics.facts.python_stacks import has_python_stacks, innermost_user_frame, user_frames
from diagnostics.facts.steps import Steps
from diagnostics.facts.syncs import sync_calls

SYNC_SITES_SCHEMA: dict[str, pl.DataType] = {
    "frame": pl.String,  # the python_function name as recorded: "train.py(37): train_step"
    "file": pl.String,  # as recorded (relative to its sys.path entry, or absolute)
    "line": pl.Int64,
    "function": pl.String,
    "op": pl.String,  # the outermost sync call with most blocked time at this site
    "calls": pl.UInt32,  # blocked stretches in the steps
    "blocked_us": pl.Float64,
    "calls_per_step": pl.Float64,
    "blocked_us_per_step": pl.Float64,
}


def blocked_stretches(calls: pl.DataFrame) -> pl.DataFrame:
    """call_id, pid, tid, start_us, end_us, op: the union of ``calls`` per thread, each
    stretch named by its longest call."""
    by = ["pid", "tid"]
    keyed = calls.with_columns(pl.col("pid").fill_null(-1), pl.col("tid").fill_null(-1))
    merged = merge_intervals(keyed, by=by).sort([*by, "start_us"]).with_row_index("call_id")
    named = (
        keyed.sort("start_us")
        .join_asof(
            merged.select("call_id", *by, pl.col("start_us").alias("_s")).sort("_s"),
            left_on="start_us",
            right_on="_s",
            by=by,
            strategy="backward",
            check_sortedness=False,  # sorted by start; polars cannot check it within groups
        )
        .sort(["call_id", "dur_us", "name"], descending=[False, True, False])
        .unique(subset="call_id", keep="first")
        .select("call_id", pl.col("name").alias("op"))
    )
    return merged.join(named, on="call_id", how="left")


def sync_sites(events: pl.DataFrame, index: TraceIndex, steps: Steps) -> pl.DataFrame | None:
    """One row per (file, line, function) of user code that synced inside the steps
    (SYNC_SITES_SCHEMA), most blocked first; None when the trace has no Python stacks."""
    if not has_python_stacks(events):
        return None
    frame = steps.frame
    calls = sync_calls(events, index)
    if frame.height == 0 or calls.height == 0:
        return pl.DataFrame(schema=SYNC_SITES_SCHEMA)
    stretches = blocked_stretches(calls)
    in_steps = (
        stretches.sort("start_us")
        .join_asof(
            frame.select("step", pl.col("start_us").alias("_step_start"), "end_us")
            .rename({"end_us": "_step_end"})
            .sort("_step_start"),
            left_on="start_us",
            right_on="_step_start",
            strategy="backward",
        )
        .filter(pl.col("start_us") < pl.col("_step_end"))
    )
    if in_steps.height == 0:
        return pl.DataFrame(schema=SYNC_SITES_SCHEMA)
    located = innermost_user_frame(in_steps, user_frames(events)).with_columns(
        (pl.col("end_us") - pl.col("start_us")).alias("_blocked")
    )
    site = ["frame", "file", "line", "function"]
    per_op = located.group_by([*site, "op"]).agg(pl.col("_blocked").sum().alias("_op_us"))
    top_op = (
        per_op.sort(["_op_us", "op"], descending=[True, False])
        .unique(subset=site, keep="first", maintain_order=True)
        .select(*site, "op")
    )
    n_steps = frame.height
    return (
        located.group_by(site)
        .agg(pl.len().alias("calls"), pl.col("_blocked").sum().alias("blocked_us"))
        .join(top_op, on=site, how="left", nulls_equal=True)
        .with_columns(
            (pl.col("calls") / n_steps).alias("calls_per_step"),
            (pl.col("blocked_us") / n_steps).alias("blocked_us_per_step"),
        )
        .select(list(SYNC_SITES_SCHEMA))
        .cast(SYNC_SITES_SCHEMA)
        .sort(["blocked_us", "frame"], descending=[True, False], nulls_last=True)
    )
