"""Several ranks: one summary row per rank and the spread of step times across them.

In data-parallel training every rank waits for the slowest at each collective, so one slow
rank (a straggler) sets the pace for all. Its evidence is a mean step time well above the
ranks' median, or a GPU that is busy for less of the step than the others'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from diagnostics.model import TraceFacts

RANKS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64,
    "steps": pl.UInt32,
    "step_time_ms_mean": pl.Float64,
    "step_time_ms_p50": pl.Float64,
    "step_time_ms_max": pl.Float64,
    "gpu_utilization_pct": pl.Float64,  # GPU busy (kernels, copies, memsets) / steps span
    "dataloader_pct": pl.Float64,  # DataLoader share of the rank's step time
    "step_time_vs_median": pl.Float64,  # mean step time / median of the ranks' means
}


@dataclass(frozen=True)
class StepTimeSpread:
    ranks: int
    fastest_rank: int
    slowest_rank: int
    fastest_ms: float
    slowest_ms: float
    median_ms: float
    slowest_vs_median: float  # slowest mean step time / median of the means
    spread_pct: float  # (slowest - fastest) / median, %


def rank_summary(facts: Sequence[TraceFacts]) -> pl.DataFrame:
    """One row per rank: rank, steps, step_time_ms_mean/p50/max, gpu_utilization_pct,
    dataloader_pct, step_time_vs_median."""
    rows = []
    for fact in facts:
        durations = (
            fact.steps["dur_us"] / 1000.0 if fact.steps.height else pl.Series([], dtype=pl.Float64)
        )
        # the key metrics' utilisation (diagnostics/metrics.py): busy over span, so a rank's
        # row says what its card would
        span = float(fact.gpu["span_us"].sum()) if fact.gpu.height else 0.0
        util = 100.0 * float(fact.gpu["busy_us"].sum()) / span if span > 0 else None
        total = float(fact.breakdown["total_us"].sum()) if fact.breakdown.height else 0.0
        rows.append(
            {
                "rank": fact.rank,
                "steps": fact.steps.height,
                "step_time_ms_mean": durations.mean() if len(durations) else None,
                "step_time_ms_p50": durations.median() if len(durations) else None,
                "step_time_ms_max": durations.max() if len(durations) else None,
                "gpu_utilization_pct": util,
                "dataloader_pct": (
                    float(fact.breakdown["dataloader_us"].sum()) / total * 100.0
                    if total > 0
                    else None
                ),
            }
        )
    frame = pl.DataFrame(
        rows, schema={k: v for k, v in RANKS_SCHEMA.items() if k != "step_time_vs_median"}
    )
    return (
        frame.with_columns(
            (pl.col("step_time_ms_mean") / pl.col("step_time_ms_mean").median()).alias(
                "step_time_vs_median"
            )
        )
        .cast(RANKS_SCHEMA)
        .sort("rank")
    )


def step_time_spread(ranks: pl.DataFrame) -> StepTimeSpread | None:
    """Fastest, slowest and median of the ranks' mean step times (needs two ranks)."""
    timed = ranks.filter(pl.col("step_time_ms_mean").is_not_null()).sort("step_time_ms_mean")
    if timed.height < 2:
        return None
    fastest, slowest = timed.row(0, named=True), timed.row(-1, named=True)
    median = float(timed["step_time_ms_mean"].median())
    return StepTimeSpread(
        ranks=timed.height,
        fastest_rank=int(fastest["rank"]),
        slowest_rank=int(slowest["rank"]),
        fastest_ms=float(fastest["step_time_ms_mean"]),
        slowest_ms=float(slowest["step_time_ms_mean"]),
        median_ms=median,
        slowest_vs_median=float(slowest["step_time_ms_mean"]) / median,
        spread_pct=(float(slowest["step_time_ms_mean"]) - float(fastest["step_time_ms_mean"]))
        / median
        * 100.0,
    )
