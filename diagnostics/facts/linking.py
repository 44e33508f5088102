"""Kernel ↔ runtime call ↔ operator links, built once per trace and shared by the facts.

GPU work links to the host call that launched it by ``args.correlation`` (an equi-join).
The runtime call links to the operator it ran in by time: the *innermost* ``cpu_op`` on the
same thread that contains it. ``External id`` is not used: on modern traces a runtime call's
External id is its own correlation, not its operator's id (why torch-tb-profiler reports
zero device time per operator on them).

Finding the innermost enclosing operator without a per-event loop: operators on one thread
nest properly, so a sweep over their starts (+1) and ends (-1), sorted by time with ends
first, gives each operator its depth (the number of operators open right after it starts).
At any instant t the number of open operators c(t) is the sweep's running sum at t, and the
innermost open operator is the latest-starting operator of depth c(t) that started at or
before t (any later operator of that depth would have closed the earlier one's slot). Two
as-of joins do it: one for c(t), one for the operator. A link is kept only if the operator
really contains the call, so malformed nesting cannot produce a wrong link, only a missing one.

The compiled pass (diagnostics.facts.nesting) gives the same depths, parents and links in one walk per
thread with a heap of open operators' ends, where the sweep's sorts and joins cost 0.7 s of
the 1 GB trace's index; the sweep below is the reference, and runs where that module is not
built or declines its input (nulls, rows out of time order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from diagnostics.facts import selectors as sel
from diagnostics.facts.nesting import NESTING_KEYS, compiled_nesting


@dataclass(frozen=True)
class TraceIndex:
    # one row per GPU event: gpu_id, name, cat, device, stream, start_us, end_us, dur_us,
    # correlation, bytes, blocks_per_sm, occupancy_pct, and the launching call (rt_id, rt_name, rt_start_us, rt_end_us,
    # rt_dur_us, rt_pid, rt_tid, op_id; nulls when unlinked)
    gpu: pl.DataFrame
    # one row per runtime/driver call: rt_id, name, pid, tid, start_us, end_us, dur_us,
    # correlation, op_id (innermost enclosing cpu_op, null when none)
    runtime: pl.DataFrame
    # one row per operator (cpu_op except ProfilerStep): op_id, name, pid, tid, start_us,
    # end_us, dur_us, input_shapes, input_types, concrete_inputs, sequence_number,
    # depth (1 = outermost; 0 for zero-length ops), parent_id
    ops: pl.DataFrame
    # host ranges: every cpu_op and user_annotation duration event (steps included): name,
    # cat, start_us, end_us
    host: pl.DataFrame
    # memo of derived frames shared between facts (facts.roles), filled on first use
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


_OP_ARGS = ("input_types", "concrete_inputs", "sequence_number")


def gpu_events(events: pl.DataFrame) -> pl.DataFrame:
    return sel.select_where(
        events,
        sel.GPU_WORK,
        "name",
        "cat",
        sel.GPU_DEVICE,
        pl.coalesce(pl.col("stream"), pl.col("tid")).alias("stream"),
        pl.col("ts").alias("start_us"),
        sel.END_US,
        pl.col("dur").alias("dur_us"),
        "correlation",
        "bytes",
        "blocks_per_sm",
        "occupancy_pct",
        # what a collective kernel was (facts.comms keeps them per collective)
        "collective_name",
        "in_msg_nelems",
        "process_group_name",
        "process_group_ranks",
    ).with_row_index("gpu_id")


def runtime_calls(events: pl.DataFrame) -> pl.DataFrame:
    return sel.select_where(
        events,
        sel.RUNTIME & sel.DURATION & pl.col("dur").is_not_null(),
        "name",
        "cat",
        "pid",
        "tid",
        pl.col("ts").alias("start_us"),
        sel.END_US,
        pl.col("dur").alias("dur_us"),
        "correlation",
    ).with_row_index("rt_id")


def _operators(events: pl.DataFrame) -> pl.DataFrame:
    return sel.select_where(
        events,
        sel.CPU_OP
        & sel.DURATION
        & pl.col("dur").is_not_null()
        & ~pl.col("name").str.starts_with(sel.STEP_PREFIX),
        "name",
        "pid",
        "tid",
        pl.col("ts").alias("start_us"),
        sel.END_US,
        pl.col("dur").alias("dur_us"),
        "input_shapes",
        # the rest of what record_shapes writes, for facts.flops
        *(c for c in _OP_ARGS if c in events.columns),
    ).with_row_index("op_id")


def _tree_and_sweep(ops: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The operators with depth and parent by the sweep and an as-of join, and the sweep."""
    sweep = _sweep(ops)
    if ops.height == 0:
        empty = ops.with_columns(depth=pl.lit(0, pl.Int64), parent_id=pl.lit(None, pl.UInt32))
        return empty, sweep
    # op_id is the row number: each operator's depth and parent are set by position, where a
    # join would copy every column of the operators (names and shapes included)
    opened = sweep.filter(pl.col("_kind") == 1)
    ops = ops.with_columns(
        pl.zeros(ops.height, pl.Int64, eager=True)
        .scatter(opened.get_column("op_id"), opened.get_column("_open"))
        .alias("depth")
    )
    # The parent of an operator at depth d is the innermost operator open at its start
    # among depth d - 1: the latest such one that started no later than it.
    candidates = ops.filter(pl.col("depth") > 0).select(
        "pid",
        "tid",
        pl.col("depth").alias("_d"),
        pl.col("start_us").alias("_p_start"),
        pl.col("end_us").alias("_p_end"),
        pl.col("op_id").alias("parent_id"),
    )
    children = ops.filter(pl.col("depth") > 1).select(
        "op_id", "pid", "tid", "start_us", "end_us", (pl.col("depth") - 1).alias("_d")
    )
    parents = (
        in_time_order(children, "start_us")
        .join_asof(
            in_time_order(candidates, "_p_start"),
            left_on="start_us",
            right_on="_p_start",
            by=["pid", "tid", "_d"],
            strategy="backward",
            check_sortedness=False,
        )
        .filter(pl.col("_p_end") >= pl.col("end_us"))
        .select("op_id", "parent_id")
    )
    parent_id = (
        pl.Series("parent_id", [None], dtype=pl.UInt32)
        .new_from_index(0, ops.height)
        .scatter(parents.get_column("op_id"), parents.get_column("parent_id"))
    )
    return ops.with_columns(parent_id), sweep


