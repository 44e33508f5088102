"""What an upload's analysis child does: identify each file, ask or analyse, drill down.

Several uploaded traces may or may not be ranks of one job. Each file is described by what
its trace says about itself (GPU model, PyTorch version, distributedInfo, job labels, when
it was recorded). Files that disagree are not merged as ranks silently: without a ``mode``
the answer is the question (``UploadSet.mismatches``), and no analysis runs.

``analyse_upload_files`` runs inside the bounded child (diagnostics.isolated), so no trace
is ever loaded, and no archive unpacked, in the server: it unpacks the upload's archives
beside them (diagnostics.unpack.archives), then reads each file once for its identity row,
its drill-down tables (its event table written to the upload's ``store`` folder,
diagnostics.drilldown.stored) and its analysis. Four files or more are read in parallel by
the rank pool (diagnostics.rank_pool), each worker making all three of its file at once, so
that agreeing ranks are analysed from what the pool sent back, with no second read; fewer
files are read one after another and analysed from the traces kept as loaded. What it
returns is small: tables, findings, and paths into ``store``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import polars as pl

from diagnostics.analyze import (
    analyze_digests,
    analyze_files,
    analyze_files_in_order,
    analyze_ranks,
)
from diagnostics.drilldown import DrillDown, build_drilldown
from diagnostics.errors import InputError
from diagnostics.progress import ProgressCallback, ReadProgress
from diagnostics.rank_pool import POOL_MIN_FILES, RankDigest, digest_files
from diagnostics.result import AnalysisResult
from diagnostics.snapshot.reader import is_snapshot_file
from diagnostics.trace.budget import Budget, Limits
from diagnostics.trace.loader import as_ranks, load_trace_file
from diagnostics.trace.schema import LoadedTrace

Mode = Literal["ranks", "separate"]
# Top-level keys some schedulers write that name the job (MAST/TorchX, Slurm-like labels).
JOB_KEYS = ("mast_job_name", "tw_job", "job_name", "job_id")
HOST_KEYS = ("host_name", "hostname")

IDENTITY_SCHEMA: dict[str, pl.DataType] = {
    "file": pl.String,
    "rank": pl.Int64,  # distributedInfo.rank; null when the trace does not say
    "world_size": pl.Int64,
    "gpu": pl.String,
    "pytorch": pl.String,
    "job": pl.String,
    "host": pl.String,
    "recorded": pl.String,  # UTC start, to the second
    "span_ms": pl.Float64,
    "events": pl.Int64,
}


@dataclass(frozen=True)
class UploadResult:
    label: str  # "all files as ranks" or the file's name
    result: Any  # diagnostics.result.AnalysisResult
    drilldowns: tuple[DrillDown, ...]  # one per file, their event tables on disk


@dataclass(frozen=True)
class UploadSet:
    identities: pl.DataFrame  # IDENTITY_SCHEMA, one row per file
    mismatches: tuple[str, ...]  # why the files may not be one job (empty: they agree)
    mode: Mode | None  # how they were analysed; None while the question is open
    results: tuple[UploadResult, ...]  # empty while the question is open
    store: str | None = None  # the folder the drill-downs read their steps from

    @property
    def needs_answer(self) -> bool:
        return self.mode is None and bool(self.mismatches)


def _gpu_name(trace: LoadedTrace) -> str | None:
    props = trace.metadata.device_properties
    if not props:
        return None
    used = trace.events.filter(pl.col("device").is_not_null())["device"].unique().to_list()
    by_id = {p.get("id"): p.get("name") for p in props}
    names = sorted({by_id[d] for d in used if by_id.get(d)})
    return ", ".join(names) if names else props[0].get("name")


def _first(extra: dict[str, Any], keys: Sequence[str]) -> str | None:
    for key in keys:
        if extra.get(key):
            return str(extra[key])
    return None


def identity(name: str, trace: LoadedTrace) -> dict[str, Any]:
    """One IDENTITY_SCHEMA row: what a trace says about the job that recorded it."""
    meta, events = trace.metadata, trace.events
    dist = meta.distributed_info or {}
    start = events["ts"].min() if events.height else None
    end = (events["ts"] + events["dur"].fill_null(0.0)).max() if events.height else None
    recorded = None
    if start is not None:
        seconds = float(start) / 1e6 + meta.clock_offset_s
        recorded = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return {
        "file": name,
        "rank": dist.get("rank") if isinstance(dist.get("rank"), int) else None,
        "world_size": dist.get("world_size") if isinstance(dist.get("world_size"), int) else None,
        "gpu": _gpu_name(trace),
        "pytorch": meta.pytorch_version,
        "job": _first(meta.extra, JOB_KEYS),
        "host": _first(meta.extra, HOST_KEYS),
        "recorded": recorded,
        "span_ms": (float(end) - float(start)) / 1000.0 if start is not None else None,
        "events": events.height,
        "_start_s": float(start) / 1e6 + meta.clock_offset_s if start is not None else None,
        "_end_s": float(end) / 1e6 + meta.clock_offset_s if end is not None else None,
    }


def _differs(rows: list[dict[str, Any]], key: str, what: str) -> str | None:
    values = {row[key] for row in rows if row[key] is not None}
    if len(values) <= 1:
        return None
    listed = "; ".join(f"{row['file']}: {row[key]}" for row in rows if row[key] is not None)
    return f"{what} differ ({listed})"


def _rank_text(row: dict[str, Any]) -> str:
    if row["rank"] is None:
        return f"{row['file']}: no distributedInfo"
    of = f" of {row['world_size']}" if row["world_size"] is not None else ""
    return f"{row['file']}: rank {row['rank']}{of}"


def _rank_reasons(rows: list[dict[str, Any]]) -> list[str]:
    """Whether distributedInfo says these are distinct ranks of one job."""
    with_rank = [row for row in rows if row["rank"] is not None]
    if not with_rank:
        return [
            "None of the files carries distributedInfo (rank and world size): nothing "
            "says they are ranks of one job"
        ]
    if len(with_rank) < len(rows):
        listed = "; ".join(_rank_text(row) for row in rows)
        return [f"Only some files carry distributedInfo ({listed})"]
    reasons = []
    by_rank: dict[int, list[str]] = {}
    for row in rows:
        by_rank.setdefault(row["rank"], []).append(row["file"])
    for rank, files in sorted(by_rank.items()):
        if len(files) > 1:
            reasons.append(f"Rank {rank} appears {len(files)} times ({'; '.join(files)})")
    beyond = [
        _rank_text(row)
        for row in rows
        if row["world_size"] is not None and not 0 <= row["rank"] < row["world_size"]
    ]
    if beyond:
        reasons.append(f"Ranks outside their world size ({'; '.join(beyond)})")
    return reasons


def _gap_text(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:,.0f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:,.0f} h"
    if seconds >= 120:
        return f"{seconds / 60:,.0f} min"
    return f"{seconds:,.1f} s"


def _time_reason(rows: list[dict[str, Any]]) -> str | None:
    """Ranks of one job profile the same steps, so their recording windows overlap."""
    timed = [row for row in rows if row["_start_s"] is not None and row["_end_s"] is not None]
    if len(timed) < 2:
        return None
    gap_s = max(row["_start_s"] for row in timed) - min(row["_end_s"] for row in timed)
    if gap_s <= 0:
        return None
    listed = "; ".join(
        f"{row['file']}: {row['recorded']} for {row['span_ms'] / 1000.0:,.1f} s" for row in timed
    )
    return (
        f"Recorded {_gap_text(gap_s)} apart, where ranks of one job record at the same "
        f"time ({listed})"
    )


def mismatches(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """Why these files may not be ranks of one job, one line per reason."""
    if len(rows) < 2:
        return ()
    reasons = [
        _differs(rows, "gpu", "GPU models"),
        _differs(rows, "pytorch", "PyTorch versions"),
        _differs(rows, "world_size", "World sizes (distributedInfo)"),
        _differs(rows, "job", "Job names"),
        *_rank_reasons(rows),
        _time_reason(rows),
    ]
    return tuple(reason for reason in reasons if reason)


def identity_table(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(
        [{k: row[k] for k in IDENTITY_SCHEMA} for row in rows], schema=IDENTITY_SCHEMA
    )


def analyse_upload_files(
    paths: Sequence[str | Path],
    *,
    display_names: Sequence[str],
    mode: Mode | None,
    store: str | Path,
    limits: Limits | None = None,
    progress: ProgressCallback | None = None,
) -> UploadSet:
    """The upload's identities, and unless the files disagree with no ``mode`` given, its
    analysis (one for all files as ranks, or one per file) with a drill-down per file whose
    event table is under ``store``. Archives among ``paths`` (by their display names) are
    unpacked first, into folders beside them. Raises InputError; budgets hold for all files
    together. ``progress`` hears of each rank file read and analysed in the pool (four
    files or more), or of how many MB of the files have been read, then of each fact of
    the analysis as it is computed.
    """
    from diagnostics.unpack.archives import unpack_archives
    from diagnostics.unpack.names import MAX_UPLOAD_FILES

    limits = limits or Limits.from_env()
    names, paths = unpack_archives(
        [Path(p) for p in paths], list(display_names), limits.max_decompressed_bytes
    )
    if len(paths) > MAX_UPLOAD_FILES:
        raise InputError(
            f"{len(paths)} files", f"too many at once; upload at most {MAX_UPLOAD_FILES}"
        )
    snapshots = [i for i, name in enumerate(names) if is_snapshot_file(name)]
    if snapshots:
        return _with_snapshots(paths, names, snapshots, mode, store, limits)
    digests = None
    traces: list[LoadedTrace] = []  # fewer files than the pool is worth: kept as loaded
    if len(paths) >= POOL_MIN_FILES:
        digests = _read_in_the_pool(paths, names, store, limits, progress)
        read = [digest.extra for digest in digests]
    else:
        read, traces = _read_one_by_one(paths, names, store, limits, progress)
    rows = [row for row, _ in read]
    drills = [drill for _, drill in read]
    reasons = mismatches(rows)
    table = identity_table(rows)
    if reasons and mode is None:
        return UploadSet(table, reasons, None, (), str(store))
    chosen: Mode = mode or "ranks"
    if chosen == "separate":
        results = tuple(
            UploadResult(name, _one_file(trace, path, name, limits, progress), (drill,))
            for name, path, drill, trace in zip(
                names, paths, drills, traces or [None] * len(paths), strict=True
            )
        )
        return UploadSet(table, reasons, chosen, results, str(store))
    result = None
    if traces:
        result = analyze_ranks(*as_ranks(traces), names, progress=progress)
    elif digests is not None:
        result = analyze_digests(digests, paths, names, "ranks", ", ".join(names), limits)
    if result is None:  # ranks the loader must number
        result = analyze_files_in_order(paths, names, **_budgets(limits))
    label = "all files as ranks of one job" if len(names) > 1 else names[0]
    return UploadSet(
        table, reasons, chosen, (UploadResult(label, result, tuple(drills)),), str(store)
    )


def identity_and_drilldown(
    trace: LoadedTrace, *, name: str, store: str, stem: str
) -> tuple[dict[str, Any], DrillDown]:
    """What an upload keeps of one loaded file: its identity row, and its drill-down with
    the event table written under ``store`` as ``stem`` (in a pool worker, or here)."""
    return identity(name, trace), build_drilldown(trace, name).stored(Path(store), stem)


def _read_one_by_one(
    paths: Sequence[Path],
    names: Sequence[str],
    store: str | Path,
    limits: Limits,
    progress: ProgressCallback | None,
) -> tuple[list[tuple[dict[str, Any], DrillDown]], list[LoadedTrace]]:
    """Fewer files than the pool is worth: each loaded here in turn (both cores decode a
    large one), for its identity row and stored drill-down; the traces are kept, less
    their flows (which only the drill-down reads), for the analysis."""
    budget = Budget(limits)
    read, traces = [], []
    read_progress = ReadProgress(paths, progress) if progress is not None else None
    if read_progress is not None:
        read_progress.start()
    for i, (path, name) in enumerate(zip(paths, names, strict=True)):
        trace = load_trace_file(path, display_name=name, budget=budget, read_progress=read_progress)
        # built while the trace is loaded anyway; dropped if the question is asked
        read.append(identity_and_drilldown(trace, name=name, store=str(store), stem=f"file-{i}"))
        traces.append(trace.without_flows())
        del trace
    return read, traces


def _one_file(
    trace: LoadedTrace | None,
    path: Path,
    name: str,
    limits: Limits,
    progress: ProgressCallback | None = None,
) -> AnalysisResult:
    """One file of an upload analysed alone, from its loaded trace where it is kept."""
    if trace is None:
        return analyze_files([path], display_names=[name], **_budgets(limits))
    return analyze_ranks(*as_ranks([trace]), [name], progress=progress)


def _read_in_the_pool(
    paths: Sequence[Path],
    names: Sequence[str],
    store: str | Path,
    limits: Limits,
    progress: ProgressCallback | None,
) -> list[RankDigest]:
    """Four files or more: each read once, by a rank-pool worker that makes its identity
    row and stored drill-down (the digest's ``extra``) beside its rank digest, so that
    agreeing ranks are analysed from the digests, with no second read."""
    per_file = [
        partial(identity_and_drilldown, name=name, store=str(store), stem=f"file-{i}")
        for i, name in enumerate(names)
    ]
    return digest_files(paths, names, limits, progress=progress, per_file=per_file)


def _budgets(limits: Limits) -> dict[str, int]:
    return {
        "max_decompressed_bytes": limits.max_decompressed_bytes,
        "max_events": limits.max_events,
    }


def _with_snapshots(
    paths: Sequence[Path],
    names: Sequence[str],
    snapshots: Sequence[int],
    mode: Mode | None,
    store: str | Path,
    limits: Limits,
) -> UploadSet:
    """CUDA memory snapshots among the uploads: two are one job's before and after (growth
    by site), any other number each its own result; traces beside them analysed as usual.
    The snapshots' bytes come off the traces' budget."""
    from diagnostics.analyze import analyze_snapshots

    snap_paths = [paths[i] for i in snapshots]
    snap_names = [names[i] for i in snapshots]
    pairs = [(0, 1)] if len(snapshots) == 2 else [(i,) for i in range(len(snapshots))]
    results = []
    for group in pairs:
        chosen = [snap_paths[i] for i in group]
        labels = [snap_names[i] for i in group]
        result = analyze_snapshots(
            chosen, display_names=labels, max_bytes=limits.max_decompressed_bytes
        )
        results.append(UploadResult(" -> ".join(labels), result, ()))
    traces = [i for i in range(len(paths)) if i not in set(snapshots)]
    if traces:
        spent = sum(Path(p).stat().st_size for p in snap_paths)
        rest = analyse_upload_files(
            [paths[i] for i in traces],
            display_names=[names[i] for i in traces],
            mode=mode or "separate",
            store=store,
            limits=Limits(max(1, limits.max_decompressed_bytes - spent), limits.max_events),
        )
        results = list(rest.results) + results
        return UploadSet(rest.identities, rest.mismatches, "separate", tuple(results), str(store))
    return UploadSet(identity_table([]), (), "separate", tuple(results), str(store))
