"""analyze(): one input path (or a set of uploaded files) to one AnalysisResult.

load (diagnostics.trace.loader) -> facts per rank (diagnostics.facts.compute_facts) ->
AnalysisInputs -> rules (diagnostics.rules.engine.run_rules) -> summary and result.
Bad input raises :class:`~diagnostics.errors.InputError`; nothing else is expected to.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from diagnostics.errors import InputError
from diagnostics.facts import (
    breakdown_pct,
    compute_facts,
    compute_rank_facts,
    idle_breakdown_pct,
    rank_summary,
    step_time_spread,
)
from diagnostics.facts.comm_ranks import CollectiveMatch
from diagnostics.facts.mfu import mfu_facts, run_device_identity
from diagnostics.facts.ranks import rank_collectives
from diagnostics.facts.summary import overlap_summary
from diagnostics.metrics import (
    SNAPSHOT_HISTORY,
    KeyMetrics,
    compute_key_metrics,
    finite_or_none,
    steady_steps,
)
from diagnostics.model import AnalysisInputs
from diagnostics.progress import LONG_INPUT_BYTES, ProgressCallback, stored_size
from diagnostics.rank_pool import POOL_MIN_FILES, RankDigest, digest_files, ranks_are_distinct
from diagnostics.result import (
    BREAKDOWN_KEYS,
    GPU_BREAKDOWN_KEYS,
    IDLE_KEYS,
    SUMMARY_KEYS,
    AnalysisResult,
)
from diagnostics.rules.base import Skipped
from diagnostics.rules.engine import run_rules
from diagnostics.runs import RunFolder
from diagnostics.severity import SEVERITY_ORDER
from diagnostics.snapshot import is_snapshot_file, read_and_analyse_pair, run_snapshots
from diagnostics.sources import RankFacts, RunData, TraceFacts
from diagnostics.trace.budget import DEFAULT_MAX_DECOMPRESSED_BYTES, DEFAULT_MAX_EVENTS, Limits
from diagnostics.trace.loader import (
    LoadedInput,
    load,
    load_trace_file,
    load_trace_files,
    trace_files_in,
)
from diagnostics.trace.schema import LoadedTrace, TraceMetadata

if TYPE_CHECKING:
    from diagnostics.snapshot.analysis import SnapshotFacts
    from diagnostics.snapshot.compare import SnapshotGrowth

__all__ = [
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "DEFAULT_MAX_EVENTS",
    "analyze",
    "analyze_files",
    "summarise",
]


def analyze(
    path: str | os.PathLike[str],
    *,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    max_events: int = DEFAULT_MAX_EVENTS,
    thresholds: Any = None,
    progress: ProgressCallback | None = None,
) -> AnalysisResult:
    """A trace file (.json/.json.gz), a folder of per-rank traces, or a run folder.

    The byte and event budgets hold for the whole input (all files of a folder together).
    ``progress`` hears of each rank file of a many-rank folder as it is analysed; of a
    trace, or a few, of LONG_INPUT_BYTES or more as stored, how many MB have been read,
    then each fact as it is computed.
    """
    folder = Path(path)
    if folder.is_file() and is_snapshot_file(folder):
        return analyze_snapshots([folder], max_bytes=max_decompressed_bytes, thresholds=thresholds)
    files = [folder]
    if folder.is_dir() and RunFolder.is_run_folder(folder):
        files = _run_trace_files(folder)
    elif folder.is_dir():
        files = trace_files_in(folder)
        many = _analyze_many(
            files,
            [str(f) for f in files],
            "ranks",
            str(folder),
            max_decompressed_bytes,
            max_events,
            thresholds,
            progress,
        )
        if many is not None:
            return many
    if sum(stored_size(f) for f in files) < LONG_INPUT_BYTES:
        progress = None
    # the analysis reads no flow event (drill-downs do, from their own load)
    loaded = load(
        path,
        max_decompressed_bytes=max_decompressed_bytes,
        max_events=max_events,
        with_flows=False,
        progress=progress,
    )
    snapshot, growth = None, None
    if loaded.run is not None and loaded.run.folder.snapshot_files():
        snapshot, growth = run_snapshots(loaded.run.folder, max_decompressed_bytes)
    return analyze_loaded(
        loaded, thresholds=thresholds, snapshot=snapshot, growth=growth, progress=progress
    )


def _run_trace_files(folder: Path) -> list[Path]:
    """The run's trace files, for their size; none where they cannot be listed (its load
    says why)."""
    try:
        return RunFolder(folder).trace_files()
    except OSError:
        return []


def analyze_snapshots(
    paths: Sequence[str | os.PathLike[str]],
    *,
    display_names: Sequence[str] | None = None,
    max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    thresholds: Any = None,
) -> AnalysisResult:
    """One CUDA memory snapshot, or two of one job (before, after): the second analysed
    and compared with the first (diagnostics.snapshot; docs/MEMORY.md)."""
    names = list(display_names) if display_names is not None else [str(p) for p in paths]
    snapshot, growth = read_and_analyse_pair(paths, names, max_bytes=max_bytes)
    loaded = LoadedInput(
        kind="snapshot",  # type: ignore[arg-type]
        path=names[-1] if len(names) == 1 else f"{names[0]} -> {names[1]}",
        traces=(),
        files=tuple(names),
        warnings=snapshot.warnings,
    )
    return analyze_loaded(loaded, thresholds=thresholds, snapshot=snapshot, growth=growth)


def _analyze_many(
    files: Sequence[Path],
    names: Sequence[str],
    kind: str,
    path: str,
    max_bytes: int,
    max_events: int,
    thresholds: Any,
    progress: ProgressCallback | None = None,
) -> AnalysisResult | None:
    """Many rank files through the process pool (diagnostics.rank_pool): only the primary
    rank's events are held here. None when the files are too few or their ranks need the
    sequential loader's numbering."""
    if len(files) < POOL_MIN_FILES:
        return None
    limits = Limits(max_bytes, max_events)
    digests = digest_files(files, names, limits, progress=progress)
    return analyze_digests(digests, files, names, kind, path, limits, thresholds)


