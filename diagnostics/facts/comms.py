"""Communication facts of one rank: collective time, overlap with compute, exposed time.

Which events are communication (``comm_kind``, the one classifier) comes from the table of
communication families (``facts.comm_families``), not from one prefix:

- ``gpu_kernel``: a ``kernel`` of a GPU family: NCCL and RCCL (``ncclKernel_*``,
  ``ncclDevKernel_*``, ``ncclDevKernel_Generic``; HTA's ``is_comm_kernel`` stops here),
  PyTorch's symmetric memory (``multimem_all_reduce_kernel``: vLLM's NVLS all-reduce),
  vLLM's custom all-reduce (``cross_device_reduce_1stage``), DeepEP's dispatch/combine and
  NVSHMEM.
- ``host_op``: a ``cpu_op`` or ``user_annotation`` range that issues a collective from the
  host: ``c10d::*`` ops, ``record_param_comms`` (PyTorch's parameter-recording wrapper
  around every collective), the backends' own ranges ``nccl:*``, ``gloo:*``, ``ucc:*``,
  ``mpi:*``, ``symm_mem::*`` and vLLM's ``vllm::all_reduce``. On a CPU/gloo run these are
  the only trace of communication.

Each collective keeps its family and, where PyTorch recorded them on the kernel (2.1+:
``Collective name``, ``In msg nelems``, ``Process Group Name``/``Ranks``), what it was, how
many elements it moved and over which process group; null where the trace has none.

How overlap is counted (the method of HTA's ``get_comm_comp_overlap``, vectorised): per
device, communication kernels and computation kernels (every other ``kernel``; copies and
memsets are neither, as in HTA) are each merged into disjoint ranges. A sweep over their
edges, +1/-1 for communication and +2/-2 for computation, gives the state of every instant:
1 = communication alone (exposed), 2 = computation alone, 3 = both (overlapped).
``overlap_pct`` = time in state 3 / time in states 1 or 3.

Two windows: the profiler steps' span (the headline figures and the per-step table, like
every other fact) and the whole trace (``trace_*``: HTA's window, for the comparison).

A CPU-only trace (no GPU events) has host collectives only (gloo runs a collective as a
``gloo:*`` range on its own worker threads, behind a short ``c10d::*`` call on the loop's
thread). The same sweep applies with communication = the union of host collective ranges
on every thread and computation = the other operators on the threads that run the profiler
steps: a collective in flight while the loop's thread runs no operator is exposed. Python
time between operators counts as not computing, so CPU exposure is an upper bound.

The compact ``collectives`` table (one row per collective, a few hundred rows per rank) is
what the cross-rank matching (``facts.comm_ranks``) needs; it is kept instead of the events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import polars as pl

from diagnostics.facts import selectors as sel
from diagnostics.facts.comm_families import COMM_FAMILIES as _FAMILIES
from diagnostics.facts.comm_families import (
    COMM_KERNEL_NAME,
    HOST_COLLECTIVE_NAME,
    HOST_COMM_CATEGORIES,
    CommPlace,
    comm_family_expr,
)
from diagnostics.facts.intervals import clip_to, covered_between, merge_intervals, total_length
from diagnostics.facts.linking import TraceIndex
from diagnostics.facts.steps import Steps


class CommKind(StrEnum):
    GPU_KERNEL = "gpu_kernel"
    HOST_OP = "host_op"


def comm_kind_expr(name: str = "name", cat: str = "cat") -> pl.Expr:
    """The communication classifier as a polars expression: a ``CommKind`` value or null."""
    gpu_ids = [f.id for f in _FAMILIES if f.place == CommPlace.GPU_KERNEL]
    family = comm_family_expr(name, cat)
    return (
        pl.when(family.is_in(gpu_ids))
        .then(pl.lit(CommKind.GPU_KERNEL.value))
        .when(family.is_not_null())
        .then(pl.lit(CommKind.HOST_OP.value))
        .otherwise(pl.lit(None, pl.String))
    )


def with_comm_kind(frame: pl.DataFrame, alias: str = "_comm_kind") -> pl.DataFrame:
    """``frame`` (name, cat, ...) with each row's ``comm_kind_expr`` value in ``alias``.

    The kind is the GPU one for a ``kernel`` whose name a GPU family matches, the host one
    for a ``cpu_op``/``user_annotation`` whose name a host family matches: the regexes run
    once per distinct name, and each row is a membership test (a join on (name, cat) cost
    twice as much: 7.7 -> 3 ms on 123k ranges)."""
    names = frame.select(pl.col("name").unique().drop_nulls())
    gpu_names = names.filter(COMM_KERNEL_NAME.fill_null(False))["name"].to_list()
    host_names = names.filter(HOST_COLLECTIVE_NAME.fill_null(False))["name"].to_list()
    name, cat = pl.col("name"), pl.col("cat")
    kind = (
        pl.when((cat == "kernel") & name.is_in(gpu_names))
        .then(pl.lit(CommKind.GPU_KERNEL.value))
        .when(cat.is_in(list(HOST_COMM_CATEGORIES)) & name.is_in(host_names))
        .then(pl.lit(CommKind.HOST_OP.value))
        .otherwise(pl.lit(None, pl.String))
    )
    return frame.with_columns(kind.alias(alias))


def comm_kind(name: str, cat: str) -> CommKind | None:
    """One event's kind (the same rule as ``comm_kind_expr``)."""
    value = pl.DataFrame({"name": [name], "cat": [cat]}).select(comm_kind_expr()).item()
    return CommKind(value) if value is not None else None


