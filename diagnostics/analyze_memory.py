"""Memory snapshots into the one AnalysisResult: a snapshot (or two of one job) alone, or a
run folder's ``memory/`` beside its records (diagnostics.snapshot; docs/MEMORY.md)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from diagnostics.analyze import analyze_loaded
from diagnostics.result import AnalysisResult
from diagnostics.runs import RunFolder
from diagnostics.snapshot import read_and_analyse_pair
from diagnostics.trace.budget import DEFAULT_MAX_DECOMPRESSED_BYTES
from diagnostics.trace.loader import LoadedInput


def run_snapshots(folder: RunFolder, max_bytes: int) -> tuple[Any, Any]:
    """A run folder's memory/ snapshots: the last analysed, compared with the first."""
    files = folder.snapshot_files()
    if not files:
        return None, None
    chosen = [files[0], files[-1]] if len(files) > 1 else files
    return read_and_analyse_pair(chosen, [str(f) for f in chosen], max_bytes=max_bytes)


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
