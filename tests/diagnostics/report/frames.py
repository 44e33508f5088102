"""Small hand-made frames with the documented columns, shared by the report tests."""

from __future__ import annotations

from typing import Any

import polars as pl

from diagnostics.runs import SAMPLE_SCHEMA, STEP_SCHEMA

MIB = 1024 * 1024


def step_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """A steps frame with every STEP_SCHEMA column; missing fields are null."""
    return pl.DataFrame(
        [{name: row.get(name) for name in STEP_SCHEMA} for row in rows], schema=STEP_SCHEMA
    )


def sample_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(
        [{name: row.get(name) for name in SAMPLE_SCHEMA} for row in rows], schema=SAMPLE_SCHEMA
    )


def simple_steps(
    n: int = 10, *, data_wait_ms: float = 30.0, compute_ms: float = 50.0
) -> pl.DataFrame:
    """n steps of data wait + 2 ms copy + compute + 5 ms optimizer + 3 ms unaccounted."""
    rows = []
    for step in range(1, n + 1):
        step_time = data_wait_ms + 2.0 + compute_ms + 5.0 + 3.0
        rows.append(
            {
                "step": step,
                "epoch": 0,
                "phase": "finetune",
                "wall_time": 1_000.0 + step * step_time / 1000.0,
                "step_time_ms": step_time,
                "data_wait_ms": data_wait_ms,
                "h2d_ms": 2.0,
                "compute_ms": compute_ms,
                "optimizer_ms": 5.0,
                "loss": 2.0 - 0.1 * step,
                "grad_norm": 1.0,
                "lr": 1e-3,
                "batch_size": 8,
                "samples_per_s": 8 / (step_time / 1000.0),
                "rss_bytes": (500 + step) * MIB,
                "cuda_allocated_bytes": None,
                "profiled": False,
            }
        )
    return step_frame(rows)
