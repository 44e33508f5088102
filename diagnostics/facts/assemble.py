"""compute_facts: every derived fact of one rank's trace, assembled into TraceFacts."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import polars as pl

from diagnostics.facts.breakdown import step_breakdown
from diagnostics.facts.comms import comm_facts
from diagnostics.facts.copies import copy_table
from diagnostics.facts.coverage import kernel_coverage
from diagnostics.facts.device import identify_device
from diagnostics.facts.gpu import gpu_utilization
from diagnostics.facts.gpu_timeline import gpu_timeline
from diagnostics.facts.idle import idle_gaps
from diagnostics.facts.launches import launch_table
from diagnostics.facts.linking import TraceIndex, build_index
from diagnostics.facts.memory import memory_curve, memory_peaks
from diagnostics.facts.operators import half_dtype_ops, kernel_table, operator_table
from diagnostics.facts.peaks import device_peak
from diagnostics.facts.precision import precision_facts
from diagnostics.facts.ranks import rank_collectives, rank_summary
from diagnostics.facts.roofline import roofline_facts
from diagnostics.facts.steps import find_steps
from diagnostics.facts.sync_sites import sync_sites
from diagnostics.facts.syncs import sync_per_step, sync_table
from diagnostics.facts.trace_parts import TraceParts, trace_parts
from diagnostics.process_limits import usable_cores
from diagnostics.progress import Counter, ProgressCallback
from diagnostics.sources import RankFacts, TraceFacts

# Some GPU work always predates the profiling window (launched before it started); warn only
# when a large share cannot be traced back to its launch.
UNLINKED_WARN_SHARE = 0.25
STEP_COLUMNS = (
    "step",
    "start_us",
    "end_us",
    "dur_us",
    "host_start_us",
    "host_end_us",
    "gpu_events",
)


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


def _parts_warnings(parts: TraceParts, index: TraceIndex) -> list[str]:
    """What the trace lacks, and the GPU events without a launching call, said once each.

    The missing ProfilerStep ranges are steps.py's own warning. GPU events queued before the
    recording began (correlation ids below every call's) are expected and belong to no step:
    said only when they are a large share. Any other unlinked event should have had its call
    in the recording, and changes what is attributed to steps and operators: always said.
    """
    out = [
        f"the trace lacks {lack.part}: {lack.figures}"
        for lack in parts.lacks()
        if not lack.part.startswith("ProfilerStep")
    ]
    if not parts.host_side:
        return out
    total = index.gpu.height
    dangling = parts.gpu_unlinked_in_recording
    if dangling:
        out.append(
            f"{dangling} of {total} GPU events have no launching runtime call in the trace "
            "(no matching correlation id) although the recording was running: they count in "
            "GPU busy time but not in step ends, device time per operator or launch statistics"
        )
    if parts.shared_id_calls:
        out.append(
            f"{parts.shared_id_calls} runtime calls share {parts.shared_ids} correlation id(s) "
            "with another call: each id links its GPU events to the first call only, so "
            f"{parts.shared_id_gpu_events} GPU event(s) may be counted in the wrong step or "
            "operator, and the other calls' own GPU events are left unlinked"
        )
    before = parts.gpu_before_recording
    if before > UNLINKED_WARN_SHARE * total:
        out.append(
            f"{before} of {total} GPU events were queued before the recording began (their "
            "correlation ids precede every runtime call's): they belong to no profiled step "
            "and are left out of its figures"
        )
    return out


class _Inline:
    """A stand-in for the thread pool on one core: runs each fact as it is submitted."""

    def submit(self, fact: Callable[..., Any], *args: Any) -> Future[Any]:
        done: Future[Any] = Future()
        try:
            done.set_result(fact(*args))
        except BaseException as exc:  # noqa: BLE001 - re-raised by result(), as in the pool
            done.set_exception(exc)
        return done


# The facts _one_rank computes side by side once the index and the steps exist: its
# progress counts them, and says so before the index is built
SIDE_BY_SIDE_FACTS = 16


def _one_rank(
    events: pl.DataFrame, metadata: Any, rank: int, progress: ProgressCallback | None = None
) -> TraceFacts:
    props, dist, version, meta_warnings, _ = _metadata(metadata)
    counter = Counter("facts computed", SIDE_BY_SIDE_FACTS, progress)
    # said before the index (a second of the 1 GB trace), so that the read's last figure
    # ("93 of 93 MB read") is not left showing while the analysis goes on
    counter.start()
    index = build_index(events)
    steps = find_steps(events, index)
    # The facts below read the index and the steps and nothing of each other: two threads
    # compute them (polars runs its queries without the GIL), the longest first. On the
    # 54 MB trace: 0.25 s -> 0.20 s.
    with ThreadPoolExecutor(2) if usable_cores() > 1 else nullcontext(_Inline()) as pool:
        comms = pool.submit(comm_facts, events, index, steps)
        precision = pool.submit(precision_facts, events, index)
        operators = pool.submit(operator_table, index)
        timeline = pool.submit(gpu_timeline, events)
        idle = pool.submit(idle_gaps, events, index, steps)
        breakdown = pool.submit(step_breakdown, events, steps, index)
        gpu_future = pool.submit(gpu_utilization, index, steps)
        kernels_future = pool.submit(kernel_table, index)
        parts_future = pool.submit(trace_parts, events, index)
        copies = pool.submit(copy_table, index)
        memory_future = pool.submit(memory_curve, events)
        syncs = pool.submit(sync_table, events, index)
        launches = pool.submit(launch_table, index)
        syncs_per_step = pool.submit(sync_per_step, events, index, steps)
        half_dtypes = pool.submit(half_dtype_ops, events)
        sites = pool.submit(sync_sites, events, index, steps)
        facts = (comms, precision, operators, timeline, idle, breakdown, gpu_future)
        facts += (kernels_future, parts_future, copies, memory_future, syncs, launches)
        facts += (syncs_per_step, half_dtypes, sites)
        for _ in as_completed(facts):  # reported from this thread, whichever computed it
            counter.one_done()
    warnings = list(meta_warnings) + list(steps.warnings)
    parts = parts_future.result()
    warnings.extend(_parts_warnings(parts, index))
    memory = memory_future.result()
    gpu = gpu_future.result()
    kernels = kernels_future.result()
    used = gpu["device"].drop_nulls().to_list() if gpu.height and "device" in gpu.columns else []
    identity = identify_device(
        props,
        getattr(metadata, "extra", None) or {},
        kernels["name"].to_list(),
        int(used[0]) if used else None,
    )
    return TraceFacts(
        device="cuda" if parts.ran_on_gpu else "cpu",
        steps=steps.frame.select(*STEP_COLUMNS),
        steps_inferred=steps.inferred,
        breakdown=breakdown.result(),
        gpu=gpu,
        idle_gaps=idle.result(),
        operators=operators.result(),
        kernels=kernels,
        copies=copies.result(),
        syncs=syncs.result(),
        sync_per_step=syncs_per_step.result(),
        sync_sites=sites.result(),
        launches=launches.result(),
        memory=memory,
        memory_peak=memory_peaks(memory, props),
        op_half_dtypes=half_dtypes.result(),
        precision=precision.result(),
        comms=comms.result(),
        gpu_timeline=timeline.result(),
        parts=parts,
        device_properties=props,
        distributed=dist,
        pytorch_version=version,
        rank=rank,
        warnings=tuple(dict.fromkeys(warnings)),
        device_identity=identity,
        kernel_coverage=kernel_coverage(kernels, index),
        roofline=roofline_facts(index, device_peak(identity)) if parts.ran_on_gpu else None,
    )


def _single_rank(events: pl.DataFrame, metadata: Any) -> int | None:
    """The rank of a table that holds one (None: it holds several)."""
    meta_rank = _metadata(metadata)[4]
    # a query, not events["rank"]: a one-rank table holds its rank as one value, which
    # reading the column out as a Series would lay out a row at a time, for good
    ranks = events.select(pl.col("rank").unique().drop_nulls()).to_series().to_list()
    if len(ranks) > 1:
        return None
    return int(ranks[0]) if ranks else int(meta_rank or 0)


def compute_rank_facts(events: pl.DataFrame, metadata: Any = None) -> RankFacts:
    """The part of ``compute_facts`` the cross-rank summary reads (RankFacts), computed
    alone: for the ranks of a many-rank input other than the primary one, whose operators,
    kernels, precision, idle gaps and the rest are never read (half the facts' time)."""
    rank = _single_rank(events, metadata)
    if rank is None:  # several ranks in one table: the primary's, as compute_facts gives
        return RankFacts.of(compute_facts(events, metadata))
    index = build_index(events)
    steps = find_steps(events, index)
    parts = trace_parts(events, index)
    return RankFacts(
        rank=rank,
        device="cuda" if parts.ran_on_gpu else "cpu",
        steps=steps.frame.select(*STEP_COLUMNS),
        breakdown=step_breakdown(events, steps, index),
        gpu=gpu_utilization(index, steps),
        comms=comm_facts(events, index, steps),
    )


def compute_facts(
    events: pl.DataFrame, metadata: Any = None, progress: ProgressCallback | None = None
) -> TraceFacts:
    """Every derived fact of a trace's event table (diagnostics.trace.schema.EVENT_SCHEMA).

    ``metadata`` is the loader's TraceMetadata (device_properties, distributed_info,
    pytorch_version, warnings, rank are read; anything missing is taken as absent). The
    table should hold one rank; if it holds several, each is analysed on its own and the
    lowest rank's facts are returned with ``ranks`` summarising all of them. ``progress``
    hears of each fact of a one-rank table as it is computed.
    """
    rank = _single_rank(events, metadata)
    if rank is not None:
        return _one_rank(events, metadata, rank, progress)
    ranks = events["rank"].unique().drop_nulls().sort().to_list()
    per_rank = [_one_rank(events.filter(pl.col("rank") == r), metadata, int(r)) for r in ranks]
    parts = [RankFacts.of(facts) for facts in per_rank]
    return replace(per_rank[0], ranks=rank_summary(parts, rank_collectives(parts)))
