"""GPU idle gaps inside the profiled steps, with their cause and what the host did meanwhile.

Gaps are taken per device on the union of the kernel, memcpy and memset ranges launched in
the steps (gpu.py says which work counts) over all streams,
so a gap is time when the device ran nothing at all, and the gaps of a device add up to
span - busy_us (HTA takes gaps per stream; there a stream can be idle while another runs).
Each gap is classified as HTA's idle-time breakdown does, from the GPU event that ends it:

- host_wait: the runtime call that launched it started after the gap began, so the GPU
  waited for the host to enqueue work;
- kernel_wait: otherwise, a gap under 30 µs (launch overhead between back-to-back work);
- other: otherwise (queued work waited on something else: a dependency, a sync, ...).

Beyond HTA, ``host_activity`` says what the host was doing during the gap, by time share of
the host ranges overlapping it, with priority dataloader (the DataLoader's __next__) >
sync (a synchronising call: cudaStreamSynchronize, aten::item, ...) > pageable_copy (a copy
call whose GPU copy is to or from pageable memory) > cpu_ops (any other operator); each
instant counts once for the highest-priority activity covering it, the activity with the most
time wins, and ``none`` when the host ran nothing either (e.g. Python outside operators).
The µs of each are in the frame too.
"""

from __future__ import annotations

import polars as pl

from diagnostics.facts import selectors as sel
from diagnostics.facts.gpu import busy_intervals, launched_in_steps
from diagnostics.facts.intervals import covered_between
from diagnostics.facts.linking import TraceIndex
from diagnostics.facts.roles import prefix_unions
from diagnostics.facts.steps import Steps

ACTIVITIES: tuple[str, ...] = ("dataloader", "sync", "pageable_copy", "cpu_ops")
IDLE_SCHEMA: dict[str, pl.DataType] = {
    "device": pl.Int64,
    "stream": pl.Int64,
    "start_us": pl.Float64,
    "end_us": pl.Float64,
    "dur_us": pl.Float64,
    "idle_kind": pl.String,
    "host_activity": pl.String,
    **{f"{name}_us": pl.Float64 for name in ACTIVITIES},
    "step": pl.Int64,
}


