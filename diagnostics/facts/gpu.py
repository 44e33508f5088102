"""GPU busy time, utilisation and overlap per device, over the span of the profiler steps.

Which GPU work counts: the kernels, copies and memsets *launched in the profiled steps*
(their launching runtime call lies inside a step's host range, as steps.py assigns device
work to steps), on every stream. Work queued before the profiler started runs into the first
step with no launching call in the trace (on ``hta_a100_rank0_of_16`` 872 events, 57.6 ms of
the first step, launched by the unprofiled iteration before it); it belongs to no profiled
step and is left out. A trace with no GPU work linked to a launching call at all (nothing to
attribute) counts all of it, and so does a trace whose steps were read off the GPU timeline
(no host ProfilerStep: steps.py), as TraceLens counts it.

- busy_us: the union of that work's ranges on the device, all streams together (each
  instant once however many streams ran), inside [first step start, last step end].
- kernel_busy_us, copy_busy_us (memcpy), comm_busy_us (communication kernels, NCCL),
  compute_busy_us (kernels other than communication): unions of each kind, the per-kind
  breakdown; kinds overlap each other, so they do not add up to busy_us.
- copy_overlap_us / comm_overlap_us: how much of the copy (communication) union ran while
  compute kernels ran: |A ∩ C| = |A| + |C| - |A ∪ C|, from the three unions.
- utilization_pct: torch-tb-profiler's "GPU Utilization" (gpu_metrics_parser.py
  calculate_gpu_utilization): kernel union / span. busy_pct (copies included) is beside it.
"""

from __future__ import annotations

import polars as pl

from diagnostics.facts.intervals import clip_to, merge_intervals, union_of
from diagnostics.facts.kernel_classes import COMMUNICATION
from diagnostics.facts.linking import TraceIndex
from diagnostics.facts.steps import Steps

GPU_SCHEMA: dict[str, pl.DataType] = {
    "device": pl.Int64,
    "busy_us": pl.Float64,
    "kernel_busy_us": pl.Float64,
    "span_us": pl.Float64,
    "utilization_pct": pl.Float64,
    "busy_pct": pl.Float64,
    "copy_busy_us": pl.Float64,
    "comm_busy_us": pl.Float64,
    "compute_busy_us": pl.Float64,
    "copy_overlap_us": pl.Float64,
    "comm_overlap_us": pl.Float64,
}
_KINDS = ("all", "kernel", "copy", "comm", "compute")


def _kind(index: TraceIndex, kind: str) -> pl.Expr:
    """The GPU rows of one kind. Communication is told by the kernel's name, classified
    once per distinct name (the regexes over every kernel row cost 9 ms a kind)."""
    if kind == "all":
        return pl.lit(True)
    if kind == "copy":
        return pl.col("cat") == "gpu_memcpy"
    kernel = pl.col("cat") == "kernel"
    if kind == "kernel":
        return kernel
    if "comm_kernel_names" not in index.memo:
        names = index.gpu.filter(kernel).select(pl.col("name").unique())
        index.memo["comm_kernel_names"] = names.filter(COMMUNICATION)["name"].to_list()
    is_comm = pl.col("name").is_in(index.memo["comm_kernel_names"])
    return kernel & (is_comm if kind == "comm" else ~is_comm)


