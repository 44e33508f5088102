"""Timeline: one step of the trace as lanes (CPU threads, GPU streams), ready to draw.

A 50 MB trace holds ~10^5 events per step, far more than a browser can draw as shapes. So
events are merged, per lane and kind, into segments: consecutive events closer than
``tolerance_us`` (about one pixel of the chart's width) become one segment that carries how
many events it holds, their busy time, and the longest event's name. If that still leaves
more than ``max_segments``, the tolerance grows until it does not. Nothing visible is lost:
two events less than a pixel apart are one bar on screen anyway.

Idle gaps are per GPU: the stretches of the step when none of its streams ran anything,
longer than HTA's kernel-wait threshold (shorter gaps are launch overhead) and than a pixel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from diagnostics.facts import selectors as sel
from diagnostics.facts.comm_families import COMM_KERNEL_NAME, HOST_COLLECTIVE_NAME

# Width of the drawing in pixels that the default tolerance is derived from.
PIXELS = 1500
MAX_SEGMENTS = 6000
KINDS: tuple[str, ...] = (
    "operator",
    "dataloader",
    "runtime",
    "kernel",
    "collective",
    "memcpy",
    "memset",
    "sync",
)
SEGMENT_SCHEMA: dict[str, pl.DataType] = {
    "lane": pl.String,
    "kind": pl.String,
    "start_ms": pl.Float64,  # since the step's start
    "end_ms": pl.Float64,
    "events": pl.UInt32,
    "busy_ms": pl.Float64,  # summed duration of the merged events (nested ones overlap)
    "label": pl.String,  # the longest merged event's name
}
GAP_SCHEMA: dict[str, pl.DataType] = {
    "lane": pl.String,
    "start_ms": pl.Float64,
    "end_ms": pl.Float64,
}


@dataclass(frozen=True)
class Timeline:
    step: int
    start_us: float  # absolute, as in the event table
    end_us: float
    lanes: tuple[str, ...]  # top to bottom
    segments: pl.DataFrame  # SEGMENT_SCHEMA
    gaps: pl.DataFrame  # GAP_SCHEMA: GPU idle, on each GPU's "idle" lane
    events: int  # events of the step before merging
    tolerance_us: float

    @property
    def span_ms(self) -> float:
        return (self.end_us - self.start_us) / 1000.0


def step_window(steps: pl.DataFrame, step: int) -> tuple[float, float]:
    """(start_us, end_us) of a profiler step: its host range and the GPU work it launched."""
    row = steps.filter(pl.col("step") == step)
    if row.height == 0:
        raise ValueError(f"step {step} is not in the trace (steps: {steps['step'].to_list()})")
    r = row.row(0, named=True)
    starts = [v for v in (r.get("start_us"), r.get("host_start_us")) if v is not None]
    ends = [v for v in (r.get("end_us"), r.get("host_end_us")) if v is not None]
    return float(min(starts)), float(max(ends))


def _kind() -> pl.Expr:
    cat = pl.col("cat")
    return (
        pl.when(cat == "kernel")
        .then(pl.when(COMM_KERNEL_NAME).then(pl.lit("collective")).otherwise(pl.lit("kernel")))
        .when(cat == "gpu_memcpy")
        .then(pl.lit("memcpy"))
        .when(cat == "gpu_memset")
        .then(pl.lit("memset"))
        .when(cat == "cuda_sync")
        .then(pl.lit("sync"))
        .when(sel.RUNTIME)
        .then(pl.lit("runtime"))
        .when(sel.DATALOADER_NAME)
        .then(pl.lit("dataloader"))
        .when(HOST_COLLECTIVE_NAME)
        .then(pl.lit("collective"))
        .otherwise(pl.lit("operator"))
    )


def _lane_events(events: pl.DataFrame, start_us: float, end_us: float) -> pl.DataFrame:
    gpu = sel.GPU_CATS | (pl.col("cat") == "cuda_sync")
    host = sel.CPU_OP | sel.ANNOTATION | sel.RUNTIME
    frame = events.filter(
        sel.DURATION
        & pl.col("dur").is_not_null()
        & (gpu | host)
        & ~pl.col("name").str.starts_with(sel.STEP_PREFIX)
        & (pl.col("ts") < end_us)
        & (pl.col("ts") + pl.col("dur") > start_us)
    )
    return frame.select(
        "name",
        _kind().alias("kind"),
        gpu.alias("is_gpu"),
        pl.when(gpu).then(sel.GPU_DEVICE).otherwise(pl.col("pid")).alias("a"),
        pl.when(gpu).then(pl.coalesce("stream", "tid")).otherwise(pl.col("tid")).alias("b"),
        pl.col("ts").clip(lower_bound=start_us).alias("s"),
        (pl.col("ts") + pl.col("dur")).clip(upper_bound=end_us).alias("e"),
        pl.col("dur"),
    ).with_columns(pl.col("a").fill_null(-1), pl.col("b").fill_null(-1))


def _merge(frame: pl.DataFrame, keys: list[str], tolerance_us: float) -> pl.DataFrame:
    """Runs of intervals (per keys) whose gaps are at most tolerance_us, as one row each."""
    ordered = frame.sort([*keys, "s"])
    reach = pl.col("e").cum_max().shift(1).over(keys)
    return (
        ordered.with_columns(
            _run=(reach.is_null() | (pl.col("s") > reach + tolerance_us)).cum_sum().over(keys)
        )
        .group_by([*keys, "_run"])
        .agg(
            pl.col("s").min(),
            pl.col("e").max(),
            pl.len().alias("events"),
            pl.col("dur").sum().alias("busy_us"),
            pl.col("name").sort_by("dur", descending=True).first().alias("label"),
        )
        .drop("_run")
    )


def _thread_label(name: str | None, tid: int) -> str:
    """The thread's name with its id once: Kineto names threads "thread 783658 (python3.8)"
    already, other writers just "python"."""
    name = (name or "").strip()
    if not name:
        return f"thread {tid}"
    if re.search(rf"(?<!\d){tid}(?!\d)", name):
        return name
    return f"{name} ({tid})"


def _lane_names(lanes: pl.DataFrame, thread_names: dict[tuple[int, int], str]) -> pl.DataFrame:
    labels = []
    for is_gpu, a, b in lanes.select("is_gpu", "a", "b").iter_rows():
        if is_gpu:
            labels.append(f"GPU {a} · stream {b}")
        else:
            labels.append(f"CPU · {_thread_label(thread_names.get((a, b)), b)}")
    return lanes.with_columns(pl.Series("lane", labels, dtype=pl.String))


def step_timeline(
    events: pl.DataFrame,
    steps: pl.DataFrame,
    step: int,
    *,
    thread_names: dict[tuple[int, int], str] | None = None,
    max_segments: int = MAX_SEGMENTS,
    pixels: int = PIXELS,
) -> Timeline:
    """The lanes and merged segments of one profiler step (see the module docstring)."""
    start_us, end_us = step_window(steps, step)
    frame = _lane_events(events, start_us, end_us)
    span_us = max(end_us - start_us, 1e-3)
    tolerance_us = span_us / pixels
    keys = ["is_gpu", "a", "b", "kind"]
    merged = _merge(frame, keys, tolerance_us)
    while merged.height > max_segments:
        tolerance_us *= 4
        merged = _merge(frame, keys, tolerance_us)
    lanes = _lane_names(
        frame.select("is_gpu", "a", "b").unique().sort("is_gpu", "a", "b"), thread_names or {}
    )
    gaps = _gpu_gaps(frame, start_us, end_us, max(sel.KERNEL_WAIT_MAX_US, 2 * span_us / pixels))
    lane_order = []
    for is_gpu, a, label in lanes.select("is_gpu", "a", "lane").iter_rows():
        lane_order.append(label)
        next_rows = lanes.filter(pl.col("is_gpu") & (pl.col("a") == a))
        if is_gpu and label == next_rows["lane"][-1]:
            lane_order.append(f"GPU {a} · idle")
    segments = (
        merged.join(lanes, on=["is_gpu", "a", "b"], how="left")
        .select(
            "lane",
            "kind",
            ((pl.col("s") - start_us) / 1000.0).alias("start_ms"),
            ((pl.col("e") - start_us) / 1000.0).alias("end_ms"),
            "events",
            (pl.col("busy_us") / 1000.0).alias("busy_ms"),
            "label",
        )
        .cast(SEGMENT_SCHEMA)
        .sort("lane", "start_ms")
    )
    return Timeline(
        step=step,
        start_us=start_us,
        end_us=end_us,
        lanes=tuple(lane_order),
        segments=segments,
        gaps=gaps.select(
            pl.format("GPU {} · idle", "a").alias("lane"),
            ((pl.col("s") - start_us) / 1000.0).alias("start_ms"),
            ((pl.col("e") - start_us) / 1000.0).alias("end_ms"),
        ).cast(GAP_SCHEMA),
        events=frame.height,
        tolerance_us=tolerance_us,
    )


def _gpu_gaps(
    frame: pl.DataFrame, start_us: float, end_us: float, min_gap_us: float
) -> pl.DataFrame:
    """a (device), s, e: stretches in [start, end] when the device ran nothing."""
    busy = _merge(
        frame.filter(pl.col("is_gpu")).with_columns(pl.lit(0).alias("k")), ["a", "k"], 0.0
    )
    if busy.height == 0:
        return pl.DataFrame(schema={"a": pl.Int64, "s": pl.Float64, "e": pl.Float64})
    busy = busy.sort("a", "s")
    gaps = busy.select(
        "a",
        pl.col("e").shift(1).over("a").fill_null(start_us).alias("s"),
        pl.col("s").alias("e"),
    )
    tails = busy.group_by("a").agg(pl.col("e").max().alias("s")).with_columns(e=pl.lit(end_us))
    return (
        pl.concat([gaps, tails.select("a", "s", "e")], how="vertical_relaxed")
        .filter(pl.col("e") - pl.col("s") >= min_gap_us)
        .sort("a", "s")
    )
