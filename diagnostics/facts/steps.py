"""Profiler steps: ``ProfilerStep#N`` host ranges, extended to the GPU work they launched.

Method (torch-tb-profiler 0.4.3, event_parser.py ``_find_device_steps`` and
``_update_steps_duration``), vectorised:

1. A runtime call belongs to step i when it lies wholly inside the step's host range.
   The GPU events it launched (same correlation id) are that step's device work.
2. When any step launched GPU work, steps move to the device clock: the first step starts no
   earlier than the end of GPU work launched before it (outside every step) that finished
   before step 0's first device event; each step ends at max(host end, end of its device
   work) and the next starts at max(its host start, that end). Because every end is at least
   its start, end_i = running max of max(host end, device end) (seeded with that first
   start) and start_i = max(host start_i, end_{i-1}): a cumulative max, no loop.
3. Trailing steps that launched nothing are dropped, and so is the last one if it launched
   fewer than 80% of its predecessor's GPU events (the profiler cut it short).

Before that, the host ranges are checked, because a wrong range is a confident wrong answer
(twice the steps at half the time, or a p95 far too high):

* The same ``ProfilerStep#N`` twice on one thread with the same range (within 1 µs or 1% of
  its length) is one step written twice: the copies are dropped, with a warning. A step on
  the GPU timeline (``gpu_user_annotation``, current PyTorch) is not a host range and never
  counts as a copy.
* Steps run one after another, so a range that reaches past the next step's start is cut
  there, with a warning naming the steps and the steps used.

No host ``ProfilerStep#`` at all: one window stands in for the steps, with
``steps_inferred`` set and a warning naming it. As TraceLens measures such traces, the
window is the GPU-side ``ProfilerStep#N`` ranges (``gpu_user_annotation``: one step each)
where the trace has them, else first to last GPU activity (a GPU trace without step
markers: an inference trace, a benchmark), else the host span (operators and annotations,
else every event) of a CPU-only trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from diagnostics.facts import selectors as sel
from diagnostics.facts.linking import TraceIndex, build_index

STEPS_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64,
    "start_us": pl.Float64,
    "end_us": pl.Float64,
    "dur_us": pl.Float64,
    "host_start_us": pl.Float64,
    "host_end_us": pl.Float64,
    "gpu_events": pl.UInt32,  # GPU events launched by runtime calls inside the host range
}


@dataclass(frozen=True)
class Steps:
    # step, start_us, end_us, dur_us, host_start_us, host_end_us, gpu_events
    frame: pl.DataFrame
    inferred: bool
    warnings: tuple[str, ...] = ()
    # when inferred: what stands in for the steps (an INFERRED_FROM_* phrase), else None
    inferred_from: str | None = None

    @property
    def on_device_clock(self) -> bool:
        """True when the steps are windows read off the GPU timeline (no host steps)."""
        return self.inferred_from in (INFERRED_FROM_GPU_STEPS, INFERRED_FROM_GPU_ACTIVITY)

    @property
    def span(self) -> tuple[float, float] | None:
        if self.frame.height == 0:
            return None
        return float(self.frame["start_us"].min()), float(self.frame["end_us"].max())


# Two ranges of one step number on one thread are one step written twice when both ends
# agree within this many µs, or this share of the step's length if larger.
DUPLICATE_TOLERANCE_US = 1.0
DUPLICATE_TOLERANCE_SHARE = 0.01
# Overlaps up to this long are clock rounding (ns-resolution floats), not a defect.
OVERLAP_TOLERANCE_US = 1.0


def host_steps(events: pl.DataFrame) -> pl.DataFrame:
    """step, host_start_us, host_end_us of every ProfilerStep#N, in time order (as written)."""
    return _host_ranges(events).drop("pid", "tid", "name")


# "ProfilerStep#abc", or a number past int64: the range is a step all the same, its number
# unknown (null), and find_steps says so
STEP_NUMBER = (
    pl.col("name")
    .str.strip_prefix(sel.STEP_PREFIX)
    .str.extract(r"^(\d+)")
    .cast(pl.Int64, strict=False)
    .alias("step")
)


def _host_ranges(events: pl.DataFrame) -> pl.DataFrame:
    return sel.select_where(
        events,
        sel.STEP & pl.col("dur").is_not_null(),
        STEP_NUMBER,
        pl.col("ts").alias("host_start_us"),
        sel.END_US.alias("host_end_us"),
        "pid",
        "tid",
        "name",
    ).sort("host_start_us", maintain_order=True)


def _step_list(steps: list[int | None]) -> str:
    shown = [f"#{s}" for s in steps[:8]]
    return ", ".join(shown) + (f" and {len(steps) - 8} more" if len(steps) > 8 else "")