def analyze_digests(
    digests: Sequence[RankDigest],
    files: Sequence[Path],
    names: Sequence[str],
    kind: str,
    path: str,
    limits: Limits,
    thresholds: Any = None,
) -> AnalysisResult | None:
    """The analysis of rank files from their digests (diagnostics.rank_pool.digest_files):
    None when their ranks need the sequential loader's numbering (no rank, or one twice)."""
    if not ranks_are_distinct(digests):
        return None
    order = sorted(range(len(digests)), key=lambda i: digests[i].metadata.rank)
    first = order[0]
    shipped = digests[first].primary
    if shipped is not None:  # rank 0's worker sent its trace and facts back
        primary, primary_facts = shipped
    else:
        primary = load_trace_file(
            files[first],
            display_name=names[first],
            max_decompressed_bytes=limits.max_decompressed_bytes,
            max_events=limits.max_events,
            with_flows=False,
        )
        primary_facts = compute_facts(primary.events, primary.metadata)
    metadata = tuple(digests[i].metadata for i in order)
    loaded = LoadedInput(
        kind="trace" if kind == "trace" else "ranks",
        path=path,
        traces=(primary,),
        files=tuple(names),
        warnings=tuple(w for m in metadata for w in m.warnings),
        notes=tuple(n for m in metadata for n in m.notes),
    )
    return analyze_loaded(
        loaded,
        thresholds=thresholds,
        primary_facts=primary_facts,
        rank_facts=tuple(digests[i].facts for i in order),
        rank_metadata=metadata,
    )


