"""The GPU timeline as TraceLens defines it: total, computation, exposed communication,
exposed copies, busy and idle, whose parts add up to the total.

TraceLens (``GPUEventAnalyser.compute_metrics``, its ``gpu_timeline.csv``) measures over the
GPU-side ``ProfilerStep#N`` window (``gpu_user_annotation`` ranges, first start to last end)
when the trace has one, else over first to last GPU activity. Inside that window, with every
GPU event clipped to it:

- computation: the union of compute kernels and memsets (every kernel that is not
  communication, and ``gpu_memset``);
- communication: the union of communication kernels; exposed communication is the part of
  it no computation overlaps;
- copies: the union of ``gpu_memcpy``; exposed copies are the part neither computation nor
  communication overlaps;
- busy: the union of all GPU activity; total: last end minus first start of that activity;
  idle: total minus busy.

computation + exposed communication + exposed copies + idle = total, which is asserted.
Unlike ``facts/gpu.py`` (the work launched in the host's profiled steps, the basis of every
rule), this counts whatever ran in the window, so its figures compare one to one with
TraceLens's published ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import polars as pl

from diagnostics.facts import selectors as sel
from diagnostics.facts.comms import CommKind, with_comm_kind
from diagnostics.facts.intervals import clip_to, merge_intervals, total_length

WINDOW_GPU_STEPS = "gpu_profiler_steps"  # the GPU-side ProfilerStep#N ranges
WINDOW_GPU_ACTIVITY = "gpu_activity"  # first to last GPU activity

# Rounding slack for the parts-add-up check (µs; sums of many float intervals).
_ADD_UP_TOLERANCE_US = 1e-3


@dataclass(frozen=True)
class GpuTimeline:
    window: str  # WINDOW_GPU_STEPS or WINDOW_GPU_ACTIVITY
    window_start_us: float
    window_end_us: float
    total_us: float
    computation_us: float
    exposed_comm_us: float
    exposed_memcpy_us: float
    busy_us: float
    idle_us: float
    comm_us: float
    memcpy_us: float

    @property
    def idle_pct(self) -> float | None:
        return self.idle_us / self.total_us * 100.0 if self.total_us > 0 else None

    def to_dict(self) -> dict[str, float | str | None]:
        """Plain values, with ``idle_pct`` and ``busy_pct`` of the total."""
        out: dict[str, float | str | None] = dict(asdict(self))
        out["idle_pct"] = self.idle_pct
        out["busy_pct"] = self.busy_us / self.total_us * 100.0 if self.total_us > 0 else None
        return out


def _window(events: pl.DataFrame) -> tuple[str, float, float] | None:
    for source, rows in ((WINDOW_GPU_STEPS, sel.GPU_STEP), (WINDOW_GPU_ACTIVITY, sel.GPU_WORK)):
        bounds = sel.select_where(events, rows, pl.col("ts").min(), sel.END_US.max()).row(0)
        if bounds[0] is not None:
            return source, float(bounds[0]), float(bounds[1])
    return None


def _minus(ranges: pl.DataFrame, cover: pl.DataFrame) -> float:
    """|ranges \\ cover| for two merged interval sets: |A ∪ C| - |C|."""
    both = merge_intervals(pl.concat([ranges, cover]))
    return total_length(both) - total_length(cover)


def gpu_timeline(events: pl.DataFrame) -> GpuTimeline | None:
    """TraceLens's GPU timeline of one trace's event table; None without GPU activity."""
    window = _window(events)
    if window is None:
        return None
    source, lo, hi = window
    gpu = (
        with_comm_kind(
            sel.select_where(
                events,
                sel.GPU_WORK,
                "name",
                "cat",
                "ts",
                "dur",
            )
        )
        .select(
            "cat",
            (pl.col("_comm_kind") == CommKind.GPU_KERNEL.value).fill_null(False).alias("_comm"),
            pl.col("ts").alias("start_us"),
            sel.END_US,
        )
        .filter((pl.col("end_us") > lo) & (pl.col("start_us") < hi))
    )
    gpu = clip_to(gpu, lo, hi)
    if gpu.height == 0:
        return None
    spans = ["start_us", "end_us"]
    is_copy = pl.col("cat") == "gpu_memcpy"
    all_gpu = merge_intervals(gpu.select(spans))
    compute = merge_intervals(gpu.filter(~is_copy & ~pl.col("_comm")).select(spans))
    comm = merge_intervals(gpu.filter(pl.col("_comm")).select(spans))
    copies = merge_intervals(gpu.filter(is_copy).select(spans))
    compute_or_comm = merge_intervals(pl.concat([compute, comm]))
    total = float(all_gpu["end_us"].max() - all_gpu["start_us"].min())
    busy = total_length(all_gpu)
    computation = total_length(compute)
    exposed_comm = _minus(comm, compute)
    exposed_memcpy = _minus(copies, compute_or_comm)
    idle = total - busy
    # The timeline's parts cover the total exactly once (TraceLens asserts the same).
    parts = computation + exposed_comm + exposed_memcpy + idle
    assert abs(parts - total) <= _ADD_UP_TOLERANCE_US * max(1.0, gpu.height), (parts, total)
    return GpuTimeline(
        window=source,
        window_start_us=lo,
        window_end_us=hi,
        total_us=total,
        computation_us=computation,
        exposed_comm_us=exposed_comm,
        exposed_memcpy_us=exposed_memcpy,
        busy_us=busy,
        idle_us=idle,
        comm_us=total_length(comm),
        memcpy_us=total_length(copies),
    )