# One row per step: its duration and what communication did inside it.
COMM_STEP_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64,
    "dur_us": pl.Float64,
    "collective_us": pl.Float64,  # union of communication in the step
    "overlapped_us": pl.Float64,  # ... while computation ran
    "exposed_us": pl.Float64,  # ... while no computation ran
    "compute_us": pl.Float64,  # union of computation (GPU: kernels; CPU: loop-thread ops)
    "exposed_pct": pl.Float64,  # exposed_us / dur_us, %
}

# One row per collective (GPU: a communication kernel; CPU: an outermost host collective range).
COLLECTIVE_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64,  # profiler step whose host range launched it (null: outside steps)
    "name": pl.String,
    "ordinal": pl.UInt32,  # its position among the same name and process group in the step
    "start_us": pl.Float64,
    "end_us": pl.Float64,
    "family": pl.String,  # facts.comm_families id: "nccl", "symmetric_memory", "c10d", ...
    # what PyTorch recorded about it (null where the trace has none)
    "collective_name": pl.String,  # "allreduce", "broadcast", "_allgather_base", ...
    "in_msg_nelems": pl.Int64,
    "process_group_name": pl.String,
    "process_group_ranks": pl.String,
}
_COLLECTIVE_ARGS = ("collective_name", "in_msg_nelems", "process_group_name", "process_group_ranks")

# One row per communication family seen: how many collectives, and their summed duration.
COMM_FAMILY_SCHEMA: dict[str, pl.DataType] = {
    "family": pl.String,
    "collectives": pl.UInt32,
    "busy_us": pl.Float64,  # summed durations of its collectives (the whole trace)
    "collective_names": pl.String,  # the distinct recorded names, joined by ","; else null
}


@dataclass(frozen=True)
class CommFacts:
    source: str  # "gpu_kernels" | "host_ops"
    collectives_count: int
    collective_us: float  # in the steps' span
    overlapped_us: float | None
    exposed_us: float
    overlap_pct: float | None  # overlapped / collective, %
    exposed_pct: float | None  # exposed / summed step time, %
    exposed_us_per_step: float | None  # mean over steps
    trace_collective_us: float  # whole trace (HTA's window)
    trace_overlap_pct: float | None
    per_step: pl.DataFrame  # COMM_STEP_SCHEMA
    collectives: pl.DataFrame  # COLLECTIVE_SCHEMA
    families: pl.DataFrame = field(  # COMM_FAMILY_SCHEMA
        default_factory=lambda: pl.DataFrame(schema=COMM_FAMILY_SCHEMA)
    )