def analyze_files(
    paths: Sequence[str | os.PathLike[str]],
    *,
    display_names: Sequence[str] | None = None,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    max_events: int = DEFAULT_MAX_EVENTS,
    thresholds: Any = None,
    progress: ProgressCallback | None = None,
) -> AnalysisResult:
    """Uploaded trace files, one per rank (or several windows of one rank).

    ``display_names`` are the names the user knows the files by: every message uses them
    instead of the (temporary) paths. All files together draw on one byte and event budget.
    """
    files = [Path(p) for p in paths]
    names = list(display_names) if display_names is not None else [str(p) for p in files]
    if not files:
        raise InputError("(no files)", "nothing to analyse: give at least one trace file")
    if len(names) != len(files):
        raise ValueError("display_names must name every path")
    many = _analyze_many(
        files,
        names,
        "ranks",
        ", ".join(names),
        max_decompressed_bytes,
        max_events,
        thresholds,
        progress,
    )
    if many is not None:
        return many
    return analyze_files_in_order(files, names, max_decompressed_bytes, max_events, thresholds)


def analyze_files_in_order(
    files: Sequence[Path],
    names: Sequence[str],
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    max_events: int = DEFAULT_MAX_EVENTS,
    thresholds: Any = None,
) -> AnalysisResult:
    """``analyze_files`` by the sequential loader, one file after another (no process pool):
    it numbers files without a rank and merges several windows of one rank."""
    traces, notes = load_trace_files(
        files,
        display_names=names,
        max_decompressed_bytes=max_decompressed_bytes,
        max_events=max_events,
        with_flows=False,
    )
    return analyze_ranks(traces, notes, names, thresholds)


def analyze_ranks(
    traces: Sequence[LoadedTrace],
    notes: Sequence[str],
    names: Sequence[str],
    thresholds: Any = None,
    progress: ProgressCallback | None = None,
) -> AnalysisResult:
    """The analysis of files already loaded and grouped by rank (``load_trace_files``, or
    ``as_ranks`` of traces loaded one by one), ``names`` naming the files. ``progress``
    hears of each fact of the primary rank as it is computed."""
    traces, notes = tuple(traces), tuple(notes)
    loaded = LoadedInput(
        kind="trace" if len(names) == 1 else "ranks",
        path=names[0] if len(names) == 1 else ", ".join(names),
        traces=traces,
        files=tuple(names),
        warnings=tuple(w for t in traces for w in t.metadata.warnings),
        notes=notes + tuple(n for t in traces for n in t.metadata.notes),
    )
    return analyze_loaded(loaded, thresholds=thresholds, progress=progress)


