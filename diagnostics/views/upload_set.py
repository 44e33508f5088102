"""Several uploaded traces: are they ranks of one job? Ask before merging them.

Each file is loaded on its own and described by what its trace says about itself (GPU
model, PyTorch version, distributedInfo, job labels, when it was recorded). Files that
disagree are not merged as ranks silently: ``analyse_upload_set`` returns the question
(``UploadSet.mismatches``) until the user chooses "ranks" or "separate".
"""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import polars as pl

from diagnostics.drilldown import DrillDown, build_drilldown
from diagnostics.errors import InputError
from diagnostics.trace.budget import Budget, Limits
from diagnostics.trace.loader import load_trace_file
from diagnostics.trace.schema import LoadedTrace
from diagnostics.views.archives import ARCHIVE_SUFFIXES, extract_traces, is_archive_name
from diagnostics.views.ranks import RANK_TABLE_LABELS
from diagnostics.views.uploads import MAX_UPLOAD_FILES, write_uploads

ACCEPTED_EXTENSIONS = (".json", ".json.gz")
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

# what a person reads above each column of the file table and the per-rank table (units in
# the name); the per-rank table is the analysis' facts.ranks (RANKS_SCHEMA)
IDENTITY_LABELS: dict[str, str] = {
    "file": "file",
    "rank": "rank",
    "world_size": "world size",
    "gpu": "GPU",
    "pytorch": "PyTorch",
    "job": "job",
    "host": "host",
    "recorded": "recorded (UTC)",
    "span_ms": "recording span (ms)",
    "events": "events",
}
RANKS_LABELS: dict[str, str] = {
    "rank": RANK_TABLE_LABELS["rank"],
    "steps": "profiled steps",
    "step_time_ms_mean": "step time, mean (ms)",
    "step_time_ms_p50": "step time, median (ms)",
    "step_time_ms_max": "step time, max (ms)",
    "gpu_utilization_pct": "GPU utilisation (%)",
    "dataloader_pct": "DataLoader share of step time (%)",
    "step_time_vs_median": "mean step time ÷ median over ranks (×)",
    "data_wait_ms_per_step": "data wait per step (ms)",
    "memcpy_ms_per_step": "copies with no kernel beside them per step (ms)",
    "compute_ms_per_step": RANK_TABLE_LABELS["compute_ms"],
    "collective_ms_per_step": "communication per step (ms)",
    "exposed_comm_ms_per_step": RANK_TABLE_LABELS["exposed_comm_ms"],
    "comm_overlap_pct": "communication overlapped (%)",
    "comm_wait_ms_per_step": RANK_TABLE_LABELS["comm_wait_ms"],
    "late_share_pct": "arrived last in collectives (%)",
    "caused_wait_share_pct": "share of the waiting it caused (%)",
}


def labelled(frame: pl.DataFrame, labels: dict[str, str]) -> pl.DataFrame:
    """``frame`` with people's column names (numbers stay numbers; unknown columns kept)."""
    return frame.rename({c: labels[c] for c in frame.columns if c in labels})


@dataclass(frozen=True)
class UploadResult:
    label: str  # "all files as ranks" or the file's name
    result: Any  # diagnostics.result.AnalysisResult
    drilldowns: tuple[DrillDown, ...]  # one per file


@dataclass(frozen=True)
class UploadSet:
    identities: pl.DataFrame  # IDENTITY_SCHEMA, one row per file
    mismatches: tuple[str, ...]  # why the files may not be one job (empty: they agree)
    mode: Mode | None  # how they were analysed; None while the question is open
    results: tuple[UploadResult, ...]  # empty while the question is open

    @property
    def needs_answer(self) -> bool:
        return self.mode is None and bool(self.mismatches)


def check_names(names: Sequence[str]) -> None:
    """InputError naming the first file that is not a .json/.json.gz trace or an archive of
    them, and why."""
    if len(names) > MAX_UPLOAD_FILES:
        raise InputError(
            f"{len(names)} files", f"too many at once; upload at most {MAX_UPLOAD_FILES}"
        )
    for name in names:
        lower = name.lower()
        if lower.endswith(ACCEPTED_EXTENSIONS) or is_archive_name(name):
            continue
        suffixes = "".join(Path(lower).suffixes[-2:]) or "no extension"
        raise InputError(
            name,
            f"unsupported file type ({suffixes}): upload Chrome traces written by "
            f"torch.profiler, as {' or '.join(ACCEPTED_EXTENSIONS)}, or a "
            f"{'/'.join(ARCHIVE_SUFFIXES)} of them",
        )


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


def analyse_upload_set(
    files: Sequence[tuple[str, BinaryIO]],
    analyse: Callable[..., Any],
    mode: Mode | None = None,
    temp_root: str | Path | None = None,
) -> UploadSet:
    """Loads each upload from a private temporary folder (always removed), compares them,
    and analyses them as ranks of one job or one by one.

    One file, or files that agree, are analysed as ranks straight away; files that disagree
    wait for ``mode``. ``analyse`` is diagnostics.isolated.analyze_files_isolated on the
    page (diagnostics.analyze.analyze_files in tests). Raises InputError.
    """
    names = [name for name, _ in files]
    check_names(names)
    folder = Path(tempfile.mkdtemp(prefix="pipeline-doctor-upload-", dir=temp_root))
    try:
        plain = [(n, h) for n, h in files if not is_archive_name(n)]
        paths = write_uploads(plain, folder)
        names = [name for name, _ in plain]
        archives = [(n, h) for n, h in files if is_archive_name(n)]
        for i, (name, handle) in enumerate(archives):
            for shown, path in extract_traces(name, handle, folder / f"archive-{i}"):
                names.append(shown)
                paths.append(path)
        check_names(names)  # the count again, now with the archives' members
        # First the bounded analysis (a child process with a memory and time limit when
        # ``analyse`` is diagnostics.isolated's): only a set that it accepted is loaded in
        # this process, for the comparison and the drill-down, under the same budgets.
        merged = analyse(paths, display_names=names)
        budget = Budget(Limits.from_env())
        traces = [
            load_trace_file(path, display_name=name, budget=budget)
            for path, name in zip(paths, names, strict=True)
        ]
        rows = [identity(name, trace) for name, trace in zip(names, traces, strict=True)]
        reasons = mismatches(rows)
        if reasons and mode is None:
            return UploadSet(identity_table(rows), reasons, None, ())
        chosen: Mode = mode or "ranks"
        if chosen == "ranks":
            result = merged
            label = "all files as ranks of one job" if len(names) > 1 else names[0]
            drills = tuple(build_drilldown(t, n) for n, t in zip(names, traces, strict=True))
            results = (UploadResult(label, result, drills),)
        else:
            results = tuple(
                UploadResult(
                    name, analyse([path], display_names=[name]), (build_drilldown(t, name),)
                )
                for name, path, t in zip(names, paths, traces, strict=True)
            )
        return UploadSet(identity_table(rows), reasons, chosen, results)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
