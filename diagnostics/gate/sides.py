"""One side of a gate: what it compares of a run, a trace or a stored baseline.

A side keeps the steady-state step times themselves (the significance test needs the
sample, not its median), the job's batch per step (for throughput), the peak memory, the
two FLOPs utilisations when the analysis computed them, and the findings by rule. A stored baseline
(``--save-baseline``) is this and nothing more: a small JSON a repository can keep in git,
not the run folder.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from diagnostics.compare import result_label
from diagnostics.errors import InputError
from diagnostics.metrics import finite_or_none, key_metrics, steady_steps

BASELINE_SCHEMA = "pipeline-doctor/gate-baseline/v1"
# a baseline is a few kB; a file over this is a trace or something else, not one of ours
BASELINE_MAX_BYTES = 8 << 20


@dataclass(frozen=True)
class FindingRef:
    rule: str
    severity: str
    title: str

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "severity": self.severity, "title": self.title}


@dataclass(frozen=True)
class GateSide:
    label: str
    path: str
    kind: str  # "run", "trace", "ranks" (the analysis' source kind) or "baseline"
    step_times_ms: tuple[float, ...]  # steady-state steps, in step order
    step_source: str | None  # "step records" or "profiler steps"
    job_batch: float | None  # samples a step, all ranks (throughput = job_batch / step)
    peak_memory_bytes: int | None
    peak_memory_kind: str | None  # "CUDA", "host allocated" or "host RSS"
    mfu_pct: float | None  # model FLOPs utilisation from the config, % (facts/mfu.py)
    findings: tuple[FindingRef, ...]
    # hardware FLOPs utilisation from the trace's counted operators, % (facts/mfu.py)
    counted_flops_utilization_pct: float | None = None
    # the peaks the two are shares of: figures on different peaks are not compared
    mfu_basis: str | None = None
    counted_flops_basis: str | None = None
    # each of those steps' time runnable but waiting for a CPU (the training thread's
    # run-queue wait, cpu_wait_ms), in the same order; None where any step lacks it
    cpu_wait_ms: tuple[float, ...] | None = None

    def to_baseline(self) -> dict[str, Any]:
        return {
            "schema": BASELINE_SCHEMA,
            "label": self.label,
            "path": self.path,
            "kind": self.kind,
            "step_source": self.step_source,
            "step_times_ms": list(self.step_times_ms),
            "job_batch": self.job_batch,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_memory_kind": self.peak_memory_kind,
            "mfu_pct": self.mfu_pct,
            "counted_flops_utilization_pct": self.counted_flops_utilization_pct,
            "mfu_basis": self.mfu_basis,
            "counted_flops_basis": self.counted_flops_basis,
            "findings": [f.to_dict() for f in self.findings],
        }


def _metric(result: Any, name: str) -> float | None:
    """A key metric of the analysis (``mfu_pct``, ``counted_flops_utilization_pct``); None,
    shown as unknown, where the analysis could not give it."""
    return finite_or_none(getattr(key_metrics(result), name, None))


def side_from_result(result: Any, path: str) -> GateSide:
    """The gate's view of an AnalysisResult: run step records first (every steady step),
    else the trace's profiler steps."""
    metrics = key_metrics(result)
    run, facts = getattr(result, "run", None), getattr(result, "facts", None)
    times: list[float] = []
    step_source = None
    cpu_wait: tuple[float, ...] | None = None
    if run is not None and run.steps.height:
        steady = steady_steps(run.steps).filter(
            pl.col("step_time_ms").is_not_null()
            & pl.col("step_time_ms").cast(float).is_finite()
            & (pl.col("step_time_ms").cast(float) > 0)
        )
        times = steady["step_time_ms"].cast(float).to_list()
        step_source = "step records"
        if "cpu_wait_ms" in steady.columns and steady["cpu_wait_ms"].null_count() == 0:
            cpu_wait = tuple(steady["cpu_wait_ms"].cast(float).to_list()) or None
    elif facts is not None and facts.steps.height:
        times = (facts.steps["dur_us"].cast(float) / 1000.0).drop_nulls().to_list()
        step_source = "profiler steps"
    times = [t for t in times if math.isfinite(t) and t > 0]
    job_batch = None
    if metrics.samples_per_s is not None and metrics.steps_per_s:
        job_batch = metrics.samples_per_s / metrics.steps_per_s  # batch x world size
    return GateSide(
        label=result_label(result),
        path=path,
        kind=str((getattr(result, "source", None) or {}).get("kind") or "trace"),
        step_times_ms=tuple(times),
        step_source=step_source if times else None,
        cpu_wait_ms=cpu_wait if cpu_wait is not None and len(cpu_wait) == len(times) else None,
        job_batch=job_batch,
        peak_memory_bytes=metrics.peak_memory_bytes,
        peak_memory_kind=metrics.peak_memory_kind,
        mfu_pct=_metric(result, "mfu_pct"),
        findings=tuple(
            FindingRef(f.rule, str(f.severity), f.title) for f in getattr(result, "findings", ())
        ),
        counted_flops_utilization_pct=_metric(result, "counted_flops_utilization_pct"),
        mfu_basis=key_metrics(result).mfu_peak_basis,
        counted_flops_basis=key_metrics(result).counted_flops_peak_basis,
    )