def launched_in_steps(index: TraceIndex, steps: Steps) -> pl.DataFrame:
    """The GPU events launched by a runtime call lying wholly inside a step's host range
    (all of them when no GPU event is linked to a launching call)."""
    host = steps.frame.select("host_start_us", "host_end_us")
    key = f"in_steps:{host.hash_rows().sum() if host.height else 0}"
    if key in index.memo:
        return index.memo[key]
    gpu = index.gpu
    linked = gpu.filter(pl.col("rt_start_us").is_not_null())
    if steps.on_device_clock and host.height:
        # Windows read off the GPU timeline (no host steps): the work that ran in them.
        chosen = gpu.filter(
            (pl.col("end_us") >= host["host_start_us"].min())
            & (pl.col("start_us") <= host["host_end_us"].max())
        )
    elif linked.height == 0 or host.height == 0:
        chosen = gpu
    else:
        inside = (
            linked.select("gpu_id", "rt_start_us", "rt_end_us")
            .sort("rt_start_us")
            .join_asof(
                host.sort("host_start_us"),
                left_on="rt_start_us",
                right_on="host_start_us",
                strategy="backward",
            )
            .filter(
                pl.col("host_start_us").is_not_null()
                & (pl.col("rt_end_us") <= pl.col("host_end_us"))
            )
            .get_column("gpu_id")
        )
        # Most traces launch all their GPU work inside the steps: then the index's own
        # frame, not a copy of it kept in the memo (195 MB of the 1 GB trace's).
        chosen = (
            gpu
            if inside.len() == gpu.height
            else gpu.filter(pl.col("gpu_id").is_in(inside.implode()))
        )
    index.memo[key] = chosen
    return chosen


def busy_intervals(
    index: TraceIndex, steps: Steps | None = None, *, kind: str = "all"
) -> pl.DataFrame:
    """Merged busy ranges per device (device, start_us, end_us) of the GPU work launched in
    ``steps`` (all GPU work without steps), of one kind: all, kernel, copy, comm, compute."""
    gpu = index.gpu if steps is None else launched_in_steps(index, steps)
    return merge_intervals(
        gpu.filter(_kind(index, kind)).select("device", "start_us", "end_us"), by=["device"]
    )


def _per_device(ranges: pl.DataFrame, lo: float, hi: float, out: str) -> pl.DataFrame:
    return (
        clip_to(ranges, lo, hi)
        .group_by("device")
        .agg((pl.col("end_us") - pl.col("start_us")).sum().alias(out))
    )


def gpu_utilization(index: TraceIndex, steps: Steps) -> pl.DataFrame:
    """One row per device with GPU_SCHEMA's columns."""
    span = steps.span
    if span is None or index.gpu.height == 0 or span[1] <= span[0]:
        return pl.DataFrame(schema=GPU_SCHEMA)
    lo, hi = span
    unions = {kind: busy_intervals(index, steps, kind=kind) for kind in _KINDS}
    # copy ∪ compute and comm ∪ compute, for the overlaps by inclusion-exclusion
    unions["copy|compute"] = union_of([unions["copy"], unions["compute"]], by=["device"])
    unions["comm|compute"] = union_of([unions["comm"], unions["compute"]], by=["device"])
    table = index.gpu.select(pl.col("device").unique()).filter(pl.col("device").is_not_null())
    for kind, ranges in unions.items():
        table = table.join(_per_device(ranges, lo, hi, kind), on="device", how="left")
    table = table.with_columns(pl.col(kind).fill_null(0.0) for kind in unions)
    return (
        table.with_columns(
            pl.col("all").alias("busy_us"),
            pl.col("kernel").alias("kernel_busy_us"),
            pl.lit(hi - lo).alias("span_us"),
            pl.col("copy").alias("copy_busy_us"),
            pl.col("comm").alias("comm_busy_us"),
            pl.col("compute").alias("compute_busy_us"),
            (pl.col("copy") + pl.col("compute") - pl.col("copy|compute"))
            .clip(lower_bound=0.0)
            .alias("copy_overlap_us"),
            (pl.col("comm") + pl.col("compute") - pl.col("comm|compute"))
            .clip(lower_bound=0.0)
            .alias("comm_overlap_us"),
        )
        .with_columns(
            (pl.col("kernel_busy_us") / pl.col("span_us") * 100.0).alias("utilization_pct"),
            (pl.col("busy_us") / pl.col("span_us") * 100.0).alias("busy_pct"),
        )
        .select(list(GPU_SCHEMA))
        .cast(GPU_SCHEMA)
        .sort("device")
    )