def in_time_order(frame: pl.DataFrame, column: str) -> pl.DataFrame:
    """``frame`` sorted by ``column``; as it is, without a copy, when already in that order
    (rows taken from the event table, which is in time order, always are)."""
    return frame if frame.get_column(column).is_sorted() else frame.sort(column)


def _sweep(ops: pl.DataFrame) -> pl.DataFrame:
    """Start (+1) and end (-1) rows of the non-zero-length operators, with the running count
    of open operators per thread. At equal times ends come first (adjacent operators are
    siblings); among starts the longer opens first, among ends the later-started closes
    first, so identical ranges nest in file order.

    Those tie-breaks are laid out before the sort, so that the sort itself is a stable one
    by thread and time (a sort by six keys took 0.45 s of the 1 GB trace's 2.9 M rows): the
    ends in reverse file order (operators are in time order, ``op_id`` their row), then the
    starts longest first.
    """
    spans = ops.filter(pl.col("end_us") > pl.col("start_us"))
    if not (spans.get_column("start_us").is_sorted() and spans.get_column("op_id").is_sorted()):
        spans = spans.sort(["start_us", "op_id"])
    ends = spans.select(
        "op_id", "pid", "tid", pl.col("end_us").alias("_t"), pl.lit(0, pl.Int8).alias("_kind")
    ).reverse()
    starts = spans.sort("end_us", descending=True, maintain_order=True).select(
        "op_id", "pid", "tid", pl.col("start_us").alias("_t"), pl.lit(1, pl.Int8).alias("_kind")
    )
    rows = pl.concat([ends, starts])
    # each thread's rows together, in time order (tie-breaks kept): one stable sort of one
    # float key per thread, where polars' sort by several keys is several times slower
    by_thread = rows.partition_by(["pid", "tid"], maintain_order=True)
    if by_thread:
        rows = pl.concat([part.sort("_t", maintain_order=True) for part in by_thread])
    return (
        rows
        # Every operator opens and closes, so each thread's count returns to zero before
        # the next thread's rows begin: one running sum serves all threads.
        .with_columns(_open=(pl.col("_kind").cast(pl.Int64) * 2 - 1).cum_sum())
    )


