"""CUDA memory snapshots: read safely (reader), typed (schema), analysed (analysis)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from diagnostics.snapshot.reader import is_snapshot_file, read_snapshot
from diagnostics.trace.budget import BudgetExceeded, human_bytes

if TYPE_CHECKING:
    from diagnostics.runs import RunFolder
    from diagnostics.snapshot.analysis import SnapshotFacts
    from diagnostics.snapshot.compare import SnapshotGrowth

__all__ = ["is_snapshot_file", "read_and_analyse_pair", "run_snapshots"]


def read_and_analyse_pair(
    paths: Sequence[str | os.PathLike[str]],
    display_names: Sequence[str] | None = None,
    *,
    max_bytes: int,
) -> tuple[SnapshotFacts, SnapshotGrowth | None]:
    """One snapshot analysed, or two: the second analysed and compared with the first
    (before, after). The byte cap holds for the files together."""
    # imported here: every trace analysis imports this package (the rules' snapshot examples
    # live in it) and most never read a snapshot; the analysis is 8 ms of imports
    from diagnostics.snapshot.analysis import analyse_snapshot
    from diagnostics.snapshot.compare import compare_snapshots

    names = list(display_names) if display_names is not None else [str(p) for p in paths]
    if not 1 <= len(paths) <= 2:
        raise ValueError("one snapshot, or two to compare")
    facts, left = [], max_bytes
    for path, name in zip(paths, names, strict=True):
        if left <= 0:
            raise BudgetExceeded(
                name,
                f"the snapshots together are larger than the {human_bytes(max_bytes)} limit "
                "(decompressed); raise --max-decompressed-mb or PIPELINE_DOCTOR_MAX_DECOMPRESSED_MB",
            )
        snapshot = read_snapshot(Path(path), display_name=name, max_bytes=left)
        left -= snapshot.bytes_read
        facts.append(analyse_snapshot(snapshot))
        del snapshot
    if len(facts) == 1:
        return facts[0], None
    return facts[1], compare_snapshots(facts[0], facts[1])


def run_snapshots(
    folder: RunFolder, max_bytes: int
) -> tuple[SnapshotFacts | None, SnapshotGrowth | None]:
    """A run folder's memory/ snapshots: the last analysed, compared with the first."""
    files = folder.snapshot_files()
    if not files:
        return None, None
    chosen = [files[0], files[-1]] if len(files) > 1 else files
    return read_and_analyse_pair(chosen, [str(f) for f in chosen], max_bytes=max_bytes)