def analyze_loaded(
    loaded: LoadedInput,
    *,
    thresholds: Any = None,
    primary_facts: TraceFacts | None = None,
    rank_facts: tuple[RankFacts, ...] | None = None,
    rank_metadata: tuple[TraceMetadata, ...] | None = None,
    snapshot: SnapshotFacts | None = None,
    growth: SnapshotGrowth | None = None,
    progress: ProgressCallback | None = None,
) -> AnalysisResult:
    """Facts, rules and summary for an input the loader has read (and a memory snapshot
    with its growth from an earlier one, when given).

    ``primary_facts``, ``rank_facts`` and ``rank_metadata`` (by rank, the primary first):
    the facts computed elsewhere (diagnostics.rank_pool), ``loaded.traces`` then holding
    the primary rank only. Otherwise the primary trace's facts are computed here, and of
    the other traces only the part the per-rank table reads. ``progress`` hears of each
    of the primary trace's facts as it is computed."""
    primary: LoadedTrace | None = loaded.traces[0] if loaded.traces else None
    if primary_facts is None and primary is not None:
        primary_facts = compute_facts(primary.events, primary.metadata, progress)
    if rank_facts is None:
        others = (compute_rank_facts(t.events, t.metadata) for t in loaded.traces[1:])
        rank_facts = (RankFacts.of(primary_facts), *others) if primary_facts else ()
    if rank_metadata is None:
        rank_metadata = tuple(t.metadata for t in loaded.traces)
    facts = primary_facts
    match = rank_collectives(rank_facts) if len(rank_facts) > 1 else None
    if facts is not None and len(rank_facts) > 1:
        facts = replace(facts, ranks=rank_summary(rank_facts, match))
    environment = _environment(loaded.run, primary, facts)
    step_map = (
        trace_run_steps(facts.steps, loaded.run.steps, primary.metadata.clock_offset_s)
        if facts is not None and primary is not None and loaded.run is not None
        else None
    )
    inputs = AnalysisInputs(
        trace=facts,
        run=loaded.run,
        events=primary.events if primary is not None else None,
        collective_match=match,
        snapshot=snapshot,
        snapshot_growth=growth,
    )
    outcome = run_rules(inputs, thresholds)
    skipped = outcome.skipped + tuple(
        Skipped(e.rule, f"rule failed: {e.reason}") for e in outcome.errors
    )
    warnings = list(loaded.warnings)
    if facts is not None:
        warnings.extend(w for w in facts.warnings if w not in warnings)
    warnings.extend(f"rule {e.rule} failed and was skipped: {e.reason}" for e in outcome.errors)
    if loaded.run is not None:  # after the rules: they read the run's records too
        warnings.extend(w for w in loaded.run.folder.record_warnings() if w not in warnings)
    if loaded.run is not None and loaded.run.steps.height == 0 and facts is None:
        # a script that never stepped (or a run that died first): nothing below is measured
        warnings.append(
            "no steps: the run has no step records and no trace, so there is nothing to "
            f"judge (status {loaded.run.status.status})"
        )
    summary = summarise(loaded, facts, rank_facts, inputs.metrics, match)
    if rank_metadata:
        summary["events"] = sum(m.event_count for m in rank_metadata)
    if step_map is not None and step_map.height:
        summary["trace_run_steps"] = step_map.select("trace_step", "run_step").to_dicts()
    counts = dict.fromkeys(SEVERITY_ORDER, 0)
    for finding in outcome.findings:
        counts[str(finding.severity)] = counts.get(str(finding.severity), 0) + 1
    summary["findings_by_severity"] = counts
    if snapshot is not None:
        summary["memory_snapshot"] = {
            **snapshot.to_dict(),
            "growth": growth.to_dict() if growth is not None else None,
        }
    metrics = inputs.metrics
    if snapshot is not None and facts is None and loaded.run is None:
        summary["device"] = environment["device"] = "cuda"  # a CUDA snapshot is all there is
        if snapshot.peak is not None:  # the headline peak is the snapshot's replayed one
            summary["peak_memory_bytes"] = snapshot.peak.allocated_bytes
            metrics = replace(
                metrics,
                device="cuda",
                peak_memory_bytes=snapshot.peak.allocated_bytes,
                peak_memory_kind="CUDA",
                peak_memory_window=SNAPSHOT_HISTORY,
            )
            summary["peak_memory_kind"] = "CUDA"
            summary["peak_memory_window"] = SNAPSHOT_HISTORY
    return AnalysisResult(
        source={
            "kind": loaded.kind,
            "path": loaded.path,
            "files": list(loaded.files),
            "ranks": [m.rank for m in rank_metadata],
        },
        summary=summary,
        facts=facts,
        run=loaded.run,
        findings=outcome.findings,
        skipped=skipped,
        warnings=tuple(warnings),
        environment=environment,
        notes=loaded.notes,
        rank_facts=rank_facts if len(rank_facts) > 1 else (),
        metrics=metrics,
        snapshot=snapshot,
        snapshot_growth=growth,
    )


