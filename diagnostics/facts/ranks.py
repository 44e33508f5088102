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

from diagnostics.facts.comm_ranks import CollectiveMatch, match_collectives

if TYPE_CHECKING:
    from diagnostics.sources import RankFacts

RANKS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64,
    "steps": pl.UInt32,
    "step_time_ms_mean": pl.Float64,
    "step_time_ms_p50": pl.Float64,
    "step_time_ms_max": pl.Float64,
    "gpu_utilization_pct": pl.Float64,  # GPU busy (kernels, copies, memsets) / steps span
    "dataloader_pct": pl.Float64,  # DataLoader share of the rank's step time
    "step_time_vs_median": pl.Float64,  # mean step time / median of the ranks' means
    # per-step means of the parts a straggler's cause is named from (rules/rank_stragglers)
    "data_wait_ms_per_step": pl.Float64,  # DataLoader (breakdown dataloader_us)
    "memcpy_ms_per_step": pl.Float64,  # copies with no kernel running (breakdown memcpy_us)
    # GPU: union of non-communication kernels; CPU: the loop thread's other operators
    "compute_ms_per_step": pl.Float64,
    "collective_ms_per_step": pl.Float64,  # union of communication (facts.comms); null: none
    "exposed_comm_ms_per_step": pl.Float64,  # communication with no compute beside it
    "comm_overlap_pct": pl.Float64,  # share of communication overlapped by compute, %
    # cross-rank matching (facts.comm_ranks), null when not matched: per-step mean time spent
    # waiting in collectives for later ranks, and how often this rank arrived last, %
    "comm_wait_ms_per_step": pl.Float64,
    "late_share_pct": pl.Float64,
    "caused_wait_share_pct": pl.Float64,  # of the waiting in collectives, the share it caused
}

_DERIVED = (
    "step_time_vs_median",
    "comm_wait_ms_per_step",
    "late_share_pct",
    "caused_wait_share_pct",
)


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


def _per_step_ms(breakdown: pl.DataFrame, column: str) -> float | None:
    if breakdown.height == 0 or column not in breakdown.columns:
        return None
    return float(breakdown[column].mean()) / 1000.0


def _compute_ms(fact: RankFacts) -> float | None:
    comms = fact.comms
    if comms is not None and comms.per_step.height:
        return float(comms.per_step["compute_us"].mean()) / 1000.0
    return _per_step_ms(fact.breakdown, "kernel_us" if fact.device == "cuda" else "cpu_exec_us")


def _comm_columns(fact: RankFacts) -> dict[str, float | None]:
    comms = fact.comms
    if comms is None or comms.per_step.height == 0:
        return {
            "collective_ms_per_step": None,
            "exposed_comm_ms_per_step": None,
            "comm_overlap_pct": None,
        }
    return {
        "collective_ms_per_step": float(comms.per_step["collective_us"].mean()) / 1000.0,
        "exposed_comm_ms_per_step": (comms.exposed_us_per_step or 0.0) / 1000.0,
        "comm_overlap_pct": comms.overlap_pct,
    }


def rank_summary(facts: Sequence[RankFacts], match: CollectiveMatch | None = None) -> pl.DataFrame:
    """One row per rank, RANKS_SCHEMA's columns; ``match`` (facts.comm_ranks) fills the
    cross-rank columns (comm wait, late arrivals)."""
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
                "data_wait_ms_per_step": _per_step_ms(fact.breakdown, "dataloader_us"),
                "memcpy_ms_per_step": _per_step_ms(fact.breakdown, "memcpy_us"),
                "compute_ms_per_step": _compute_ms(fact),
                **_comm_columns(fact),
            }
        )
    frame = pl.DataFrame(
        rows, schema={k: v for k, v in RANKS_SCHEMA.items() if k not in _DERIVED}
    ).with_columns(
        (pl.col("step_time_ms_mean") / pl.col("step_time_ms_mean").median()).alias(
            "step_time_vs_median"
        )
    )
    if match is not None:
        waits = match.per_rank.select(
            "rank", "wait_us", "late_share_pct", "caused_wait_share_pct"
        ).cast({"rank": pl.Int64})
        frame = frame.join(waits, on="rank", how="left").with_columns(
            (pl.col("wait_us") / pl.col("steps") / 1000.0).alias("comm_wait_ms_per_step")
        )
    else:
        frame = frame.with_columns(
            pl.lit(None, pl.Float64).alias("comm_wait_ms_per_step"),
            pl.lit(None, pl.Float64).alias("late_share_pct"),
            pl.lit(None, pl.Float64).alias("caused_wait_share_pct"),
        )
    return frame.select(list(RANKS_SCHEMA)).cast(RANKS_SCHEMA).sort("rank")


def rank_collectives(facts: Sequence[RankFacts]) -> CollectiveMatch | None:
    """Cross-rank matching of the ranks' collective tables (facts.comm_ranks)."""
    tables = {f.rank: f.comms.collectives for f in facts if f.comms is not None}
    steps = [float(f.steps["dur_us"].mean()) for f in facts if f.steps.height]
    mean_step = sum(steps) / len(steps) if steps else None
    return match_collectives(tables, mean_step)


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
