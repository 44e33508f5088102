"""A comparison of two analyses as cards and a table (ratios are B / A)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from diagnostics.report import fmt as report_fmt
from diagnostics.views.config import _config_text
from diagnostics.views.fmt import fmt_bytes, fmt_ms, fmt_number, fmt_pct, fmt_rate, fmt_ratio

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
    label: str
    value: str  # B's value
    delta: str | None  # signed change vs A, e.g. "+141 % (2.41×)"
    delta_color: str  # streamlit's: "normal" (up is good), "inverse" (down is good), "off"
    delta_arrow: str = "auto"  # streamlit's: "auto" (by the sign), "off" (no arrow)


def comparison_card(row: Any) -> CompareCard:
    """One metric card: B's value and its change against A (green when it improved). An
    unchanged value (equal, or within compare.SAME_WITHIN) says so, with no arrow or colour:
    a red "↑ +0 %" would call noise a regression."""
    formatter = _UNIT_FORMAT.get(row.unit, fmt_number)
    label = row.label[:1].upper() + row.label[1:]
    value = formatter(row.b)
    if row.unit.endswith("/s"):  # "25.1 samples/s" does not fit a card: the unit goes up
        label, value = f"{label} ({row.unit})", fmt_rate(row.b, "").strip()
    if row.delta is not None and row.improved is None and row.better != "neither":
        return CompareCard(label, value, "unchanged", "off", "off")
    delta = None
    if row.unit == "%" and row.delta is not None:
        # a share is compared in percentage points: 60 % -> 5 % is "-55 points"
        delta = f"{row.delta:+.1f} points"
    elif row.ratio is not None:
        change_pct = (row.ratio - 1.0) * 100.0
        delta = f"{change_pct:+.0f} % ({fmt_ratio(row.ratio)})"
    colour = {"higher": "normal", "lower": "inverse"}.get(row.better, "off")
    return CompareCard(label, value, delta, colour)
