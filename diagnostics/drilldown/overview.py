"""Overview: the average step split into torch-tb-profiler's categories, in ms and %."""

from __future__ import annotations

import polars as pl

# (breakdown column, label) in torch-tb-profiler's priority order (facts.breakdown.ROLES).
PART_LABELS: tuple[tuple[str, str], ...] = (
    ("kernel_us", "Kernel"),
    ("memcpy_us", "Memcpy"),
    ("memset_us", "Memset"),
    ("runtime_us", "Runtime"),
    ("dataloader_us", "DataLoader"),
    ("cpu_exec_us", "CPU exec"),
    ("other_us", "Other"),
)
OVERVIEW_SCHEMA: dict[str, pl.DataType] = {
    "category": pl.String,
    "mean_ms": pl.Float64,
    "pct": pl.Float64,
}


def step_breakdown_table(breakdown: pl.DataFrame) -> pl.DataFrame:
    """category, mean_ms (per profiled step), pct (of the mean step); a row per category.

    The mean step is what the plugin's "Average Step Time" shows; since the parts of each
    step add up to its duration, the means add up to the mean step and pct to 100.
    """
    if breakdown.height == 0:
        return pl.DataFrame(schema=OVERVIEW_SCHEMA)
    total_us = float(breakdown["total_us"].mean() or 0.0)
    rows = []
    for column, label in PART_LABELS:
        mean_us = float(breakdown[column].fill_null(0.0).mean() or 0.0)
        pct = mean_us / total_us * 100.0 if total_us > 0 else 0.0
        rows.append((label, mean_us / 1000.0, pct))
    return pl.DataFrame(rows, schema=OVERVIEW_SCHEMA, orient="row")