def innermost_operator(
    calls: pl.DataFrame,
    ops: pl.DataFrame,
    *,
    id_col: str = "rt_id",
    sweep: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """``id_col`` -> op_id of the innermost operator on the same thread containing the call
    (calls: id_col, pid, tid, start_us, end_us). Calls outside every operator get null."""
    if calls.height == 0 or ops.height == 0:
        return calls.select(id_col).with_columns(op_id=pl.lit(None, pl.UInt32))
    if sweep is None:
        keyed = calls.select(id_col, *NESTING_KEYS)
        ordered = in_time_order(keyed, "start_us")  # each call's link is its own: any order
        nested = compiled_nesting(ops, ordered)
        if nested is not None:
            linked = ordered.select(id_col).with_columns(nested[2])
            if ordered is keyed:
                return linked
            return calls.select(id_col).join(linked, on=id_col, how="left")
    # The sweep is in time order within each thread, all an as-of join by thread needs.
    sweep = (_sweep(ops) if sweep is None else sweep).select("pid", "tid", "_t", "_open")
    open_at = (
        in_time_order(calls.select(id_col, "pid", "tid", "start_us", "end_us"), "start_us")
        .join_asof(
            sweep,
            left_on="start_us",
            right_on="_t",
            by=["pid", "tid"],
            strategy="backward",
            check_sortedness=False,
        )
        .filter(pl.col("_open") > 0)
    )
    candidates = ops.filter(pl.col("depth") > 0).select(
        "pid",
        "tid",
        pl.col("depth").alias("_open"),
        pl.col("start_us").alias("_o_start"),
        pl.col("end_us").alias("_o_end"),
        "op_id",
    )
    linked = (
        open_at.join_asof(  # in the calls' order, which is by start
            in_time_order(candidates, "_o_start"),
            left_on="start_us",
            right_on="_o_start",
            by=["pid", "tid", "_open"],
            strategy="backward",
            check_sortedness=False,
        )
        .filter(pl.col("_o_end") >= pl.col("end_us"))
        .select(id_col, "op_id")
    )
    return calls.select(id_col).join(linked, on=id_col, how="left")


def build_index(events: pl.DataFrame) -> TraceIndex:
    ops = _operators(events)
    runtime = runtime_calls(events)
    nested = compiled_nesting(ops, runtime) if ops.height else None
    if nested is not None:
        depth, parent_id, op_id = nested
        ops = ops.with_columns(depth, parent_id)
        runtime = runtime.with_columns(op_id)
    else:
        ops, sweep = _tree_and_sweep(ops)
        runtime = runtime.join(
            innermost_operator(runtime, ops, sweep=sweep), on="rt_id", how="left"
        )
    # One launching call per correlation id; a runtime call wins over a driver call.
    launchers = (
        runtime.filter(pl.col("correlation").is_not_null())
        .sort(["correlation", pl.col("cat") != "cuda_runtime", "rt_id"])
        .unique(subset="correlation", keep="first", maintain_order=True)
        .select(
            "correlation",
            "rt_id",
            pl.col("name").alias("rt_name"),
            pl.col("start_us").alias("rt_start_us"),
            pl.col("end_us").alias("rt_end_us"),
            pl.col("dur_us").alias("rt_dur_us"),
            pl.col("pid").alias("rt_pid"),
            pl.col("tid").alias("rt_tid"),
            "op_id",
        )
    )
    gpu = gpu_events(events).join(launchers, on="correlation", how="left")
    host = sel.select_where(
        events,
        (sel.CPU_OP | sel.ANNOTATION) & sel.DURATION & pl.col("dur").is_not_null(),
        "name",
        "cat",
        pl.col("ts").alias("start_us"),
        sel.END_US,
    )
    return TraceIndex(gpu=gpu, runtime=runtime, ops=ops, host=host)