def is_baseline_file(path: str | Path) -> bool:
    """Whether ``path`` is a stored gate baseline (its first bytes name the schema)."""
    path = Path(path)
    if not path.is_file() or path.suffix.lower() != ".json":
        return False
    try:
        with path.open("rb") as handle:
            head = handle.read(256)
    except OSError:
        return False
    return BASELINE_SCHEMA.encode() in head


def _field(doc: dict[str, Any], path: str, key: str, kind: type | tuple[type, ...]) -> Any:
    value = doc.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise InputError(path, f"baseline field {key!r} is not a {getattr(kind, '__name__', kind)}")
    return value


def load_baseline(path: str | Path) -> GateSide:
    """A side from a stored baseline; InputError (one line naming the file and field) for
    anything that is not one."""
    name = str(path)
    try:
        size = Path(path).stat().st_size
        if size > BASELINE_MAX_BYTES:
            raise InputError(name, f"{size} bytes is too large for a gate baseline")
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(name, f"cannot read the baseline ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(name, f"not a JSON gate baseline ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != BASELINE_SCHEMA:
        raise InputError(name, f"field 'schema' is not {BASELINE_SCHEMA!r}")
    times = _field(doc, name, "step_times_ms", list) or []
    if not all(
        isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0
        for t in times
    ):
        raise InputError(name, "field 'step_times_ms' must list positive step times in ms")
    findings = []
    for item in _field(doc, name, "findings", list) or []:
        if not isinstance(item, dict) or not isinstance(item.get("rule"), str):
            raise InputError(name, "field 'findings' must list objects with a 'rule'")
        findings.append(
            FindingRef(item["rule"], str(item.get("severity", "")), str(item.get("title", "")))
        )
    peak = _field(doc, name, "peak_memory_bytes", int)
    return GateSide(
        label=str(_field(doc, name, "label", str) or Path(path).name),
        path=name,
        kind="baseline",
        step_times_ms=tuple(float(t) for t in times),
        step_source=_field(doc, name, "step_source", str),
        job_batch=finite_or_none(_field(doc, name, "job_batch", (int, float))),
        peak_memory_bytes=peak,
        peak_memory_kind=_field(doc, name, "peak_memory_kind", str),
        mfu_pct=finite_or_none(_field(doc, name, "mfu_pct", (int, float))),
        findings=tuple(findings),
        counted_flops_utilization_pct=finite_or_none(
            _field(doc, name, "counted_flops_utilization_pct", (int, float))
        ),
        mfu_basis=_field(doc, name, "mfu_basis", str),
        counted_flops_basis=_field(doc, name, "counted_flops_basis", str),
    )
