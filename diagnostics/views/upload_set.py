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
from diagnostics.views.uploads import MAX_UPLOAD_FILES, write_uploads

ACCEPTED_EXTENSIONS = (".json", ".json.gz")
Mode = Literal["ranks", "separate"]
# Ranks of one job record at the same time; profiler windows of one long job can be hours
# apart. Files recorded further apart than this are not one job.
MAX_JOB_SPREAD_S = 24 * 3600.0
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
    }


def _differs(rows: list[dict[str, Any]], key: str, what: str) -> str | None:
    values = {row[key] for row in rows if row[key] is not None}
    if len(values) <= 1:
        return None
    listed = "; ".join(f"{row['file']}: {row[key]}" for row in rows if row[key] is not None)
    return f"{what} differ ({listed})"


def mismatches(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """Why these files may not be ranks of one job, one line per reason."""
    if len(rows) < 2:
        return ()
    reasons = [
        _differs(rows, "gpu", "GPU models"),
        _differs(rows, "pytorch", "PyTorch versions"),
        _differs(rows, "world_size", "World sizes (distributedInfo)"),
        _differs(rows, "job", "Job names"),
    ]
    starts = sorted(row["_start_s"] for row in rows if row["_start_s"] is not None)
    if len(starts) >= 2 and starts[-1] - starts[0] > MAX_JOB_SPREAD_S:
        days = (starts[-1] - starts[0]) / 86400.0
        listed = "; ".join(f"{row['file']}: {row['recorded']}" for row in rows)
        reasons.append(f"Recorded {days:,.0f} days apart ({listed})")
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
