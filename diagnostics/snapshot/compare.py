"""Two snapshots of one job compared: what each allocation site holds at dump time, and
how much it grew from the first to the second.

A site that holds more in the later snapshot, when both were dumped in the same phase of
the step (the phase of the last allocation before each dump, diagnostics.snapshot.sites),
is a leak suspect: at the same point of two steps a training loop holds the same tensors.
Snapshots dumped in different phases, or with no trace to tell the phase, are compared
all the same, but ``same_phase`` says the growth may be the phase's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from diagnostics.snapshot.analysis import SnapshotFacts

GROWTH_SCHEMA = {
    "site": pl.String,
    "label": pl.String,
    "user_code": pl.Boolean,
    "bytes_before": pl.Int64,
    "bytes_after": pl.Int64,
    "growth_bytes": pl.Int64,
    "blocks_before": pl.Int64,
    "blocks_after": pl.Int64,
    "category": pl.String,
    "stack": pl.String,
}


@dataclass(frozen=True)
class SnapshotGrowth:
    before: str  # the first snapshot's name
    after: str
    phase_before: str
    phase_after: str
    allocated_before_bytes: int  # at dump time
    allocated_after_bytes: int
    sites: pl.DataFrame  # GROWTH_SCHEMA, largest growth first

    @property
    def same_phase(self) -> bool:
        return self.phase_before == self.phase_after and self.phase_before != "unknown"

    @property
    def growth_bytes(self) -> int:
        return self.allocated_after_bytes - self.allocated_before_bytes

    def to_dict(self, max_sites: int = 20) -> dict[str, Any]:
        return {
            "before": self.before,
            "after": self.after,
            "phase_before": self.phase_before,
            "phase_after": self.phase_after,
            "same_phase": self.same_phase,
            "allocated_before_bytes": self.allocated_before_bytes,
            "allocated_after_bytes": self.allocated_after_bytes,
            "growth_bytes": self.growth_bytes,
            "sites": self.sites.head(max_sites).drop("stack").to_dicts(),
        }


def compare_snapshots(before: SnapshotFacts, after: SnapshotFacts) -> SnapshotGrowth:
    a = before.sites_at_dump.select(
        "site",
        pl.col("bytes").alias("bytes_before"),
        pl.col("blocks").alias("blocks_before"),
        pl.col("label").alias("label_a"),
        pl.col("user_code").alias("user_a"),
        pl.col("stack").alias("stack_a"),
        pl.col("category").alias("category_a"),
    )
    b = after.sites_at_dump.select(
        "site",
        pl.col("bytes").alias("bytes_after"),
        pl.col("blocks").alias("blocks_after"),
        "label",
        "user_code",
        "stack",
        "category",
    )
    joined = a.join(b, on="site", how="full", coalesce=True).with_columns(
        pl.col("bytes_before").fill_null(0),
        pl.col("bytes_after").fill_null(0),
        pl.col("blocks_before").fill_null(0),
        pl.col("blocks_after").fill_null(0),
        pl.col("label").fill_null(pl.col("label_a")),
        pl.col("user_code").fill_null(pl.col("user_a")),
        pl.col("stack").fill_null(pl.col("stack_a")),
        pl.col("category").fill_null(pl.col("category_a")),
    )
    sites = (
        joined.with_columns((pl.col("bytes_after") - pl.col("bytes_before")).alias("growth_bytes"))
        .select(list(GROWTH_SCHEMA))
        .cast(GROWTH_SCHEMA)
        .sort(["growth_bytes", "site"], descending=[True, False])
    )
    return SnapshotGrowth(
        before=before.source,
        after=after.source,
        phase_before=before.dump_phase,
        phase_after=after.dump_phase,
        allocated_before_bytes=before.dump.active_bytes,
        allocated_after_bytes=after.dump.active_bytes,
        sites=sites,
    )