def idle_gaps(events: pl.DataFrame, index: TraceIndex, steps: Steps) -> pl.DataFrame:
    """device, stream, start_us, end_us, dur_us, idle_kind, host_activity, dataloader_us,
    sync_us, pageable_copy_us, cpu_ops_us, step (the step the gap starts in)."""
    span = steps.span
    if span is None or index.gpu.height == 0:
        return pl.DataFrame(schema=IDLE_SCHEMA)
    lo, hi = span
    # the same GPU work busy_us counts (launched in the steps), so gaps = span - busy_us
    busy = busy_intervals(index, steps)
    # The GPU event that opens each busy range (the earliest-starting one) ends the gap
    # before it; its launching call decides host_wait (of two starting together, the one
    # launched first).
    first_events = (
        launched_in_steps(index, steps)
        .sort(["start_us", "rt_start_us"], nulls_last=True)
        .select("device", "start_us", "stream", "rt_start_us")
        .unique(subset=["device", "start_us"], keep="first")
    )
    busy = busy.join(first_events, on=["device", "start_us"], how="left")
    gaps = busy.sort(["device", "start_us"]).select(
        "device",
        "stream",
        pl.col("end_us").shift(1).over("device").alias("prev_end_us"),
        pl.col("start_us").alias("next_start_us"),
        "rt_start_us",
    )
    # The tail: after the device's last busy range up to the end of the steps.
    # A device whose work all lies outside the steps is idle for the whole span.
    devices = index.gpu.select(pl.col("device").unique()).filter(pl.col("device").is_not_null())
    tails = devices.join(
        busy.group_by("device").agg(pl.col("end_us").max().alias("prev_end_us")),
        on="device",
        how="left",
    ).with_columns(pl.col("prev_end_us").fill_null(float("-inf")))
    tails = tails.filter(pl.col("prev_end_us") < hi).select(
        "device",
        pl.lit(None, pl.Int64).alias("stream"),
        "prev_end_us",
        pl.lit(None, pl.Float64).alias("next_start_us"),
        pl.lit(None, pl.Float64).alias("rt_start_us"),
    )
    gaps = pl.concat([gaps, tails], how="vertical_relaxed").with_columns(
        pl.col("prev_end_us").fill_null(float("-inf")),
        pl.col("next_start_us").fill_null(float("inf")),
    )
    raw_dur = pl.col("next_start_us") - pl.col("prev_end_us")
    gaps = (
        gaps.with_columns(
            pl.col("prev_end_us").clip(lower_bound=lo).alias("start_us"),
            pl.col("next_start_us").clip(upper_bound=hi).alias("end_us"),
            # Compared with the gap's start inside the steps, so a first gap (no earlier GPU
            # work) still counts as host_wait when its work was launched late.
            pl.when(pl.col("rt_start_us") > pl.col("prev_end_us").clip(lower_bound=lo))
            .then(pl.lit("host_wait"))
            .when(raw_dur < sel.KERNEL_WAIT_MAX_US)
            .then(pl.lit("kernel_wait"))
            .otherwise(pl.lit("other"))
            .alias("idle_kind"),
        )
        .filter(pl.col("end_us") > pl.col("start_us"))
        .with_columns((pl.col("end_us") - pl.col("start_us")).alias("dur_us"))
    )
    gaps = _host_activity(index, gaps)
    step_of = steps.frame.select(pl.col("step"), pl.col("start_us").alias("_s_start")).sort(
        "_s_start"
    )
    gaps = gaps.sort("start_us").join_asof(
        step_of, left_on="start_us", right_on="_s_start", strategy="backward"
    )
    return gaps.select(list(IDLE_SCHEMA)).cast(IDLE_SCHEMA).sort(["device", "start_us"])


def _host_activity(index: TraceIndex, gaps: pl.DataFrame) -> pl.DataFrame:
    roles = {
        "dataloader": "dataloader",
        "sync": "sync",
        "pageable_copy": "pageable_copy",
        "cpu_ops": "host_exec",
    }
    unions = prefix_unions(index, tuple(roles[name] for name in ACTIVITIES))
    previous = None
    for name, union in zip(ACTIVITIES, unions, strict=True):
        gaps = covered_between(union, gaps, f"_cov_{name}")
        exclusive = pl.col(f"_cov_{name}")
        if previous is not None:
            exclusive = exclusive - pl.col(f"_cov_{previous}")
        gaps = gaps.with_columns(exclusive.alias(f"{name}_us"))
        previous = name
    shares = [pl.col(f"{name}_us") for name in ACTIVITIES]
    best = pl.max_horizontal(shares)
    # The first activity (in priority order) holding the largest share.
    choice = pl.when(best <= 0).then(pl.lit("none"))
    for name in ACTIVITIES:
        choice = choice.when(pl.col(f"{name}_us") >= best).then(pl.lit(name))
    return gaps.with_columns(choice.otherwise(pl.lit("none")).alias("host_activity")).drop(
        [f"_cov_{name}" for name in ACTIVITIES]
    )


def idle_breakdown_pct(gaps: pl.DataFrame) -> dict[str, float] | None:
    """Share of idle time by idle_kind, % (host_wait, kernel_wait, other)."""
    total = float(gaps["dur_us"].sum()) if gaps.height else 0.0
    if total <= 0:
        return None
    sums = dict(gaps.group_by("idle_kind").agg(pl.col("dur_us").sum()).iter_rows())
    return {
        kind: float(sums.get(kind, 0.0)) / total * 100.0
        for kind in ("host_wait", "kernel_wait", "other")
    }