def family_table(collectives: pl.DataFrame) -> pl.DataFrame:
    """COLLECTIVE_SCHEMA rows -> COMM_FAMILY_SCHEMA, most time first."""
    return (
        collectives.group_by("family")
        .agg(
            pl.len().alias("collectives"),
            (pl.col("end_us") - pl.col("start_us")).sum().alias("busy_us"),
            pl.col("collective_name").drop_nulls().unique().sort().str.join(","),
        )
        .with_columns(
            pl.when(pl.col("collective_name") != "")
            .then(pl.col("collective_name"))
            .alias("collective_names")
        )
        .select(list(COMM_FAMILY_SCHEMA))
        .cast(COMM_FAMILY_SCHEMA)
        .sort(["busy_us", "family"], descending=[True, False])
    )


def _state_segments(comm: pl.DataFrame, comp: pl.DataFrame) -> pl.DataFrame:
    """device, start_us, end_us, state (1 comm alone, 2 compute alone, 3 both) from two
    merged (disjoint per device) interval frames; see the module docstring."""
    edges = []
    for frame, weight in ((comm, 1), (comp, 2)):
        if frame.height:
            edges.append(
                frame.select("device", pl.col("start_us").alias("t"), pl.lit(weight).alias("d"))
            )
            edges.append(
                frame.select("device", pl.col("end_us").alias("t"), pl.lit(-weight).alias("d"))
            )
    if not edges:
        return pl.DataFrame(
            schema={
                "device": pl.Int64,
                "start_us": pl.Float64,
                "end_us": pl.Float64,
                "state": pl.Int64,
            }
        )
    swept = (
        pl.concat(edges, how="vertical_relaxed")
        .sort(["device", "t", "d"])
        .with_columns(
            state=pl.col("d").cum_sum().over("device"),
            end_us=pl.col("t").shift(-1).over("device"),
        )
    )
    return swept.filter(pl.col("end_us") > pl.col("t")).select(
        "device", pl.col("t").alias("start_us"), "end_us", pl.col("state").cast(pl.Int64)
    )


def _without(ranges: pl.DataFrame, removed: pl.DataFrame) -> pl.DataFrame:
    """The parts of ``ranges`` outside ``removed`` (both: device, start_us, end_us)."""
    cols = ["device", "start_us", "end_us"]
    segments = _state_segments(
        merge_intervals(ranges.select(cols), by=["device"]),
        merge_intervals(removed.select(cols), by=["device"]),
    )
    return segments.filter(pl.col("state") == 1).select(cols)


def _length(frame: pl.DataFrame, states: tuple[int, ...], span: tuple[float, float] | None):
    picked = frame.filter(pl.col("state").is_in(list(states)))
    if span is not None:
        picked = clip_to(picked, span[0], span[1])
    return total_length(picked)


def _per_step(steps: pl.DataFrame, parts: dict[str, pl.DataFrame]) -> pl.DataFrame:
    frame = steps.select("step", "start_us", "end_us", "dur_us")
    for column, ranges in parts.items():
        if ranges is None:
            frame = frame.with_columns(pl.lit(None, pl.Float64).alias(column))
            continue
        # Several devices of one rank: each step's share is summed over its devices.
        merged = merge_intervals(ranges, by=["device"])
        devices = merged.select("device").unique()
        queries = frame.select("step", "start_us", "end_us").join(devices, how="cross")
        covered = (
            covered_between(merged, queries, column, by=["device"])
            .group_by("step")
            .agg(pl.col(column).sum())
            if merged.height
            else frame.select("step", pl.lit(0.0).alias(column))
        )
        frame = frame.join(covered, on="step", how="left").with_columns(
            pl.col(column).fill_null(0.0)
        )
    return (
        frame.with_columns(
            pl.when(pl.col("dur_us") > 0)
            .then(pl.col("exposed_us") / pl.col("dur_us") * 100.0)
            .otherwise(None)
            .alias("exposed_pct")
        )
        .select(list(COMM_STEP_SCHEMA))
        .cast(COMM_STEP_SCHEMA)
        .sort("step")
    )


