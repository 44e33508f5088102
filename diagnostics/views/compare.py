"""A comparison of two analyses as cards and a table (ratios are B / A)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from diagnostics.metrics import key_metrics
from diagnostics.report import fmt as report_fmt
from diagnostics.views.analysis import CARD_LABELS
from diagnostics.views.config import _config_text
from diagnostics.views.fmt import fmt_bytes, fmt_ms, fmt_number, fmt_pct, fmt_rate, fmt_ratio
from diagnostics.views.ranks import result_rank_view

_UNIT_FORMAT: dict[str, Callable[[float | None], str]] = {
    "ms": fmt_ms,
    "%": fmt_pct,
    "bytes": fmt_bytes,
    "samples/s": lambda v: fmt_rate(v, "samples/s"),
    "steps/s": lambda v: fmt_rate(v, "steps/s"),
}


def comparison_table(rows: Sequence[Any], label_a: str, label_b: str) -> pl.DataFrame:
    """Compare's MetricRows as text: measure, A, B, B ÷ A and a verdict."""
    records = []
    for row in rows:
        formatter = _UNIT_FORMAT.get(row.unit, fmt_number)
        unchanged = row.delta is not None and row.better != "neither"
        verdict = {True: "better", False: "worse", None: "same" if unchanged else "—"}[row.improved]
        records.append(
            {
                "measure": row.label[:1].upper() + row.label[1:],
                label_a: formatter(row.a),
                label_b: formatter(row.b),
                "B ÷ A": fmt_ratio(row.ratio),
                "change": verdict,
            }
        )
    return pl.DataFrame(
        records,
        schema={
            "measure": pl.String,
            label_a: pl.String,
            label_b: pl.String,
            "B ÷ A": pl.String,
            "change": pl.String,
        },
    )


def headline(comparison: Any) -> str | None:
    """'B is 1.34× faster: median step 133 ms → 99.1 ms': the median step-time ratio, the
    one line a comparison is about (throughput is derived from the same medians)."""
    return report_fmt.speedup_headline(
        comparison.speedup,
        comparison.metrics_a.median_step_time_ms,
        comparison.metrics_b.median_step_time_ms,
    )


def config_changes_table(changes: Sequence[tuple[str, Any, Any]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "setting": [c[0] for c in changes],
            "A": [_config_text(c[1]) for c in changes],
            "B": [_config_text(c[2]) for c in changes],
        },
        schema={"setting": pl.String, "A": pl.String, "B": pl.String},
    )


@dataclass(frozen=True)
class CompareCard:
    label: str  # short, as on a run's cards; the full name is the help
    value: str  # B's value
    delta: str | None  # signed change vs A, e.g. "+141 % (2.41×)"
    delta_color: str  # streamlit's: "normal" (up is good), "inverse" (down is good), "off"
    delta_arrow: str = "auto"  # streamlit's: "auto" (by the sign), "off" (no arrow)
    help: str | None = None


def comparison_card(row: Any) -> CompareCard:
    """One metric card: B's value and its change against A (green when it improved). An
    unchanged value (equal, or within compare.SAME_WITHIN) says so, with no arrow or colour:
    a red "↑ +0 %" would call noise a regression."""
    formatter = _UNIT_FORMAT.get(row.unit, fmt_number)
    full = row.label[:1].upper() + row.label[1:]
    label = CARD_LABELS.get(row.key, full)
    value = formatter(row.b)
    if row.unit.endswith("/s"):  # "25.1 samples/s" does not fit a card: the unit goes up
        label, value = row.unit[:1].upper() + row.unit[1:], fmt_rate(row.b, "").strip()
    if row.delta is not None and row.improved is None and row.better != "neither":
        return CompareCard(label, value, "unchanged", "off", "off", help=full)
    delta = None
    if row.unit == "%" and row.delta is not None:
        # a share is compared in percentage points: 60 % -> 5 % is "-55 points"
        delta = f"{row.delta:+.1f} points"
    elif row.ratio is not None and row.unit == "ms" and row.ratio > 0:
        # a time: how much less (or more) and the speed that is; 94 % less is 16.5x faster
        change_pct = (row.ratio - 1.0) * 100.0
        speed = (
            f"{fmt_ratio(1.0 / row.ratio)} faster"
            if row.ratio < 1.0
            else f"{fmt_ratio(row.ratio)} slower"
        )
        delta = f"{change_pct:+.0f} % ({speed})"
    elif row.ratio is not None:
        change_pct = (row.ratio - 1.0) * 100.0
        delta = f"{change_pct:+.0f} % ({fmt_ratio(row.ratio)})"
    colour = {"higher": "normal", "lower": "inverse"}.get(row.better, "off")
    return CompareCard(label, value, delta, colour, help=full)


