"""compute_facts: every derived fact of one rank's trace, assembled into TraceFacts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import polars as pl

from diagnostics.facts.breakdown import step_breakdown
from diagnostics.facts.comms import comm_facts
from diagnostics.facts.copies import copy_table
from diagnostics.facts.coverage import kernel_coverage
from diagnostics.facts.device import identify_device
from diagnostics.facts.gpu import gpu_utilization
from diagnostics.facts.idle import idle_gaps
from diagnostics.facts.launches import launch_table
from diagnostics.facts.linking import build_index
from diagnostics.facts.memory import memory_curve, memory_peaks
from diagnostics.facts.operators import half_dtype_ops, kernel_table, operator_table
from diagnostics.facts.ranks import rank_collectives, rank_summary
from diagnostics.facts.steps import find_steps
from diagnostics.facts.syncs import sync_per_step, sync_table
from diagnostics.model import TraceFacts

# Some GPU work always predates the profiling window (launched before it started); warn only
# when a large share cannot be traced back to its launch.
UNLINKED_WARN_SHARE = 0.25


def _metadata(
    metadata: Any,
) -> tuple[
    tuple[dict[str, Any], ...], dict[str, Any] | None, str | None, tuple[str, ...], int | None
]:
    props = getattr(metadata, "device_properties", None) or ()
    dist = getattr(metadata, "distributed_info", None)
    version = getattr(metadata, "pytorch_version", None)
    warnings = tuple(getattr(metadata, "warnings", None) or ())
    rank = getattr(metadata, "rank", None)
    return tuple(props), dist, version, warnings, rank


def _one_rank(events: pl.DataFrame, metadata: Any, rank: int) -> TraceFacts:
    props, dist, version, meta_warnings, _ = _metadata(metadata)
    index = build_index(events)
    steps = find_steps(events, index)
    warnings = list(meta_warnings) + list(steps.warnings)
    unlinked = index.gpu.filter(pl.col("rt_id").is_null()).height
    if index.gpu.height and unlinked > UNLINKED_WARN_SHARE * index.gpu.height:
        warnings.append(
            f"{unlinked} of {index.gpu.height} GPU events have no launching runtime call in the "
            "trace (no matching correlation id): step ends, device time per operator and "
            "launch statistics count only the linked ones"
        )
    memory = memory_curve(events)
    gpu = gpu_utilization(index, steps)
    kernels = kernel_table(index)
    used = gpu["device"].drop_nulls().to_list() if gpu.height and "device" in gpu.columns else []
    identity = identify_device(
        props,
        getattr(metadata, "extra", None) or {},
        kernels["name"].to_list(),
        int(used[0]) if used else None,
    )
    return TraceFacts(
        device="cuda" if index.gpu.height else "cpu",
        steps=steps.frame.select(
            "step", "start_us", "end_us", "dur_us", "host_start_us", "host_end_us", "gpu_events"
        ),
        steps_inferred=steps.inferred,
        breakdown=step_breakdown(events, steps, index),
        gpu=gpu,
        idle_gaps=idle_gaps(events, index, steps),
        operators=operator_table(index),
        kernels=kernels,
        copies=copy_table(index),
        syncs=sync_table(events, index),
        sync_per_step=sync_per_step(events, index, steps),
        launches=launch_table(index),
        memory=memory,
        memory_peak=memory_peaks(memory, props),
        op_half_dtypes=half_dtype_ops(events),
        comms=comm_facts(events, index, steps),
        device_properties=props,
        distributed=dist,
        pytorch_version=version,
        rank=rank,
        warnings=tuple(dict.fromkeys(warnings)),
        device_identity=identity,
        kernel_coverage=kernel_coverage(kernels, index),
    )


def compute_facts(events: pl.DataFrame, metadata: Any = None) -> TraceFacts:
    """Every derived fact of a trace's event table (diagnostics.trace.schema.EVENT_SCHEMA).

    ``metadata`` is the loader's TraceMetadata (device_properties, distributed_info,
    pytorch_version, warnings, rank are read; anything missing is taken as absent). The
    table should hold one rank; if it holds several, each is analysed on its own and the
    lowest rank's facts are returned with ``ranks`` summarising all of them.
    """
    meta_rank = _metadata(metadata)[4]
    ranks = events["rank"].unique().drop_nulls().sort().to_list() if events.height else []
    if len(ranks) <= 1:
        rank = int(ranks[0]) if ranks else int(meta_rank or 0)
        if meta_rank is not None and not ranks:
            rank = int(meta_rank)
        return _one_rank(events, metadata, rank)
    per_rank = [_one_rank(events.filter(pl.col("rank") == r), metadata, int(r)) for r in ranks]
    return replace(per_rank[0], ranks=rank_summary(per_rank, rank_collectives(per_rank)))