def _step_of(starts: pl.DataFrame, steps: pl.DataFrame, time_col: str) -> pl.DataFrame:
    """Adds ``step``: the profiler step whose host range holds ``time_col``."""
    hosts = steps.select(
        "step", pl.col("host_start_us").alias("_hs"), pl.col("host_end_us").alias("_he")
    ).sort("_hs")
    if hosts.height == 0:
        return starts.with_columns(pl.lit(None, pl.Int64).alias("step"))
    return (
        starts.with_row_index("_row")
        .sort(time_col)
        .join_asof(hosts, left_on=time_col, right_on="_hs", strategy="backward")
        .with_columns(pl.when(pl.col(time_col) <= pl.col("_he")).then(pl.col("step")).alias("step"))
        .sort("_row")
        .drop("_row", "_hs", "_he")
    )


def _collective_table(rows: pl.DataFrame, steps: pl.DataFrame, when_col: str) -> pl.DataFrame:
    """rows: name, start_us, end_us, and ``when_col`` (the host time that places it in a
    step) -> COLLECTIVE_SCHEMA, numbered within (step, process group, name) in start order."""
    return (
        _step_of(rows, steps, when_col)
        .sort("start_us")
        .with_columns(
            pl.int_range(pl.len()).over(["step", "process_group_name", "name"]).alias("ordinal")
        )
        .select(list(COLLECTIVE_SCHEMA))
        .cast(COLLECTIVE_SCHEMA)
    )


def _host_collectives(events: pl.DataFrame) -> pl.DataFrame:
    """Host collective ranges: pid, tid, name, start_us, end_us."""
    ranges = with_comm_kind(
        sel.select_where(
            events,
            sel.DURATION
            & pl.col("dur").is_not_null()
            & pl.col("cat").is_in(list(HOST_COMM_CATEGORIES)),
            "name",
            "cat",
            "pid",
            "tid",
            "ts",
            "dur",
            *_COLLECTIVE_ARGS,
        )
    )
    return ranges.filter((pl.col("_comm_kind") == CommKind.HOST_OP.value).fill_null(False)).select(
        "pid",
        "tid",
        "name",
        pl.col("ts").alias("start_us"),
        sel.END_US,
        comm_family_expr().alias("family"),
        *_COLLECTIVE_ARGS,
    )


def _outermost(ranges: pl.DataFrame) -> pl.DataFrame:
    """The ranges not inside an earlier-starting range of the same thread (the collective
    call itself, not its record_param_comms / nccl:* children)."""
    ordered = ranges.sort(
        ["pid", "tid", "start_us", pl.col("end_us")], descending=[False, False, False, True]
    )
    prev_end = pl.col("end_us").cum_max().shift(1).over(["pid", "tid"])
    return ordered.filter(prev_end.is_null() | (pl.col("start_us") >= prev_end))


def overlap_of(comm: pl.DataFrame, comp: pl.DataFrame) -> pl.DataFrame:
    """State segments (device, start_us, end_us, state) of communication ranges ``comm``
    against computation ranges ``comp`` (both: device, start_us, end_us; any overlap)."""
    return _state_segments(
        merge_intervals(comm.select("device", "start_us", "end_us"), by=["device"]),
        merge_intervals(comp.select("device", "start_us", "end_us"), by=["device"]),
    )