def _without_duplicates(host: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """Drops second copies of one step's range on one thread (see the module docstring)."""
    key = ["step", "pid", "tid"]
    tolerance = pl.max_horizontal(
        pl.lit(DUPLICATE_TOLERANCE_US),
        (pl.col("host_end_us") - pl.col("host_start_us")) * DUPLICATE_TOLERANCE_SHARE,
    )
    marked = (
        host.with_row_index("_order")
        .sort([*key, "host_start_us"], nulls_last=True, maintain_order=True)
        .with_columns(
            _copy=(
                pl.all_horizontal([pl.col(k).eq_missing(pl.col(k).shift(1)) for k in key])
                & ((pl.col("host_start_us") - pl.col("host_start_us").shift(1)).abs() <= tolerance)
                & ((pl.col("host_end_us") - pl.col("host_end_us").shift(1)).abs() <= tolerance)
            ).fill_null(False)
        )
        .sort("_order")
    )
    copies = marked.filter(pl.col("_copy"))
    if copies.height == 0:
        return host, []
    steps = sorted(set(copies["step"].to_list()), key=lambda s: (s is None, s))
    warning = (
        f"removed {copies.height} duplicate ProfilerStep range(s): "
        f"{_step_list(steps)} appear more than once on the same thread with the same range; "
        "each step is counted once"
    )
    return marked.filter(~pl.col("_copy")).drop("_order", "_copy"), [warning]


def _without_overlaps(host: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """Cuts each range at the next step's start (steps run one after another)."""
    next_start = pl.col("host_start_us").shift(-1)
    checked = host.with_columns(_overlap_us=(pl.col("host_end_us") - next_start).fill_null(0.0))
    over = checked.filter(pl.col("_overlap_us") > OVERLAP_TOLERANCE_US)
    cut = checked.with_columns(
        host_end_us=pl.min_horizontal(pl.col("host_end_us"), next_start.fill_null(float("inf")))
    ).drop("_overlap_us")
    if over.height == 0:
        return cut, []
    worst = over.sort("_overlap_us", descending=True).row(0, named=True)
    used = cut["step"].to_list()
    warning = (
        f"{over.height} ProfilerStep range(s) overlap the next step "
        f"({_step_list(over['step'].to_list())}; the most: #{worst['step']} by "
        f"{worst['_overlap_us'] / 1000:.1f} ms): each range was cut at the next step's start. "
        f"Steps used: {_step_list(used)} ({len(used)})"
    )
    return cut, [warning]


# What stands in for the steps of a trace without host ProfilerStep ranges, in order of
# preference (the module docstring says why); the warning quotes the phrase.
INFERRED_FROM_GPU_STEPS = "the GPU-side ProfilerStep#N ranges"
INFERRED_FROM_GPU_ACTIVITY = "first to last GPU activity"
INFERRED_FROM_HOST_SPAN = "the host span"


def _gpu_step_ranges(events: pl.DataFrame) -> pl.DataFrame:
    return (
        sel.select_where(
            events,
            sel.GPU_STEP,
            STEP_NUMBER,
            pl.col("ts").alias("host_start_us"),
            sel.END_US.alias("host_end_us"),
        )
        .unique(subset=["host_start_us", "host_end_us"], keep="first", maintain_order=True)
        .sort("host_start_us")
    )


def _inferred_step(events: pl.DataFrame) -> tuple[pl.DataFrame, str]:
    """The window standing in for the steps, and what it is (an ``INFERRED_FROM_*``)."""
    gpu_steps = _gpu_step_ranges(events)
    if gpu_steps.height:
        cut, _ = _without_overlaps(gpu_steps)
        return cut, INFERRED_FROM_GPU_STEPS
    window = (
        pl.lit(0, pl.Int64).alias("step"),
        pl.col("ts").min().alias("host_start_us"),
        sel.END_US.max().alias("host_end_us"),
    )
    gpu = sel.select_where(events, sel.GPU_WORK, *window)
    if gpu.item(0, "host_start_us") is not None:
        return gpu, INFERRED_FROM_GPU_ACTIVITY
    for rows in (sel.HOST_OP | pl.col("cat").eq("python_function"), pl.col("ts").is_not_null()):
        host = sel.select_where(events, rows, *window)
        if host.item(0, "host_start_us") is not None:
            return host, INFERRED_FROM_HOST_SPAN
    empty = pl.DataFrame(
        schema={"step": pl.Int64, "host_start_us": pl.Float64, "host_end_us": pl.Float64}
    )
    return empty, INFERRED_FROM_HOST_SPAN


def _device_windows(windows: pl.DataFrame, index: TraceIndex) -> pl.DataFrame:
    """GPU-clock windows as steps; gpu_events counts the GPU events starting in each."""
    starts = index.gpu.select("start_us").sort("start_us")["start_us"]
    counts = [
        int(starts.search_sorted(hi, side="right") - starts.search_sorted(lo, side="left"))
        for lo, hi in windows.select("host_start_us", "host_end_us").rows()
    ]
    return windows.select(
        "step",
        pl.col("host_start_us").alias("start_us"),
        pl.col("host_end_us").alias("end_us"),
        (pl.col("host_end_us") - pl.col("host_start_us")).alias("dur_us"),
        "host_start_us",
        "host_end_us",
        pl.Series("gpu_events", counts, dtype=pl.UInt32),
    )


def _inferred_warning(inferred_from: str, count: int) -> str:
    if inferred_from == INFERRED_FROM_GPU_STEPS:
        where = f"{count} GPU-side ProfilerStep range(s) (gpu_user_annotation) stand in for them"
    else:
        where = f"{inferred_from} is treated as one step"
    return (
        f"no ProfilerStep#N ranges on the host timeline: {where}; step times, the step "
        "breakdown and per-step figures are for that window (record with "
        "torch.profiler.schedule and call prof.step())"
    )


def find_steps(events: pl.DataFrame, index: TraceIndex | None = None) -> Steps:
    index = index or build_index(events)
    warnings: list[str] = []
    ranges = _host_ranges(events)
    unnumbered = ranges.filter(pl.col("step").is_null())["name"].str.slice(0, 60)
    if unnumbered.len():
        warnings.append(
            f"{unnumbered.len()} ProfilerStep range(s) without a step number that fits a "
            f"64-bit integer ({', '.join(unnumbered.unique(maintain_order=True).head(3))}"
            f"{', ...' if unnumbered.n_unique() > 3 else ''}): each is counted as a step, "
            "its number unknown"
        )
    ranges = ranges.drop("name")
    host, duplicates = _without_duplicates(ranges)
    host, overlaps = _without_overlaps(host)
    host = host.drop("pid", "tid")
    warnings.extend(duplicates + overlaps)
    inferred = host.height == 0
    inferred_from = None
    if inferred:
        host, inferred_from = _inferred_step(events)
        if host.height:
            warnings.append(_inferred_warning(inferred_from, host.height))
    if host.height == 0:
        return Steps(pl.DataFrame(schema=STEPS_SCHEMA), inferred, tuple(warnings), inferred_from)
    if Steps(host, inferred, (), inferred_from).on_device_clock:
        # Already on the device clock: the window is the steps, as TraceLens measures it.
        return Steps(_device_windows(host, index), inferred, tuple(warnings), inferred_from)

    host = host.with_row_index("_i")
    launched = index.gpu.filter(pl.col("rt_start_us").is_not_null())
    # A call belongs to the step whose host range starts last at or before it, if the call
    # also ends inside that range (calls straddling a boundary belong to no step).
    in_step = (
        launched.sort("rt_start_us")
        .join_asof(
            host.select("_i", "host_start_us", "host_end_us").sort("host_start_us"),
            left_on="rt_start_us",
            right_on="host_start_us",
            strategy="backward",
        )
        .filter(pl.col("_i").is_not_null() & (pl.col("rt_end_us") <= pl.col("host_end_us")))
    )
    per_step = in_step.group_by("_i").agg(
        pl.col("start_us").min().alias("_dev_start"),
        pl.col("end_us").max().alias("_dev_end"),
        pl.len().alias("gpu_events"),
    )
    host = (
        host.join(per_step, on="_i", how="left")
        .sort("_i")
        .with_columns(pl.col("gpu_events").fill_null(0).cast(pl.UInt32))
    )

    if in_step.height == 0:
        frame = host.select(
            "step",
            pl.col("host_start_us").alias("start_us"),
            pl.col("host_end_us").alias("end_us"),
            (pl.col("host_end_us") - pl.col("host_start_us")).alias("dur_us"),
            "host_start_us",
            "host_end_us",
            "gpu_events",
        )
        return Steps(frame, inferred, tuple(warnings), inferred_from)

    first_start = float(host["host_start_us"][0])
    first_dev_start = host["_dev_start"][0]
    if first_dev_start is not None:
        # GPU work launched outside every step that finished before step 0's device work
        # (e.g. the previous, unprofiled iteration's tail) pushes step 0's start later.
        matched = in_step["gpu_id"]
        earlier = index.gpu.filter(
            ~pl.col("gpu_id").is_in(matched.implode()) & (pl.col("end_us") < first_dev_start)
        )
        if earlier.height:
            first_start = max(first_start, float(earlier["end_us"].max()))

    reach = pl.max_horizontal(pl.col("host_end_us"), pl.col("_dev_end").fill_null(float("-inf")))
    host = host.with_columns(
        end_us=pl.max_horizontal(reach.cum_max(), pl.lit(first_start)),
    ).with_columns(
        start_us=pl.max_horizontal(
            pl.col("host_start_us"), pl.col("end_us").shift(1).fill_null(first_start)
        )
    )
    # Steps whose GPU work the profiler may not have captured are dropped.
    counts = host["gpu_events"].to_list()
    last = max((i for i, n in enumerate(counts) if n > 0), default=-1)
    keep = last + 1
    if last > 0 and counts[last - 1] * 0.8 > counts[last]:
        keep = last
    if len(counts) > 1 and 0 <= keep < len(counts):
        dropped = len(counts) - keep
        warnings.append(
            f"dropped the last {dropped} profiler step(s): they launched no or too few GPU "
            "events, so the profiler likely cut their GPU work short (as torch-tb-profiler does)"
        )
        host = host.head(keep)
    frame = host.select(
        "step",
        "start_us",
        "end_us",
        (pl.col("end_us") - pl.col("start_us")).alias("dur_us"),
        "host_start_us",
        "host_end_us",
        "gpu_events",
    )
    return Steps(frame, inferred, tuple(warnings), inferred_from)
