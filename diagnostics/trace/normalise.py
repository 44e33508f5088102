"""Raw decoded columns -> the event table (EVENT_SCHEMA) and the flow table (FLOW_SCHEMA).

All of it is polars expressions over whole columns: validation (which rows are usable
and why the others are not), category normalisation across Kineto versions, and the
legacy spellings of args keys folded into one column each.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import polars as pl

from diagnostics.trace.schema import EVENT_SCHEMA, FLOW_SCHEMA, Category, normalise_category

EVENT_PHASES = ("X", "i", "I")  # complete events and instants: the rows of the table
META_PHASE = "M"


@dataclass(frozen=True)
class Normalised:
    events: pl.DataFrame
    flows: pl.DataFrame
    skipped: Counter[str]  # reason -> events dropped as malformed
    ignored_phases: Counter[str]  # phase -> events of a kind the table does not hold


def _skip_reason() -> pl.Expr:
    """Why an event row cannot be used (null when it can)."""
    ph, ts, dur = pl.col("ph"), pl.col("ts"), pl.col("dur")
    return (
        pl.when(ts.is_null())
        .then(pl.lit("no ts"))
        .when(ts.is_nan() | ts.is_infinite())
        .then(pl.lit("ts is not a finite number"))
        .when((ph == "X") & dur.is_null())
        .then(pl.lit("complete event (ph X) without dur"))
        .when(dur < 0)
        .then(pl.lit("negative dur"))
        .when(dur.is_nan() | dur.is_infinite())
        .then(pl.lit("dur is not a finite number"))
        .when(pl.col("name").is_null())
        .then(pl.lit("no name"))
        .otherwise(pl.lit(None, dtype=pl.String))
    )


def _category(raw_categories: pl.Series) -> pl.Expr:
    """Normalised category: the few distinct raw spellings are mapped once, in Python."""
    mapping = {raw: str(normalise_category(raw)) for raw in raw_categories.unique().drop_nulls()}
    normalised = pl.col("cat").replace_strict(
        mapping, default=str(Category.OTHER), return_dtype=pl.String
    )
    # "[memory]" instants carry cat "cpu_instant_event" (2.x) or none at all (1.9)
    return (
        pl.when(pl.col("name") == "[memory]")
        .then(pl.lit(str(Category.MEMORY)))
        .otherwise(normalised)
        .alias("cat")
    )


def normalise(raw: pl.DataFrame, raw_flows: pl.DataFrame, rank: int) -> Normalised:
    """Decoded rows -> the event and flow tables; unusable rows dropped and counted."""
    ph = pl.col("ph")
    is_event = raw.select(ph.is_in(EVENT_PHASES).fill_null(False)).to_series()
    candidates = raw.filter(is_event)
    reasons = candidates.select(_skip_reason().alias("reason"))["reason"]
    skipped: Counter[str] = Counter()
    if reasons.null_count() < reasons.len():
        for reason, count in reasons.drop_nulls().value_counts().iter_rows():
            skipped[reason] = count
        candidates = candidates.filter(reasons.is_null())
    missing_ph = raw["ph"].null_count()
    if missing_ph:
        skipped["no ph"] += missing_ph

    ignored: Counter[str] = Counter()
    other = raw.filter(~is_event & ph.is_not_null() & (ph != META_PHASE))
    if other.height:
        for phase, count in other["ph"].value_counts().iter_rows():
            ignored[phase] = count

    events = candidates.select(
        pl.lit(rank, dtype=pl.Int32).alias("rank"),
        pl.col("name"),
        _category(candidates["cat"]),
        ph,
        pl.col("ts"),
        pl.col("dur"),
        pl.col("pid"),
        # GPU rows of PyTorch 1.9 traces have tid "stream 7": the stream is the tid
        pl.coalesce(pl.col("tid"), pl.col("stream")).alias("tid"),
        pl.col("device"),
        pl.col("stream"),
        pl.col("correlation"),
        pl.coalesce(pl.col("external_id"), pl.col("external_id_legacy")).alias("external_id"),
        pl.coalesce(pl.col("bytes"), pl.col("memory_bytes")).alias("bytes"),
        pl.col("total_allocated"),
        pl.col("total_reserved"),
        pl.col("device_type").alias("memory_device_type"),
        pl.col("device_id").alias("memory_device_id"),
    ).sort("ts", maintain_order=True)

    flows = (
        raw_flows.filter(pl.col("ts").is_not_null())
        .select(
            pl.lit(rank, dtype=pl.Int32).alias("rank"),
            ph,
            pl.col("cat").str.to_lowercase(),
            pl.col("name"),
            pl.col("id"),
            pl.col("ts"),
            pl.col("pid"),
            pl.col("tid"),
        )
        .cast(FLOW_SCHEMA)  # type: ignore[arg-type]
    )
    return Normalised(
        events=events.cast(EVENT_SCHEMA),  # type: ignore[arg-type]
        flows=flows,
        skipped=skipped,
        ignored_phases=ignored,
    )
