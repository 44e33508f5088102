"""A comparison of two analyses as cards and a table (ratios are B / A)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

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
        verdict = {True: "better", False: "worse", None: "—"}[row.improved]
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


def headline(rows: Sequence[Any]) -> str | None:
    """'B runs 2.41× the throughput of A' — the one line a comparison is about."""
    for row in rows:
        if row.key == "throughput" and row.ratio is not None:
            return f"B has {fmt_ratio(row.ratio)} the throughput of A ({row.unit})."
    return None


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


def comparison_card(row: Any) -> CompareCard:
    """One metric card: B's value and its change against A (green when it improved)."""
    formatter = _UNIT_FORMAT.get(row.unit, fmt_number)
    delta = None
    if row.unit == "%" and row.delta is not None:
        # a share is compared in percentage points: 60 % -> 5 % is "-55 points"
        delta = f"{row.delta:+.1f} points"
    elif row.ratio is not None:
        change_pct = (row.ratio - 1.0) * 100.0
        delta = f"{change_pct:+.0f} % ({fmt_ratio(row.ratio)})"
    colour = {"higher": "normal", "lower": "inverse"}.get(row.better, "off")
    label = row.label[:1].upper() + row.label[1:]
    value = formatter(row.b)
    if row.unit.endswith("/s"):  # "25.1 samples/s" does not fit a card: the unit goes up
        label, value = f"{label} ({row.unit})", fmt_rate(row.b, "").strip()
    return CompareCard(label, value, delta, colour)