def trace_run_steps(
    trace_steps: pl.DataFrame, run_steps: pl.DataFrame, clock_offset_s: float
) -> pl.DataFrame:
    """Which run step record each profiler step is, joined on one clock.

    A run record's ``wall_time`` (Unix s) is taken at the end of its step; a profiler
    step's host range ends when the next step starts. Each trace step takes the run
    record that ended nearest its host end, within half a typical step. Columns:
    trace_step, run_step, trace_end_s (Unix s), run_wall_time_s.
    """
    schema = {
        "trace_step": pl.Int64,
        "run_step": pl.Int64,
        "trace_end_s": pl.Float64,
        "run_wall_time_s": pl.Float64,
    }
    if trace_steps.height == 0 or run_steps.height == 0 or "host_end_us" not in trace_steps.columns:
        return pl.DataFrame(schema=schema)
    ends = trace_steps.select(
        pl.col("step").cast(pl.Int64).alias("trace_step"),
        (pl.col("host_end_us") / 1e6 + clock_offset_s).alias("trace_end_s"),
    ).sort("trace_end_s")
    records = (
        run_steps.select(
            pl.col("step").cast(pl.Int64).alias("run_step"),
            pl.col("wall_time").alias("run_wall_time_s"),
        )
        .drop_nulls()
        .sort("run_wall_time_s")
    )
    typical_s = float(trace_steps["dur_us"].median() or 0.0) / 1e6
    return (
        ends.join_asof(
            records,
            left_on="trace_end_s",
            right_on="run_wall_time_s",
            strategy="nearest",
            tolerance=max(typical_s / 2, 0.005),
        )
        .drop_nulls("run_step")
        .select(list(schema))
        .cast(schema)
        .sort("trace_step")
    )


# -- summary ---------------------------------------------------------------------------