def gpu_comm_split(gpu: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(communication kernels, computation kernels) of a GPU event frame (name, cat, ...);
    copies and memsets are neither."""
    kernels = with_comm_kind(gpu.filter(pl.col("cat") == "kernel")).with_columns(
        _comm=(pl.col("_comm_kind") == CommKind.GPU_KERNEL.value).fill_null(False)
    )
    return (
        kernels.filter(pl.col("_comm")).drop("_comm_kind"),
        kernels.filter(~pl.col("_comm")).drop("_comm_kind"),
    )


def comm_facts(events: pl.DataFrame, index: TraceIndex, steps: Steps) -> CommFacts | None:
    """Communication facts of one rank's trace; None when it holds no communication."""
    if index.gpu.height:
        comm_rows, comp_rows = gpu_comm_split(index.gpu)
        if comm_rows.height == 0:
            # A GPU trace without communication kernels: host collectives alone say nothing about
            # how long the device communicated; report nothing rather than a wrong figure.
            return None
        # A kernel's place in a step comes from its launching call (GPU time may run past
        # the step's host end); unlinked kernels fall back to their own start.
        table = _collective_table(
            comm_rows.select(
                "name",
                "start_us",
                "end_us",
                pl.coalesce("rt_start_us", "start_us").alias("_when"),
                comm_family_expr().alias("family"),
                *(
                    pl.col(c) if c in comm_rows.columns else pl.lit(None).alias(c)
                    for c in _COLLECTIVE_ARGS
                ),
            ),
            steps.frame,
            "_when",
        )
        return _finish("gpu_kernels", overlap_of(comm_rows, comp_rows), steps, table)
    ranges = _host_collectives(events)
    if ranges.height == 0:
        return None
    # CPU: communication runs on the backend's threads (gloo:* ranges) and the c10d calls
    # on the loop's thread; computation is the loop thread's other operators. Time with a
    # collective in flight and no operator running on the loop's thread is exposed.
    loop_threads = sel.select_where(events, sel.STEP, "pid", "tid").unique()
    if loop_threads.height == 0:
        loop_threads = ranges.select("pid", "tid").unique()
    loop_rows = (
        events.lazy()
        .join(loop_threads.lazy(), on=["pid", "tid"], how="inner")
        .select("name", "cat", "ph", "ts", "dur")
        .collect()
    )
    on_loop = with_comm_kind(loop_rows).select(
        pl.lit(0, pl.Int64).alias("device"),
        pl.col("ts").alias("start_us"),
        sel.END_US,
        loader=sel.DATALOADER,
        collective=sel.DURATION & (pl.col("_comm_kind") == CommKind.HOST_OP.value).fill_null(False),
        op=sel.HOST_OP
        & pl.col("dur").is_not_null()
        & (pl.col("_comm_kind") != CommKind.HOST_OP.value).fill_null(True),
    )
    # Not computation, though operators enclose them: the DataLoader's __next__ and what runs
    # inside it (collate, and the dataset's own work without workers) is the wait for data,
    # so a rank that loads slowly must not look like one that computes slowly; and a
    # collective called on the loop's thread blocks it, so the autograd node (DDP's reducer
    # hook) or forward annotation around the call does not hide the collective either.
    loop_ops = _without(
        on_loop.filter(pl.col("op")), on_loop.filter(pl.col("loader") | pl.col("collective"))
    )
    segments = overlap_of(ranges.with_columns(pl.lit(0, pl.Int64).alias("device")), loop_ops)
    table = _collective_table(
        _outermost(ranges).select(
            "name",
            "start_us",
            "end_us",
            pl.col("start_us").alias("_when"),
            "family",
            *_COLLECTIVE_ARGS,
        ),
        steps.frame,
        "_when",
    )
    return _finish("host_ops", segments, steps, table)


def _finish(source: str, segments: pl.DataFrame, steps: Steps, table: pl.DataFrame) -> CommFacts:
    span = steps.span
    collective = _length(segments, (1, 3), span)
    overlapped = _length(segments, (3,), span)
    exposed = _length(segments, (1,), span)
    trace_collective = _length(segments, (1, 3), None)
    trace_overlapped = _length(segments, (3,), None)
    per_step = _per_step(
        steps.frame,
        {
            "collective_us": segments.filter(pl.col("state").is_in([1, 3])),
            "overlapped_us": segments.filter(pl.col("state") == 3),
            "exposed_us": segments.filter(pl.col("state") == 1),
            "compute_us": segments.filter(pl.col("state").is_in([2, 3])),
        },
    )
    step_total = float(per_step["dur_us"].sum()) if per_step.height else 0.0
    return CommFacts(
        source=source,
        collectives_count=table.height,
        collective_us=collective,
        overlapped_us=overlapped,
        exposed_us=exposed,
        overlap_pct=overlapped / collective * 100.0 if collective > 0 else None,
        exposed_pct=exposed / step_total * 100.0 if step_total > 0 else None,
        exposed_us_per_step=float(per_step["exposed_us"].mean()) if per_step.height else None,
        trace_collective_us=trace_collective,
        trace_overlap_pct=(
            trace_overlapped / trace_collective * 100.0 if trace_collective > 0 else None
        ),
        per_step=per_step,
        collectives=table,
        families=family_table(table),
    )
