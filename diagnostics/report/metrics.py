"""The headline numbers of one analysis: what the summary table, the comparison and the
cost estimate share.

A run's step records cover every step, a trace only the profiler's window, so run records
are preferred when both exist. The first step of a run is left out of means and throughput
when there are more than two: it carries DataLoader worker start-up and lazy CUDA
initialisation that the steady state does not pay again.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import polars as pl


@dataclass(frozen=True)
class KeyMetrics:
    device: str | None
    steps: int | None
    median_step_time_ms: float | None
    mean_step_time_ms: float | None
    p95_step_time_ms: float | None
    steps_per_s: float | None
    samples_per_s: float | None
    data_wait_pct: float | None  # share of step time blocked waiting for the next batch
    gpu_utilization_pct: float | None
    peak_memory_bytes: int | None
    peak_memory_kind: str | None  # "CUDA" (device) or "host RSS"
    source: str  # "run" (step records) or "trace"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _steady(steps: pl.DataFrame) -> pl.DataFrame:
    ordered = steps.filter(pl.col("step_time_ms").is_not_null()).sort("step")
    return ordered.slice(1) if ordered.height > 2 else ordered


def _run_metrics(run: Any) -> dict[str, Any]:
    steps: pl.DataFrame = run.steps
    samples: pl.DataFrame = run.samples
    out: dict[str, Any] = {"steps": int(steps.height)}
    if steps.height == 0 or steps["step_time_ms"].null_count() == steps.height:
        return out
    steady = _steady(steps)
    step_time = steady["step_time_ms"].cast(pl.Float64)
    total_ms = float(step_time.sum())
    out["median_step_time_ms"] = _finite(step_time.median())
    out["mean_step_time_ms"] = _finite(step_time.mean())
    out["p95_step_time_ms"] = _finite(step_time.quantile(0.95, "linear"))
    if total_ms > 0:
        out["steps_per_s"] = steady.height / (total_ms / 1000.0)
        if steady["batch_size"].null_count() < steady.height:
            out["samples_per_s"] = float(steady["batch_size"].fill_null(0).sum()) / (
                total_ms / 1000.0
            )
        if steady["data_wait_ms"].null_count() < steady.height:
            out["data_wait_pct"] = (
                100.0 * float(steady["data_wait_ms"].fill_null(0).sum()) / total_ms
            )
    gpu_rows = samples.filter(pl.col("gpu_util_pct").is_not_null()) if samples.height else samples
    if gpu_rows.height and "wall_time" in steps.columns:
        # Only samples taken while steps ran: start-up and shutdown idle is not the loop's.
        first, last = steps["wall_time"].min(), steps["wall_time"].max()
        if first is not None and last is not None:
            during = gpu_rows.filter(pl.col("wall_time").is_between(first, last))
            gpu_rows = during if during.height else gpu_rows
        out["gpu_utilization_pct"] = _finite(gpu_rows["gpu_util_pct"].mean())
    for column in ("cuda_peak_bytes", "cuda_allocated_bytes"):
        peak = steps[column].max() if column in steps.columns else None
        if peak is not None:
            out["peak_memory_bytes"], out["peak_memory_kind"] = int(peak), "CUDA"
            break
    else:
        peak = steps["rss_bytes"].max()
        if peak is not None:
            out["peak_memory_bytes"], out["peak_memory_kind"] = int(peak), "host RSS"
    return out


def _trace_metrics(summary: dict[str, Any], facts: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    step_time = summary.get("step_time_ms") or {}
    out["steps"] = summary.get("steps")
    out["median_step_time_ms"] = _finite(step_time.get("p50"))
    out["mean_step_time_ms"] = _finite(step_time.get("mean"))
    out["p95_step_time_ms"] = _finite(step_time.get("p95"))
    if out["mean_step_time_ms"]:
        out["steps_per_s"] = 1000.0 / out["mean_step_time_ms"]
    breakdown = summary.get("breakdown_pct") or {}
    out["data_wait_pct"] = _finite(summary.get("data_wait_pct"))
    if out["data_wait_pct"] is None:
        out["data_wait_pct"] = _finite(breakdown.get("dataloader"))
    out["gpu_utilization_pct"] = _finite(summary.get("gpu_utilization_pct"))
    memory = getattr(facts, "memory", None)
    if isinstance(memory, pl.DataFrame) and memory.height and "allocated_bytes" in memory.columns:
        device_rows = memory.filter(pl.col("device") >= 0) if "device" in memory.columns else memory
        if device_rows.height:
            out["peak_memory_bytes"] = int(device_rows["allocated_bytes"].max())
            out["peak_memory_kind"] = "CUDA"
        else:
            out["peak_memory_bytes"] = int(memory["allocated_bytes"].max())
            out["peak_memory_kind"] = "host allocated"
    if out.get("peak_memory_bytes") is None and _finite(summary.get("peak_memory_bytes")):
        out["peak_memory_bytes"] = int(summary["peak_memory_bytes"])
        out["peak_memory_kind"] = "CUDA"
    return out


def key_metrics(result: Any) -> KeyMetrics:
    """Headline numbers of an AnalysisResult: run records first, the trace's summary after."""
    summary = dict(getattr(result, "summary", None) or {})
    facts = getattr(result, "facts", None)
    run = getattr(result, "run", None)
    values: dict[str, Any] = {}
    source = "trace"
    if run is not None and run.steps.height:
        values = _run_metrics(run)
        source = "run"
        # The sampler may be off; the trace's utilisation still tells.
        trace_values = _trace_metrics(summary, facts)
        for key in ("gpu_utilization_pct", "peak_memory_bytes", "peak_memory_kind"):
            if values.get(key) is None and trace_values.get(key) is not None:
                values[key] = trace_values[key]
    else:
        values = _trace_metrics(summary, facts)
    device = summary.get("device") or getattr(facts, "device", None)
    if device is None and run is not None:
        device = (run.environment or {}).get("device")
    return KeyMetrics(
        device=device,
        steps=values.get("steps"),
        median_step_time_ms=values.get("median_step_time_ms"),
        mean_step_time_ms=values.get("mean_step_time_ms"),
        p95_step_time_ms=values.get("p95_step_time_ms"),
        steps_per_s=values.get("steps_per_s"),
        samples_per_s=values.get("samples_per_s"),
        data_wait_pct=values.get("data_wait_pct"),
        gpu_utilization_pct=values.get("gpu_utilization_pct"),
        peak_memory_bytes=values.get("peak_memory_bytes"),
        peak_memory_kind=values.get("peak_memory_kind"),
        source=source,
    )
