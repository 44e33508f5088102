"""Several uploaded traces: are they ranks of one job? Ask before merging them.

The server only writes the upload to a private temporary folder (always removed) and hands
the paths to a bounded child, which unpacks any archives there (diagnostics.isolated.analyze_upload_isolated, which runs
diagnostics.upload_analysis): no trace is loaded in the server. Files that disagree are
not merged as ranks silently: ``analyse_upload_set`` returns the question
(``UploadSet.mismatches``) until the user chooses "ranks" or "separate".

Each accepted upload has a step folder (``UploadSet.store``) under ``step_store_root()``
with each file's event table, which the drill-down's Timeline and Export read one step at
a time. Its lifecycle: made per analysed upload; removed by :func:`release` when the
session's upload is replaced or cleared, at once when the answer is a question or an
error, and on every new upload any folder older than ``MAX_STORE_AGE_S`` or beyond the
newest ``MAX_STORES`` is pruned (a session still showing a pruned upload gets a one-line
"upload the trace again" from the drill-down).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import polars as pl

from diagnostics.errors import InputError
from diagnostics.printable import printable
from diagnostics.progress import ProgressCallback
from diagnostics.trace.budget import Limits
from diagnostics.unpack.archives import (
    ARCHIVE_SUFFIXES,
    is_archive_name,
)
from diagnostics.upload_analysis import (
    IDENTITY_SCHEMA,
    JOB_KEYS,
    Mode,
    UploadResult,
    UploadSet,
    identity,
    identity_table,
    mismatches,
)
from diagnostics.views.ranks import RANK_TABLE_LABELS
from diagnostics.views.uploads import MAX_UPLOAD_FILES, write_uploads

__all__ = [
    "ACCEPTED_EXTENSIONS",
    "IDENTITY_SCHEMA",
    "JOB_KEYS",
    "MAX_STORES",
    "MAX_STORE_AGE_S",
    "Mode",
    "UploadResult",
    "UploadSet",
    "analyse_upload_set",
    "check_names",
    "identity",
    "identity_table",
    "mismatches",
    "release",
    "shown_files",
    "step_store_root",
]

ACCEPTED_EXTENSIONS = (".json", ".json.gz")
# CUDA memory snapshots (diagnostics.snapshot), read by the restricted unpickler only
SNAPSHOT_EXTENSIONS = (".pickle", ".pickle.gz")
# Step folders kept at once (each ~ its traces' event tables, ~0.2 KB per event on disk):
# a few sessions' uploads; the oldest goes first.
MAX_STORES = 16
# A step folder no session has replaced in this long is an abandoned browser tab.
MAX_STORE_AGE_S = 6 * 3600.0
_STORE_PREFIX = "upload-"

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
    # facts/ranks.py: each rank's busy time (kernels, copies, memsets) over its steps' span
    "gpu_utilization_pct": "GPU busy (kernels, copies, memsets) (%)",
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


def shown_files(upload_set: UploadSet, chosen: UploadResult, names: Sequence[str]) -> str:
    """The files the page's results are of: the one shown when each was analysed on its
    own, else all of them (one file, or the ranks of one job)."""
    if upload_set.mode == "separate" and len(upload_set.results) > 1:
        return chosen.label
    return ", ".join(names)


def labelled(frame: pl.DataFrame, labels: dict[str, str]) -> pl.DataFrame:
    """``frame`` with people's column names (numbers stay numbers; unknown columns kept),
    its text :func:`printable` (file, GPU and job names come from the uploaded files)."""
    text = [c for c, dtype in frame.schema.items() if dtype == pl.String]
    shown = frame.with_columns(
        pl.col(c).map_elements(printable, return_dtype=pl.String) for c in text
    )
    return shown.rename({c: labels[c] for c in frame.columns if c in labels})


def step_store_root() -> Path:
    return Path(tempfile.gettempdir()) / "pipeline-doctor-steps"


def check_names(names: Sequence[str]) -> None:
    """InputError naming the first file that is not a .json/.json.gz trace or an archive of
    them, and why."""
    if len(names) > MAX_UPLOAD_FILES:
        raise InputError(
            f"{len(names)} files", f"too many at once; upload at most {MAX_UPLOAD_FILES}"
        )
    for name in names:
        lower = name.lower()
        if lower.endswith(ACCEPTED_EXTENSIONS + SNAPSHOT_EXTENSIONS) or is_archive_name(name):
            continue
        suffixes = "".join(Path(lower).suffixes[-2:]) or "no extension"
        raise InputError(
            name,
            f"unsupported file type ({suffixes}): upload Chrome traces written by "
            f"torch.profiler, as {' or '.join(ACCEPTED_EXTENSIONS)}, or a "
            f"{'/'.join(ARCHIVE_SUFFIXES)} of them, or CUDA memory snapshots "
            f"({' or '.join(SNAPSHOT_EXTENSIONS)})",
        )


def release(upload_set: UploadSet | None) -> None:
    """Removes an upload's step folder (its drill-downs' Timeline and Export stop working)."""
    if upload_set is not None and upload_set.store:
        shutil.rmtree(upload_set.store, ignore_errors=True)


def prune_stores(root: Path, *, keep: int = MAX_STORES, max_age_s: float = MAX_STORE_AGE_S) -> None:
    """Removes step folders older than ``max_age_s`` and all but the newest ``keep - 1``
    (room for the one about to be made)."""
    if not root.is_dir():
        return
    now = time.time()
    folders = []
    for folder in root.iterdir():
        with contextlib.suppress(OSError):
            if folder.name.startswith(_STORE_PREFIX) and folder.is_dir():
                folders.append((folder.stat().st_mtime, folder))
    folders.sort(reverse=True)
    for n, (mtime, folder) in enumerate(folders):
        if n >= keep - 1 or now - mtime > max_age_s:
            shutil.rmtree(folder, ignore_errors=True)


def analyse_upload_set(
    files: Sequence[tuple[str, BinaryIO]],
    analyse: Callable[..., UploadSet],
    mode: Mode | None = None,
    temp_root: str | Path | None = None,
    store_root: str | Path | None = None,
    progress: ProgressCallback | None = None,
) -> UploadSet:
    """Writes the upload to a private temporary folder (always removed) and has
    ``analyse`` unpack its archives within the input's byte budget, identify the files and
    analyse them as ranks of one job or one by one. Nothing is unpacked or loaded here.

    One file, or files that agree, are analysed as ranks straight away; files that disagree
    wait for ``mode`` (nothing is analysed meanwhile). ``analyse`` is
    diagnostics.isolated.analyze_upload_isolated on the page (a bounded child);
    diagnostics.upload_analysis.analyse_upload_files runs the same in process. Raises
    InputError. ``progress`` hears of each file read and each rank file analysed.
    """
    check_names([name for name, _ in files])
    try:
        Limits.from_env()  # a misconfigured limit is one line before anything is written
    except ValueError as exc:
        raise InputError("server configuration", str(exc)) from None
    root = Path(store_root) if store_root is not None else step_store_root()
    prune_stores(root)
    root.mkdir(parents=True, exist_ok=True)
    store = Path(tempfile.mkdtemp(prefix=_STORE_PREFIX, dir=root))
    folder = Path(tempfile.mkdtemp(prefix="pipeline-doctor-upload-", dir=temp_root))
    done: UploadSet | None = None
    try:
        paths = write_uploads(files, folder)
        names = [name for name, _ in files]
        done = analyse(paths, display_names=names, mode=mode, store=store, progress=progress)
        return done
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if done is None or not done.results:  # an error or the question: nothing to read
            shutil.rmtree(store, ignore_errors=True)
