"""The headline numbers of a trace's facts, in the result JSON's ``summary`` shape.

Offered to the result builder so the JSON, the text summary and the reports quote the same
figures computed the same way. Keys are always present; None where not applicable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from diagnostics.facts.breakdown import breakdown_pct
from diagnostics.facts.idle import ACTIVITIES, idle_breakdown_pct

if TYPE_CHECKING:
    from diagnostics.sources import TraceFacts


def step_time_ms(durations_us: pl.Series) -> dict[str, float | None]:
    """mean, p50, p95 of step durations, ms (p95 by linear interpolation)."""
    if durations_us.len() == 0:
        return {"mean": None, "p50": None, "p95": None}
    ms = durations_us.cast(pl.Float64) / 1000.0
    return {
        "mean": float(ms.mean()),
        "p50": float(ms.quantile(0.5, "linear")),
        "p95": float(ms.quantile(0.95, "linear")),
    }


def idle_host_activity_pct(gaps: pl.DataFrame) -> dict[str, float] | None:
    """Share of GPU idle time by what the host did meanwhile, % (dataloader, sync,
    pageable_copy, cpu_ops, none)."""
    total = float(gaps["dur_us"].sum()) if gaps.height else 0.0
    if total <= 0:
        return None
    sums = dict(gaps.group_by("host_activity").agg(pl.col("dur_us").sum()).iter_rows())
    return {k: float(sums.get(k, 0.0)) / total * 100.0 for k in (*ACTIVITIES, "none")}


OVERLAP_KEYS: tuple[str, ...] = (
    "gpu_copy_us",
    "gpu_copy_overlap_us",
    "gpu_copy_overlap_pct",
    "gpu_comm_us",
    "gpu_comm_overlap_us",
    "gpu_comm_overlap_pct",
)


def overlap_summary(gpu: pl.DataFrame) -> dict[str, float | None]:
    """Copy and communication time and how much of each overlapped compute kernels (facts.gpu
    rows summed over devices); every OVERLAP_KEYS key, null without a GPU, the shares null
    when there was no copy (communication) to overlap."""
    out: dict[str, float | None] = dict.fromkeys(OVERLAP_KEYS)
    if gpu.height == 0:
        return out
    for kind in ("copy", "comm"):
        if f"{kind}_busy_us" not in gpu.columns:  # a hand-built frame (rule examples)
            continue
        total = float(gpu[f"{kind}_busy_us"].sum())
        overlap = float(gpu[f"{kind}_overlap_us"].sum())
        out[f"gpu_{kind}_us"] = total
        out[f"gpu_{kind}_overlap_us"] = overlap
        out[f"gpu_{kind}_overlap_pct"] = 100.0 * overlap / total if total > 0 else None
    return out


def trace_summary(facts: TraceFacts) -> dict[str, Any]:
    """device, steps, steps_inferred, step_time_ms, breakdown_pct, gpu_utilization_pct,
    gpu_busy_us, gpu_busy_pct, gpu_idle_breakdown_pct, gpu_idle_host_activity_pct and the
    OVERLAP_KEYS.

    With several GPUs, utilisation and busy share are the mean over devices and busy_us their
    sum."""
    gpu = facts.gpu
    has_gpu = gpu.height > 0
    return {
        "device": facts.device,
        "steps": facts.steps.height,
        "steps_inferred": facts.steps_inferred,
        "step_time_ms": step_time_ms(facts.steps["dur_us"]),
        "breakdown_pct": breakdown_pct(facts.breakdown),
        "gpu_utilization_pct": float(gpu["utilization_pct"].mean()) if has_gpu else None,
        "gpu_busy_us": float(gpu["busy_us"].sum()) if has_gpu else None,
        "gpu_busy_pct": float(gpu["busy_pct"].mean()) if has_gpu else None,
        "gpu_idle_breakdown_pct": idle_breakdown_pct(facts.idle_gaps) if has_gpu else None,
        "gpu_idle_host_activity_pct": (
            idle_host_activity_pct(facts.idle_gaps) if has_gpu else None
        ),
        **overlap_summary(gpu),
    }
