"""Small builders for hand-made rule inputs: each rule's ``examples`` and the unit tests.

``trace(...)`` makes a TraceFacts whose frames default to empty (with the columns listed in
diagnostics/model.py) and ``run(...)`` a RunData whose frames follow STEP_SCHEMA and
SAMPLE_SCHEMA, so an example only spells out the numbers it is about.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from diagnostics.facts.comm_ranks import CollectiveMatch
from diagnostics.facts.sync_sites import SYNC_SITES_SCHEMA
from diagnostics.model import AnalysisInputs
from diagnostics.runs import (
    MEMORY_LINE_SCHEMA,
    SAMPLE_SCHEMA,
    STEP_SCHEMA,
    RunFolder,
    RunManifest,
    RunStatus,
)
from diagnostics.sources import RunData, TraceFacts

F, N, S, B = pl.Float64, pl.Int64, pl.String, pl.Boolean

TRACE_FRAME_SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "steps": {"step": N, "start_us": F, "end_us": F, "dur_us": F},
    "breakdown": {
        "step": N,
        "kernel_us": F,
        "memcpy_us": F,
        "memset_us": F,
        "runtime_us": F,
        "dataloader_us": F,
        "cpu_exec_us": F,
        "other_us": F,
        "total_us": F,
    },
    "gpu": {"device": N, "busy_us": F, "span_us": F, "utilization_pct": F},
    "idle_gaps": {
        "device": N,
        "stream": N,
        "start_us": F,
        "end_us": F,
        "dur_us": F,
        "idle_kind": S,
        "host_activity": S,
    },
    "operators": {"name": S, "calls": N, "host_us": F, "device_us": F},
    "kernels": {
        "name": S,
        "calls": N,
        "device_us": F,
        "mean_us": F,
        "tensor_core": B,
        "fp16": B,
    },
    "copies": {
        "direction": S,
        "src_memory": S,
        "dst_memory": S,
        "count": N,
        "bytes": N,
        "dur_us": F,
        "bandwidth_gb_s": F,
    },
    "syncs": {"name": S, "count": N, "total_us": F},
    "sync_per_step": {"step": N, "sync_us": F, "sync_count": N},
    "launches": {
        "name": S,
        "count": N,
        "kernel_us_mean": F,
        "launch_us_mean": F,
        "launch_delay_us_mean": F,
        "short_count": N,
    },
    "memory": {"ts_us": F, "device": N, "allocated_bytes": N, "reserved_bytes": N},
    "ranks": {
        "rank": N,
        "steps": N,
        "step_time_ms_mean": F,
        "step_time_ms_p50": F,
        "gpu_utilization_pct": F,
    },
    "op_half_dtypes": {"dtype": S, "ops": N},
}

Rows = Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]]


def frame(rows: Rows | None, schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    """A frame with exactly ``schema``'s columns from row dicts or column lists."""
    if rows is None:
        return pl.DataFrame(schema=dict(schema))
    if isinstance(rows, Mapping):
        length = max((len(v) for v in rows.values()), default=0)
        columns = {name: list(rows.get(name, [None] * length)) for name in schema}
    else:
        columns = {name: [row.get(name) for row in rows] for name in schema}
    return pl.DataFrame(columns, schema=dict(schema), strict=False)


def breakdown_rows(steps: int, **per_step_us: float) -> list[dict[str, float]]:
    """``steps`` identical breakdown rows; total_us is the sum of the given parts."""
    parts = {f"{k}_us" if not k.endswith("_us") else k: v for k, v in per_step_us.items()}
    total = sum(parts.values())
    return [{"step": s + 1, **parts, "total_us": total} for s in range(steps)]


def step_rows(steps: int, step_us: float) -> list[dict[str, float]]:
    return [
        {"step": s + 1, "start_us": s * step_us, "end_us": (s + 1) * step_us, "dur_us": step_us}
        for s in range(steps)
    ]


def gpu_rows(busy_us: float, span_us: float = 50_000.0) -> list[dict[str, float]]:
    """One GPU's busy time over the steps' span; utilisation follows as busy / span."""
    return [
        {
            "device": 0,
            "busy_us": busy_us,
            "span_us": span_us,
            "utilization_pct": 100.0 * busy_us / span_us,
        }
    ]


