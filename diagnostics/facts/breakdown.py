"""Step-time breakdown in torch-tb-profiler's categories and priority.

Each role is the union of its events' ranges (all devices, all threads): Kernel, Memcpy,
Memset (GPU events), Runtime (runtime/driver calls), DataLoader (the iterator's __next__
ranges), CPU Exec (every other operator and annotation). Every instant of a step counts once,
for the highest-priority role covering it (Kernel > Memcpy > Memset > Runtime > DataLoader >
CPU Exec); what no role covers is Other. So the parts add up to the step exactly.

torch-tb-profiler (overall_parser.py) subtracts each role's ranges from the step slots in
turn. The same numbers come from prefix unions: with U_k the union of roles 0..k,
part_k = |step ∩ U_k| - |step ∩ U_(k-1)| and Other = |step| - |step ∩ U_last|; each
|step ∩ U_k| is one coverage query (intervals.covered_between).

Differences from torch-tb-profiler, on purpose: user_annotation DataLoader ranges count as
DataLoader (0.4.3 drops them, so it reports 0 on modern traces); NCCL kernels count as Kernel
(the plugin has a separate Communication role matched through External id, which modern
traces no longer carry); cuda_driver calls count as Runtime.
"""

from __future__ import annotations

import polars as pl

from diagnostics.facts.intervals import covered_between
from diagnostics.facts.linking import TraceIndex, build_index
from diagnostics.facts.roles import prefix_unions
from diagnostics.facts.steps import Steps

# (column, role) in torch-tb-profiler's priority order.
ROLES: tuple[tuple[str, str], ...] = (
    ("kernel_us", "kernel"),
    ("memcpy_us", "memcpy"),
    ("memset_us", "memset"),
    ("runtime_us", "runtime"),
    ("dataloader_us", "dataloader"),
    ("cpu_exec_us", "host_exec"),
)
PARTS: tuple[str, ...] = (*(name for name, _ in ROLES), "other_us")
BREAKDOWN_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64,
    **{part: pl.Float64 for part in PARTS},
    "total_us": pl.Float64,
}


def step_breakdown(
    events: pl.DataFrame, steps: Steps, index: TraceIndex | None = None
) -> pl.DataFrame:
    """step, kernel_us, memcpy_us, memset_us, runtime_us, dataloader_us, cpu_exec_us,
    other_us, total_us (µs; the parts add up to total_us, the step's duration)."""
    frame = steps.frame
    if frame.height == 0:
        return pl.DataFrame(schema=BREAKDOWN_SCHEMA)
    queries = frame.select("step", "start_us", "end_us", pl.col("dur_us").alias("total_us"))
    index = index or build_index(events)
    unions = prefix_unions(index, tuple(role for _, role in ROLES))
    covered_cols: list[str] = []
    for (name, _), union in zip(ROLES, unions, strict=True):
        col = f"_u_{name}"
        queries = covered_between(union, queries, col)
        covered_cols.append(col)
    parts = [pl.col(covered_cols[0]).alias(ROLES[0][0])]
    for (name, _), prev, cur in zip(ROLES[1:], covered_cols[:-1], covered_cols[1:], strict=True):
        parts.append((pl.col(cur) - pl.col(prev)).alias(name))
    parts.append((pl.col("total_us") - pl.col(covered_cols[-1])).alias("other_us"))
    return queries.select("step", *parts, "total_us")


def breakdown_pct(breakdown: pl.DataFrame) -> dict[str, float] | None:
    """Share of each part in the summed step time, % (torch-tb-profiler's "Average Step
    Time" view: mean part / mean step). Keys without the _us suffix."""
    if breakdown.height == 0:
        return None
    total = float(breakdown["total_us"].sum())
    if total <= 0:
        return None
    return {
        part.removesuffix("_us"): float(breakdown[part].sum()) / total * 100.0 for part in PARTS
    }
