"""What the memory-snapshot rules share: their needs, their example inputs, and sites as
evidence rows. Figures come from diagnostics.snapshot's analysis, never recomputed here."""

from __future__ import annotations

from typing import Any

import polars as pl

from diagnostics.model import AnalysisInputs
from diagnostics.rules.base import Need

MIB = 2**20

SNAPSHOT = Need(
    "a CUDA memory snapshot",
    lambda inputs: inputs.snapshot is not None,
    "no CUDA memory snapshot (torch.cuda.memory._dump_snapshot) among the inputs",
)
SNAPSHOT_HISTORY = Need(
    "a CUDA memory snapshot with its trace entries (_record_memory_history)",
    lambda inputs: inputs.snapshot is not None and inputs.snapshot.peak is not None,
    lambda inputs: (
        "no CUDA memory snapshot among the inputs"
        if inputs.snapshot is None
        else "the snapshot has no trace entries (recorded without _record_memory_history): "
        "the peak and what held it are unknown"
    ),
)
TWO_SNAPSHOTS = Need(
    "two CUDA memory snapshots of one job (before, after)",
    lambda inputs: inputs.snapshot_growth is not None,
    "needs two snapshots of one job to compare (--compare, or a run folder's memory/ with two)",
)


def mib(n: int | float | None) -> str:
    return "unknown" if n is None else f"{n / MIB:,.1f} MiB"


def site_rows(sites: pl.DataFrame, n: int = 5, column: str = "bytes") -> list[dict[str, Any]]:
    """The largest ``n`` sites, each with its bytes and first frames, for evidence."""
    rows = []
    for row in sites.head(n).iter_rows(named=True):
        rows.append(
            {
                "site": row["label"],
                "path": row["site"],
                column: int(row[column]),
                "category": row.get("category"),
                "stack": "\n".join((row.get("stack") or "").splitlines()[:6]),
            }
        )
    return rows


def snapshot_inputs(raw: dict[str, Any], before: dict[str, Any] | None = None) -> AnalysisInputs:
    """AnalysisInputs of a snapshot dict (and an earlier one to compare), for examples."""
    from diagnostics.snapshot.analysis import analyse_snapshot
    from diagnostics.snapshot.compare import compare_snapshots
    from diagnostics.snapshot.reader import parse_snapshot

    after = analyse_snapshot(parse_snapshot(raw, "after.pickle", bytes_read=10**8))
    growth = None
    if before is not None:
        first = analyse_snapshot(parse_snapshot(before, "before.pickle", bytes_read=10**8))
        growth = compare_snapshots(first, after)
    return AnalysisInputs(snapshot=after, snapshot_growth=growth)


def window(snapshot: Any) -> dict[str, Any]:
    """The recorded window the figures come from: seconds since the first trace entry
    (null when the snapshot has no time_us) and the entries' range."""
    timeline = snapshot.timeline
    if timeline.height == 0:
        return {"time_range_s": None, "entries": None, "at": "dump time"}
    times = timeline["time_s"]
    span = [0.0, round(float(times.max()), 6)] if times.null_count() == 0 else None
    return {
        "time_range_s": span,
        "entries": [int(timeline["seq"].min()), int(timeline["seq"].max())],
        "at": "dump time",
    }


def category_at_peak(snapshot: Any, category: str) -> tuple[int, int, float, pl.DataFrame]:
    """(peak allocated bytes, the category's bytes at the peak, its share %, its sites)."""
    peak = snapshot.peak.allocated_bytes
    held = snapshot.category_bytes(category)
    share = 100.0 * held / peak if peak else 0.0
    return peak, held, share, snapshot.sites_at_peak.filter(pl.col("category") == category)


def sites_chart(title: str, sites: pl.DataFrame, y_label: str) -> Any:
    """A bar chart of the ten largest sites' bytes, in MiB."""
    from diagnostics.rules.evidence import chart

    top = sites.head(10)
    return chart(
        "bar",
        title,
        "allocation site",
        y_label,
        top["label"].to_list(),
        {"held (MiB)": [round(b / 2**20, 1) for b in top["bytes"].to_list()]},
    )