def trace(
    device: str = "cuda",
    *,
    steps: int = 5,
    step_us: float = 10_000.0,
    compute_capability: tuple[int, int] | None = (8, 0),
    device_memory_bytes: int | None = 80 * 2**30,
    sync_sites: Rows | None = None,
    **frames: Rows,
) -> TraceFacts:
    """TraceFacts of ``steps`` steps of ``step_us`` each; other frames from ``frames``;
    ``sync_sites`` rows (facts/sync_sites.py) when given, else None (no Python stacks)."""
    props: dict[str, Any] = {}
    if compute_capability is not None and device == "cuda":
        props["computeMajor"], props["computeMinor"] = compute_capability
    if device_memory_bytes is not None and device == "cuda":
        props["totalGlobalMem"] = device_memory_bytes
    built = {
        name: frame(frames.get(name), schema)
        for name, schema in TRACE_FRAME_SCHEMAS.items()
        if name not in ("steps", "ranks")
    }
    unknown = set(frames) - set(TRACE_FRAME_SCHEMAS)
    if unknown:
        raise TypeError(f"unknown trace frames: {sorted(unknown)}")
    return TraceFacts(
        device=device,  # type: ignore[arg-type]
        steps=frame(frames.get("steps") or step_rows(steps, step_us), TRACE_FRAME_SCHEMAS["steps"]),
        steps_inferred=False,
        device_properties=(props,) if props else (),
        ranks=frame(frames["ranks"], TRACE_FRAME_SCHEMAS["ranks"]) if "ranks" in frames else None,
        sync_sites=frame(sync_sites, SYNC_SITES_SCHEMA) if sync_sites is not None else None,
        **built,
    )


def kernel(
    name: str, calls: int, device_us: float, *, tensor_core: bool = False, fp16: bool = False
) -> dict[str, Any]:
    """One kernel-table row (TraceFacts.kernels); the rules classify it from its name."""
    return {
        "name": name,
        "calls": calls,
        "device_us": device_us,
        "mean_us": device_us / calls,
        "tensor_core": tensor_core,
        "fp16": fp16,
    }


def series(n: int, **columns: Any) -> dict[str, list[Any]]:
    """Step-record columns for steps 1..n: a scalar repeats, a callable gets the step."""
    out: dict[str, list[Any]] = {"step": list(range(1, n + 1))}
    for name, value in columns.items():
        if callable(value):
            out[name] = [value(s) for s in range(1, n + 1)]
        elif isinstance(value, list | tuple):
            if len(value) != n:
                raise ValueError(f"{name}: {len(value)} values for {n} steps")
            out[name] = list(value)
        else:
            out[name] = [value] * n
    return out


def cpu_run(steps: int, config: Mapping[str, Any] | None = None, **columns: Any) -> AnalysisInputs:
    """Inputs of a CPU run with ``steps`` step records of these columns (``series``)."""
    return inputs(run=run(series(steps, **columns), config=config, environment=CPU_ENV))


def script_cpu_run(steps: int, probe: Mapping[str, Any], **columns: Any) -> AnalysisInputs:
    """A CPU run of a user's script under ``pipeline-doctor profile``, with what the probe
    summarised in run.json (``probe``) and these step columns."""
    extra = {"kind": "script", "probe": dict(probe)}
    return inputs(run=run(series(steps, **columns), environment=CPU_ENV, extra=extra))


def run(
    steps: Rows | None = None,
    *,
    config: Mapping[str, Any] | None = None,
    environment: Mapping[str, Any] | None = None,
    samples: Rows | None = None,
    memory_lines: Rows | None = None,
    extra: Mapping[str, Any] | None = None,
) -> RunData:
    """RunData without a folder on disk (the path is a placeholder nothing reads)."""
    return RunData(
        folder=RunFolder(Path("example-run")),
        manifest=RunManifest(
            version=1,
            run_id="example-run",
            created_at=0.0,
            config=dict(config or {}),
            environment=dict(environment or {}),
            extra=dict(extra or {}),
        ),
        status=RunStatus(status="completed"),
        steps=frame(steps, STEP_SCHEMA),
        samples=frame(samples, SAMPLE_SCHEMA),
        memory_lines=None if memory_lines is None else frame(memory_lines, MEMORY_LINE_SCHEMA),
    )


CPU_ENV = {"device": "cpu", "cpu_count": 8}
CUDA_ENV = {"device": "cuda", "cpu_count": 8, "gpu_name": "NVIDIA A100-SXM4-80GB"}


def inputs(
    trace: TraceFacts | None = None,
    run: RunData | None = None,
    events: pl.DataFrame | None = None,
    *,
    collective_match: CollectiveMatch | None = None,
) -> AnalysisInputs:
    return AnalysisInputs(trace=trace, run=run, events=events, collective_match=collective_match)