def _rank_figures(result: Any) -> dict[str, Any]:
    """A result's rank figures for Compare: from its per-rank view when it is a distributed
    run, else its single process as rank 0 (the median step, as the cards say)."""
    view = result_rank_view(result)
    if view is None:
        median = key_metrics(result).median_step_time_ms
        return {
            "ranks": 1,
            "median": median,
            "slowest": median,
            "slowest_rank": 0 if median is not None else None,
            "stragglers": (),
            "data_wait": None,
            "data_wait_rank": None,
        }
    waits = view.table.filter(pl.col("data_wait_ms").is_not_null()).sort(
        "data_wait_ms", descending=True, maintain_order=True
    )
    slowest = view.rank_row(view.slowest_rank) if view.slowest_rank is not None else {}
    return {
        "ranks": view.world_size,
        "median": view.median_rank_step_ms,
        "slowest": slowest.get("step_time_ms"),
        "slowest_rank": view.slowest_rank,
        "stragglers": view.straggler_ranks,
        "data_wait": waits["data_wait_ms"][0] if waits.height else None,
        "data_wait_rank": waits["rank"][0] if waits.height else None,
    }


def _at_rank(value: float | None, rank: int | None) -> str:
    return fmt_ms(value) if value is None or rank is None else f"{fmt_ms(value)} (rank {rank})"


def rank_comparison_table(
    result_a: Any, result_b: Any, label_a: str, label_b: str
) -> pl.DataFrame | None:
    """Ranks beside each other for Compare: how many, the median rank's and the slowest
    rank's median step time, the rank waiting longest for data, the stragglers the
    rank-stragglers rule named. None when both are single-process (nothing to add)."""
    a, b = _rank_figures(result_a), _rank_figures(result_b)
    if a["ranks"] < 2 and b["ranks"] < 2:
        return None

    def ratio(key: str) -> str:
        return fmt_ratio(b[key] / a[key]) if a[key] and b[key] is not None else "—"

    def named(figures: dict[str, Any]) -> str:
        if figures["ranks"] < 2:
            return "—"
        return ", ".join(str(r) for r in figures["stragglers"]) or "none"

    rows = [
        ("Ranks", str(a["ranks"]), str(b["ranks"]), fmt_ratio(b["ranks"] / a["ranks"])),
        ("Median rank's step time", fmt_ms(a["median"]), fmt_ms(b["median"]), ratio("median")),
        (
            "Slowest rank's step time",
            _at_rank(a["slowest"], a["slowest_rank"]),
            _at_rank(b["slowest"], b["slowest_rank"]),
            ratio("slowest"),
        ),
        (
            "Longest data wait on one rank",
            _at_rank(a["data_wait"], a["data_wait_rank"]),
            _at_rank(b["data_wait"], b["data_wait_rank"]),
            ratio("data_wait"),
        ),
        ("Straggler ranks (rank-stragglers)", named(a), named(b), "—"),
    ]
    return pl.DataFrame(
        rows,
        schema={"measure": pl.String, label_a: pl.String, label_b: pl.String, "B ÷ A": pl.String},
        orient="row",
    )
