"""Collectives across ranks: waiting for the other ranks versus transfer, and late arrivals.

Matching. A collective on one communicator must be called by every member in the same order
(NCCL's and gloo's contract), so the k-th collective of a kind that a step issued on one
communicator is the k-th of that kind on it in the same step on every other rank. Each rank
keeps only its compact collective table (``CommFacts.collectives``: step, process group,
name, ordinal within (step, process group, name), start, end); rows with the same (step,
process group, name, ordinal) on two or more ranks are one collective. Profiler steps carry
the training step number (``ProfilerStep#N``), which is the same on every rank of one job, so
ranks whose profiling windows begin at different steps still match, and traces of different
jobs share no step and match nothing. The process group is PyTorch's ``Process Group Name``
where it recorded one (2.1+, on NCCL kernels); without it the name (e.g.
``ncclKernel_AllReduce_RING_LL_Sum_float``) stands in for the communicator: two process
groups running the same kind of collective in one step may interleave differently on
different ranks, and are then paired in start order.

Splitting each rank's time in a matched collective (TraceLens's NCCL analyser does the same
split): NCCL kernels of one collective cannot finish before the last member has arrived, so
the last start, ``last_start_us``, is where transfer can begin. A rank that started earlier
spent ``last_start_us - its start`` waiting (capped at its own duration) and the rest of its
kernel transferring. ``skew_us`` = last start - first start; the rank with the last start is
the one the others waited for (HTA's ``get_potential_stragglers`` ranks ranks by the start
of their late communication kernels too). Lateness alone misleads when a step holds
several collectives: after the first one the ranks are in step and the last to start the
next is a coin toss, so a rank's ``caused_wait_share_pct`` weighs each collective it was
last in by its skew, the waiting it caused. Timestamps of different ranks are compared as
they are: ranks on one host share its clock; across hosts the skew includes their clock
offset (NTP keeps it to a few hundred µs at best), so small skews across nodes are noise.

Only collectives lasting at least ``SIGNIFICANT_SHARE`` of the mean step count towards
late arrivals, as in HTA (``min_normalized_duration=0.01``, hta/analyzers/straggler.py):
tiny collectives finish in noise and say nothing about who is late.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import polars as pl

from diagnostics.facts.intervals import merge_intervals

# HTA's straggler detection ignores communication kernels shorter than 1% of the mean
# iteration time (find_stragglers_with_late_start_comm_kernels, min_normalized_duration).
SIGNIFICANT_SHARE = 0.01

MATCHED_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64,
    "process_group_name": pl.String,  # the communicator where recorded, else null
    "name": pl.String,
    "ordinal": pl.UInt32,
    "ranks": pl.UInt32,  # ranks that issued it
    "first_start_us": pl.Float64,
    "last_start_us": pl.Float64,
    "skew_us": pl.Float64,  # last start - first start: the earliest rank's wait
    "last_rank": pl.Int64,  # the rank the others waited for
    "transfer_us": pl.Float64,  # the last rank's kernel: transfer with nobody to wait for
    "significant": pl.Boolean,  # at least SIGNIFICANT_SHARE of the mean step
}

RANK_COMM_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64,
    "matched": pl.UInt32,  # collectives matched on this rank
    # union of its matched collectives' time (a c10d call and the backend's own range of
    # one collective overlap: counted once)
    "collective_us": pl.Float64,
    "wait_us": pl.Float64,  # of which waiting for later ranks (a union too)
    "transfer_us": pl.Float64,  # of which transferring
    "wait_pct": pl.Float64,  # wait / collective, %
    "late_count": pl.UInt32,  # significant collectives where it arrived last
    "late_share_pct": pl.Float64,  # late_count / significant collectives, %
    # the skew of the significant collectives where it arrived last, over all their skew, %:
    # how much of the ranks' waiting it caused (an even job: about 1/N each)
    "caused_wait_share_pct": pl.Float64,
}


@dataclass(frozen=True)
class CollectiveMatch:
    collectives: pl.DataFrame  # MATCHED_SCHEMA, one row per matched collective
    per_rank: pl.DataFrame  # RANK_COMM_SCHEMA, one row per rank
    skew_us_p50: float
    skew_us_max: float
    significant: int  # matched collectives that count for late arrivals

    def to_summary(self) -> dict[str, object]:
        return {
            "matched_collectives": self.collectives.height,
            "significant_collectives": self.significant,
            "skew_us_p50": self.skew_us_p50,
            "skew_us_max": self.skew_us_max,
            "per_rank": self.per_rank.to_dicts(),
        }


def _union_per_rank(rows: pl.DataFrame, end: str, alias: str) -> pl.DataFrame:
    """rank -> total length of the union of [start_us, ``end``] over its rows."""
    ranges = rows.select("rank", "start_us", pl.col(end).alias("end_us"))
    merged = merge_intervals(ranges, by=["rank"])
    return merged.group_by("rank").agg((pl.col("end_us") - pl.col("start_us")).sum().alias(alias))


def match_collectives(
    tables: Mapping[int, pl.DataFrame], mean_step_us: float | None = None
) -> CollectiveMatch | None:
    """Cross-rank match of per-rank collective tables (rank -> COLLECTIVE_SCHEMA frame).

    ``mean_step_us`` sets the significance cut (SIGNIFICANT_SHARE of it; all count when
    None). None when fewer than two ranks share a collective.
    """
    parts = [
        t.filter(pl.col("step").is_not_null()).with_columns(
            pl.lit(r, pl.Int64).alias("rank"),
            *(
                []
                if "process_group_name" in t.columns
                else [pl.lit(None, pl.String).alias("process_group_name")]
            ),
        )
        for r, t in tables.items()
        if t is not None and t.height
    ]
    if len(parts) < 2:
        return None
    rows = pl.concat(parts, how="vertical_relaxed")
    key = ["step", "process_group_name", "name", "ordinal"]
    rows = rows.with_columns(
        pl.len().over(key).alias("_n"),
        pl.col("start_us").max().over(key).alias("last_start_us"),
    ).filter(pl.col("_n") >= 2)
    if rows.height == 0:
        return None
    cut = SIGNIFICANT_SHARE * mean_step_us if mean_step_us else 0.0
    rows = rows.with_columns(
        wait=(pl.col("last_start_us") - pl.col("start_us")).clip(
            upper_bound=pl.col("end_us") - pl.col("start_us")
        ),
        dur=pl.col("end_us") - pl.col("start_us"),
    )
    collectives = (
        rows.sort(["start_us", "rank"])
        .group_by(key, maintain_order=True)
        .agg(
            pl.len().alias("ranks"),
            pl.col("start_us").min().alias("first_start_us"),
            pl.col("last_start_us").first(),
            pl.col("rank").last().alias("last_rank"),
            pl.col("dur").last().alias("transfer_us"),
            pl.col("dur").max().alias("_longest"),
        )
        .with_columns(
            (pl.col("last_start_us") - pl.col("first_start_us")).alias("skew_us"),
            (pl.col("_longest") >= cut).alias("significant"),
        )
        .select(list(MATCHED_SCHEMA))
        .cast(MATCHED_SCHEMA)
        .sort(key)
    )
    significant = collectives.filter(pl.col("significant"))
    total_skew = float(significant["skew_us"].sum()) if significant.height else 0.0
    late = significant.group_by("last_rank").agg(
        pl.len().alias("late_count"),
        (
            pl.col("skew_us").sum() / total_skew * 100.0
            if total_skew > 0
            else pl.lit(None, pl.Float64)
        ).alias("caused_wait_share_pct"),
    )
    per_rank = (
        rows.group_by("rank")
        .agg(pl.len().alias("matched"))
        .join(_union_per_rank(rows, "end_us", "collective_us"), on="rank", how="left")
        .join(
            _union_per_rank(
                rows.with_columns((pl.col("start_us") + pl.col("wait")).alias("wait_end")),
                "wait_end",
                "wait_us",
            ),
            on="rank",
            how="left",
        )
        .join(late.rename({"last_rank": "rank"}), on="rank", how="left")
        .with_columns(
            (pl.col("collective_us") - pl.col("wait_us")).alias("transfer_us"),
            pl.when(pl.col("collective_us") > 0)
            .then(pl.col("wait_us") / pl.col("collective_us") * 100.0)
            .alias("wait_pct"),
            pl.col("late_count").fill_null(0),
            (
                pl.col("caused_wait_share_pct").fill_null(0.0)
                if total_skew > 0
                else pl.col("caused_wait_share_pct")
            ),
        )
        .with_columns(
            (
                pl.col("late_count") / significant.height * 100.0
                if significant.height
                else pl.lit(None, pl.Float64)
            ).alias("late_share_pct")
        )
        .select(list(RANK_COMM_SCHEMA))
        .cast(RANK_COMM_SCHEMA)
        .sort("rank")
    )
    skews = collectives["skew_us"]
    return CollectiveMatch(
        collectives=collectives,
        per_rank=per_rank,
        skew_us_p50=float(skews.median()),
        skew_us_max=float(skews.max()),
        significant=significant.height,
    )
