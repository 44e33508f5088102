"""AnalysisResult-shaped inputs built by hand from the contracts (INTERFACES.md), with a real
run folder written through diagnostics.runs, for the renderer tests that must control every
string (hostile names) and every number (cost arithmetic)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from diagnostics.rules.base import Finding, Fix, Severity, Skipped
from diagnostics.runs import RunFolder, RunWriter
from diagnostics.sources import RunData, TraceFacts

HOSTILE = "<script>alert(1)</script>"
BREAKOUT = '</script><script>alert("x")</script><!--'
# A name that would split a Markdown table cell (three pipes, one doubled) if a cell left it raw.
PIPED = "rank|0 || stream|7"


@dataclass(frozen=True)
class HandResult:
    source: dict[str, Any]
    summary: dict[str, Any]
    facts: TraceFacts | None
    run: RunData | None
    findings: tuple[Finding, ...]
    skipped: tuple[Skipped, ...] = ()
    warnings: tuple[str, ...] = ()
    environment: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "pipeline-doctor/analysis/v1",
            "source": self.source,
            "environment": self.environment,
            "summary": self.summary,
            "findings": [f.to_dict() for f in self.findings],
            "skipped": [{"rule": s.rule, "reason": s.reason} for s in self.skipped],
            "warnings": list(self.warnings),
        }


def finding(
    rule: str,
    severity: Severity,
    saving: float | None = None,
    *,
    title: str | None = None,
    evidence: dict[str, Any] | None = None,
    code: str = "loader = DataLoader(ds, num_workers=4)",
    patch: dict[str, Any] | None = None,
) -> Finding:
    return Finding(
        rule=rule,
        severity=severity,
        title=title or f"{rule} fired",
        evidence=evidence or {"data_wait_ms": 40.0},
        recommendation=f"Fix {rule}.",
        fix=Fix(code=code, config_patch=patch),
        estimated_saving_pct=saving,
    )


def write_run(
    runs_dir: Path,
    *,
    run_id: str,
    steps: list[dict[str, Any]],
    samples: list[dict[str, Any]] = (),
    config: dict[str, Any] | None = None,
    environment: dict[str, Any] | None = None,
    parent_run_id: str | None = None,
    applied_patch: dict[str, Any] | None = None,
) -> RunData:
    writer = RunWriter.create(
        runs_dir,
        config=config
        or {"scenario": "healthy", "data": {"rows": 1000}, "train": {"batch_size": 8}},
        environment=environment or {"device": "cpu", "pytorch_version": "2.9.0", "cpu_count": 2},
        run_id=run_id,
        parent_run_id=parent_run_id,
        applied_patch=applied_patch,
        total_steps=len(steps),
    )
    for record in steps:
        writer.append_step(record)
    for record in samples:
        writer.append_sample(record)
    writer.finalise("completed")
    return RunData.read(RunFolder(runs_dir / run_id))


def steps_records(n: int, *, data_wait_ms: float, compute_ms: float = 50.0, batch: int = 8):
    """n steps of data wait + 2 ms copy + compute + 5 ms optimizer + 3 ms unaccounted."""
    step_time = data_wait_ms + 2.0 + compute_ms + 5.0 + 3.0
    return [
        {
            "step": s,
            "epoch": 0,
            "phase": "finetune",
            "wall_time": 1000.0 + s * step_time / 1000.0,
            "step_time_ms": step_time,
            "data_wait_ms": data_wait_ms,
            "h2d_ms": 2.0,
            "compute_ms": compute_ms,
            "optimizer_ms": 5.0,
            "loss": 2.0 - 0.01 * s,
            "grad_norm": 1.0,
            "lr": 1e-3,
            "batch_size": batch,
            "samples_per_s": batch / (step_time / 1000.0),
            "rss_bytes": (500 + s) * 1024 * 1024,
            "profiled": False,
        }
        for s in range(1, n + 1)
    ]


def trace_facts(
    op_name: str = "aten::addmm", kernel_name: str = "volta_sgemm_128x64_nn"
) -> TraceFacts:
    empty = pl.DataFrame()
    return TraceFacts(
        device="cuda",
        steps=pl.DataFrame(
            {
                "step": [1, 2],
                "start_us": [0.0, 10_000.0],
                "end_us": [10_000.0, 20_000.0],
                "dur_us": [10_000.0, 10_000.0],
            }
        ),
        steps_inferred=False,
        breakdown=pl.DataFrame(
            {
                "step": [1, 2],
                "kernel_us": [6000.0, 6000.0],
                "memcpy_us": [1000.0, 1000.0],
                "memset_us": [0.0, 0.0],
                "runtime_us": [500.0, 500.0],
                "dataloader_us": [2000.0, 2000.0],
                "cpu_exec_us": [300.0, 300.0],
                "other_us": [200.0, 200.0],
                "total_us": [10_000.0, 10_000.0],
            }
        ),
        gpu=pl.DataFrame(
            {"device": [0], "busy_us": [14_000.0], "span_us": [20_000.0], "utilization_pct": [70.0]}
        ),
        idle_gaps=empty,
        operators=pl.DataFrame(
            {
                "name": [op_name, "aten::relu"],
                "calls": [10, 5],
                "host_us": [900.0, 100.0],
                "device_us": [9000.0, 1000.0],
            }
        ),
        kernels=pl.DataFrame(
            {
                "name": [kernel_name, "elementwise"],
                "calls": [10, 5],
                "device_us": [8000.0, 500.0],
                "mean_us": [800.0, 100.0],
                "tensor_core": [False, False],
                "fp16": [False, False],
            }
        ),
        copies=empty,
        syncs=empty,
        sync_per_step=empty,
        launches=empty,
        memory=pl.DataFrame(
            {
                "ts_us": [0.0, 5.0],
                "device": [0, 0],
                "allocated_bytes": [1 << 30, 3 << 30],
                "reserved_bytes": [2 << 30, 4 << 30],
            }
        ),
        device_properties=({"name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_000_000_000},),
        distributed={"backend": "nccl", "rank": 3, "world_size": 8},
        pytorch_version="2.1.0",
    )


def trace_summary() -> dict[str, Any]:
    return {
        "device": "cuda",
        "steps": 2,
        "step_time_ms": {"mean": 10.0, "p50": 10.0, "p95": 10.0},
        "breakdown_pct": {
            "kernel": 60.0,
            "memcpy": 10.0,
            "memset": 0.0,
            "runtime": 5.0,
            "dataloader": 20.0,
            "cpu_exec": 3.0,
            "other": 2.0,
        },
        "gpu_utilization_pct": 70.0,
        "gpu_busy_us": 14_000.0,
        "gpu_idle_breakdown_pct": {"host_wait": 80.0, "kernel_wait": 15.0, "other": 5.0},
    }


def trace_result(findings: tuple[Finding, ...] = (), **facts_kwargs: str) -> HandResult:
    return HandResult(
        source={
            "kind": "trace",
            "path": "uploads/rank3.json.gz",
            "files": ["uploads/rank3.json.gz"],
            "ranks": [3],
        },
        summary=trace_summary(),
        facts=trace_facts(**facts_kwargs),
        run=None,
        findings=findings,
        environment={
            "pytorch_version": "2.1.0",
            "device": "cuda",
            "gpu_name": "NVIDIA A100-SXM4-80GB",
        },
    )


def run_result(run: RunData, findings: tuple[Finding, ...] = (), **kwargs: Any) -> HandResult:
    return HandResult(
        source={"kind": "run", "path": str(run.folder.path), "files": [], "ranks": []},
        summary={
            "device": "cpu",
            "steps": run.steps.height,
            "step_time_ms": None,
            "breakdown_pct": None,
            "gpu_utilization_pct": None,
            "gpu_busy_us": None,
            "gpu_idle_breakdown_pct": None,
        },
        facts=None,
        run=run,
        findings=findings,
        environment=dict(run.environment),
        **kwargs,
    )