def _device_name(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    return "cuda" if value.lower().startswith("cuda") else "cpu"


def _comm_summary(facts: TraceFacts | None) -> dict[str, Any]:
    comms = facts.comms if facts is not None else None
    if comms is None:
        return {}
    return {
        "comm_source": comms.source,
        "comm_collective_us": finite_or_none(comms.collective_us),
        "comm_overlap_pct": finite_or_none(comms.overlap_pct),
        "comm_exposed_us": finite_or_none(comms.exposed_us),
        "comm_exposed_us_per_step": finite_or_none(comms.exposed_us_per_step),
        "comm_exposed_pct": finite_or_none(comms.exposed_pct),
        "comm_families": comms.families.to_dicts(),
    }


def summarise(
    loaded: LoadedInput,
    facts: TraceFacts | None,
    rank_facts: Sequence[RankFacts] = (),
    metrics: KeyMetrics | None = None,
    match: CollectiveMatch | None = None,
) -> dict[str, Any]:
    """The summary dict: every SUMMARY_KEYS key, null where it does not apply. The headline
    numbers are the key metrics' (diagnostics.metrics), so the JSON says what the cards say."""
    summary: dict[str, Any] = dict.fromkeys(SUMMARY_KEYS)
    run = loaded.run
    run_steps = run.steps if run is not None else None

    device = _device_name(run.environment.get("device")) if run is not None else None
    if device is None and facts is not None:
        device = facts.device
    if device is None and run is not None:
        device = _device_name(run.config.get("device"))
    summary["device"] = device

    metrics = metrics or compute_key_metrics(facts, run)
    if run_steps is not None and run_steps.height:
        summary["steps"] = run_steps.height
        summary["step_time_source"] = "run"
    elif facts is not None:
        summary["steps"] = facts.steps.height
        summary["step_time_source"] = "trace"
    elif run is not None:
        summary["steps"] = 0
    if metrics.median_step_time_ms is not None:
        summary["step_time_ms"] = {
            "mean": metrics.mean_step_time_ms,
            "p50": metrics.median_step_time_ms,
            "p95": metrics.p95_step_time_ms,
        }
    summary["samples_per_s"] = metrics.samples_per_s
    summary["data_wait_pct"] = metrics.data_wait_pct
    summary["gpu_utilization_pct"] = metrics.gpu_utilization_pct
    summary["gpu_kernel_utilization_pct"] = metrics.gpu_kernel_utilization_pct
    summary["gpu_busy_pct"] = metrics.gpu_busy_pct
    summary["peak_memory_bytes"] = metrics.peak_memory_bytes
    summary["peak_memory_kind"] = metrics.peak_memory_kind
    summary["peak_memory_window"] = metrics.peak_memory_window

    if facts is not None:
        summary["steps_inferred"] = facts.steps_inferred
        summary["trace_steps"] = facts.steps.height
        parts = breakdown_pct(facts.breakdown)
        # without its CPU side a trace cannot tell runtime, DataLoader or CPU time apart
        known = set(BREAKDOWN_KEYS if facts.host_side else GPU_BREAKDOWN_KEYS)
        if facts.parts is not None and facts.parts.ran_on_gpu and not facts.parts.gpu_events:
            known -= set(GPU_BREAKDOWN_KEYS)  # GPU time not recorded (counters only)
        summary["breakdown_pct"] = (
            {
                key: finite_or_none(parts.get(key)) if key in known else None
                for key in BREAKDOWN_KEYS
            }
            if parts
            else None
        )
        if facts.parts is not None:
            summary["trace_parts"] = facts.parts.to_dict()
        if facts.gpu_timeline is not None:
            summary["gpu_timeline"] = {
                key: finite_or_none(value) if isinstance(value, float) else value
                for key, value in facts.gpu_timeline.to_dict().items()
            }
        if facts.gpu.height:
            summary["gpu_busy_us"] = finite_or_none(facts.gpu["busy_us"].sum())
            summary.update(overlap_summary(facts.gpu))
            idle = idle_breakdown_pct(facts.idle_gaps) if facts.host_side else None
            summary["gpu_idle_breakdown_pct"] = (
                {key: finite_or_none(idle.get(key)) for key in IDLE_KEYS} if idle else None
            )
    summary.update(_comm_summary(facts))
    if facts is not None and facts.kernel_coverage is not None:
        summary["kernel_coverage"] = facts.kernel_coverage.to_dict()
    if facts is not None and facts.roofline is not None:
        summary["roofline"] = facts.roofline.to_summary()
    mfu = mfu_facts(facts, run, steady_steps(run_steps) if run_steps is not None else None)
    if mfu.model is not None or mfu.counted is not None:
        summary["mfu"] = mfu.to_summary()
    if match is not None:
        summary["comm_ranks"] = match.to_summary()
    summary["events"] = sum(t.events.height for t in loaded.traces) if loaded.traces else None

    if facts is not None and facts.ranks is not None and len(rank_facts) > 1:
        spread = step_time_spread(facts.ranks)
        summary["ranks"] = {
            "count": facts.ranks.height,
            "table": facts.ranks.to_dicts(),
            "spread": asdict(spread) if spread is not None else None,
        }
    return summary


def _environment(
    run: RunData | None, primary: LoadedTrace | None, facts: TraceFacts | None
) -> dict[str, Any]:
    env: dict[str, Any] = {
        "pytorch_version": None,
        "device": None,
        "gpu_name": None,
        "cpu_count": None,
        # the GPU's identity from the trace (diagnostics.facts.device): null when unknown
        "gpu_vendor": None,
        "gpu_architecture": None,
        "gpu_generation": None,
        "gpu_model": None,
        "gpu_compute_capability": None,
        "gpu_identity_source": None,
    }
    if run is not None:
        for key in env:
            if run.environment.get(key) is not None:
                env[key] = run.environment[key]
        env["device"] = _device_name(env["device"]) or env["device"]
    if primary is not None:
        meta = primary.metadata
        env["pytorch_version"] = env["pytorch_version"] or meta.pytorch_version
        if env["gpu_name"] is None and meta.device_properties and facts is not None:
            used = facts.gpu["device"].to_list() if facts.gpu.height else []
            by_id = {p.get("id"): p for p in meta.device_properties}
            props = by_id.get(used[0]) if used else None
            if props is None and facts.device == "cuda":
                props = meta.device_properties[0]
            if props is not None:
                env["gpu_name"] = props.get("name")
        if env["device"] is None and facts is not None:
            env["device"] = facts.device
        if meta.distributed_info:
            env["world_size"] = meta.distributed_info.get("world_size")
            env["backend"] = meta.distributed_info.get("backend")
    identity = facts.device_identity if facts is not None and facts.device == "cuda" else None
    if identity is None:
        identity = run_device_identity(env)
    if identity is not None:
        env["gpu_vendor"] = identity.vendor
        env["gpu_architecture"] = identity.architecture
        env["gpu_generation"] = identity.generation
        env["gpu_model"] = identity.model
        env["gpu_compute_capability"] = identity.compute_capability
        env["gpu_identity_source"] = identity.source
    return env
