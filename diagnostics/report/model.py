"""One report model, built from an analysis (a run, a trace, several rank traces) or from a
comparison of two; the HTML, Markdown and JSON renderers only lay it out.

Strings in the model are plain text, exactly as they came from the trace or run: each
renderer escapes them for its own format.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import plotly.graph_objects as go
import polars as pl

from diagnostics.compare import Comparison, result_label
from diagnostics.metrics import KeyMetrics, key_metrics
from diagnostics.report import fmt, plots
from diagnostics.report.memory import MemoryTable, memory_tables
from diagnostics.report.pricing import CostEstimate, Pricing, estimate_cost
from diagnostics.report.sections import (
    environment_rows,
    flat_config,
    gpu_name,
    is_script_patch,
    leak_slope,
    ranks_table,
    rerun_command,
    set_args,
    source_rows,
    spike_steps,
    summary_rows,
    world_size,
)
from diagnostics.severity import SEVERITY_ORDER, order_findings, severity_rank

REPORT_SCHEMA = "pipeline-doctor/report/v1"


@dataclass(frozen=True)
class Chart:
    key: str
    title: str
    figure: go.Figure


@dataclass(frozen=True)
class ReportFinding:
    rule: str
    severity: str  # "high" | "medium" | "low"
    title: str
    recommendation: str
    evidence: dict[str, Any]  # as the rule gave it, without the chart data
    evidence_rows: tuple[tuple[str, str], ...]  # (label, formatted value)
    fix_code: str
    config_patch: dict[str, Any] | None
    set_args: tuple[str, ...]  # the patch as trainer --set arguments
    estimated_saving_pct: float | None
    figure: go.Figure | None = field(default=None, compare=False)
    status: str | None = None  # comparisons: "new" or "kept" (gone ones are listed apart)
    # the command that re-runs with the patch: the trainer's --set, or for a script run
    # pipeline-doctor profile --override (sections.rerun_command); None without a patch
    rerun_command: str | None = None

    @property
    def for_script(self) -> bool:
        """The patch is a script run's DataLoader overrides, not trainer settings."""
        return is_script_patch(self.config_patch)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "title": self.title,
            "recommendation": self.recommendation,
            "evidence": self.evidence,
            "fix": {"code": self.fix_code, "config_patch": self.config_patch},
            "set_args": list(self.set_args),
            "rerun_command": self.rerun_command,
            "estimated_saving_pct": self.estimated_saving_pct,
            "status": self.status,
        }


@dataclass(frozen=True)
class ComparisonSection:
    label_a: str
    label_b: str
    rows: tuple[tuple[str, str, str, str, str], ...]  # label, a, b, ratio b/a, verdict
    gone: tuple[ReportFinding, ...]
    new: tuple[ReportFinding, ...]
    kept: tuple[ReportFinding, ...]  # as found in b
    config_changes: tuple[tuple[str, str, str], ...]  # key, a, b
    data: dict[str, Any]
    cost_a: CostEstimate | None = None  # the measured cost of a, at the same price as b's
    # b re-ran a with a finding's fix: what the finding predicted beside what b measured
    prediction: str | None = None


@dataclass(frozen=True)
class Report:
    kind: str  # "run" | "trace" | "ranks" | "comparison"
    title: str
    generated_at: str  # ISO 8601, UTC
    source_rows: tuple[tuple[str, str], ...]
    environment_rows: tuple[tuple[str, str], ...]
    summary_rows: tuple[tuple[str, str], ...]
    findings: tuple[ReportFinding, ...]  # by severity, then expected saving
    charts: tuple[Chart, ...]
    cost: CostEstimate | None
    skipped: tuple[tuple[str, str], ...]  # (rule, reason)
    warnings: tuple[str, ...]
    config_rows: tuple[tuple[str, str], ...] = ()
    # several ranks: (header, rows) of the per-rank summary, formatted
    ranks_table: tuple[tuple[str, ...], tuple[tuple[str, ...], ...]] | None = None
    notes: tuple[str, ...] = ()  # how the input was read (informational)
    comparison: ComparisonSection | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    analysis: dict[str, Any] = field(default_factory=dict)  # the analyser's JSON document(s)
    # a CUDA memory snapshot's sections (diagnostics.report.memory), empty without one
    memory_tables: tuple[MemoryTable, ...] = ()

    def findings_at_or_above(self, severity: str) -> tuple[ReportFinding, ...]:
        limit = SEVERITY_ORDER[severity]
        return tuple(f for f in self.findings if severity_rank(f.severity) <= limit)


def _severity(finding: Any) -> str:
    return str(getattr(finding.severity, "value", finding.severity)).lower()


def _evidence_rows(evidence: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(fmt.evidence_rows(evidence))


def report_finding(
    finding: Any, status: str | None = None, *, trainer_run: bool = True
) -> ReportFinding:
    """``trainer_run`` False (an uploaded trace): no trainer config patch or --set command,
    only the fix code for the user's own script."""
    evidence = dict(finding.evidence or {})
    patch = finding.fix.config_patch if trainer_run else None
    figure = plots.finding_figure(finding)
    shown = {key: value for key, value in evidence.items() if key != "chart"}
    return ReportFinding(
        rule=str(finding.rule),
        severity=_severity(finding),
        title=str(finding.title),
        recommendation=str(finding.recommendation or ""),
        evidence=shown,
        evidence_rows=_evidence_rows(shown),
        fix_code=str(finding.fix.code or ""),
        config_patch=dict(patch) if patch else None,
        set_args=set_args(patch),
        estimated_saving_pct=finding.estimated_saving_pct,
        figure=figure,
        status=status,
        rerun_command=rerun_command(patch, evidence),
    )


def _charts(result: Any) -> list[Chart]:
    charts: list[Chart] = []
    run = getattr(result, "run", None)
    facts = getattr(result, "facts", None)
    findings = tuple(getattr(result, "findings", ()) or ())
    if run is not None and run.steps.height:
        charts.append(Chart("step_time", "Step time", plots.step_time_figure(run.steps)))
        charts.append(
            Chart(
                "loss_gradnorm",
                "Loss and gradient norm",
                plots.loss_gradnorm_figure(run.steps, spike_steps(findings)),
            )
        )
        slope, column = leak_slope(findings)
        charts.append(
            Chart(
                "memory",
                "Memory",
                plots.memory_figure(run.steps, run.samples, slope, slope_column=column),
            )
        )
    if run is not None and run.samples.height:
        charts.append(Chart("system", "GPU and CPU", plots.system_figure(run.samples)))
    snapshot = getattr(result, "snapshot", None)
    if snapshot is not None:
        from diagnostics.report import memory_plots

        charts.append(
            Chart(
                "memory_timeline", "Memory timeline", memory_plots.memory_timeline_figure(snapshot)
            )
        )
        charts.append(
            Chart(
                "memory_categories", "Memory by category", memory_plots.categories_figure(snapshot)
            )
        )
        charts.append(
            Chart("segment_map", "Segment map", memory_plots.segment_map_figure(snapshot))
        )
    if facts is not None:
        charts.append(
            Chart("breakdown", "Trace breakdown", plots.breakdown_figure(facts.breakdown))
        )
        operators = facts.operators
        if isinstance(operators, pl.DataFrame) and operators.height:
            # Self times: a parent's total repeats its children's, so totals rank a chain
            # of wrappers (autograd::engine -> AddmmBackward0 -> aten::mm) three times.
            if "device_us" in operators.columns and (operators["device_us"].fill_null(0) > 0).any():
                value, what = "device_us", "GPU self time"
            elif "host_self_us" in operators.columns:
                value, what = "host_self_us", "CPU self time"
            else:
                value, what = "host_us", "CPU time"
            charts.append(
                Chart(
                    "top_operators",
                    "Top operators",
                    plots.top_figure(operators, value, title=f"Top operators by {what} (ms)"),
                )
            )
        kernels = facts.kernels
        if isinstance(kernels, pl.DataFrame) and kernels.height:
            charts.append(
                Chart(
                    "top_kernels",
                    "Top kernels",
                    plots.top_figure(kernels, "device_us", title="Top GPU kernels by time (ms)"),
                )
            )
    return charts


# The evidence field holding the share of step (or GPU) time a rule measured and drew its
# saving from; each rule's saving is at most this share (tests/diagnostics/report/test_saving_bound.py).
MEASURED_SHARE_KEYS = {
    "step-time-outliers": "excess_pct_of_step_time",  # slow steps' time beyond the median
    "too-few-workers": "data_wait_share_pct",
    "exposed-communication": "exposed_pct",
    "host-device-sync": "sync_share_pct",  # GPU idle while the host waited in a sync
    "tensor-cores-unused": "cuda_core_gemm_pct",  # GEMMs on CUDA cores, share of GPU time
    "slow-matmul-shape": "slow_gemm_pct_of_step_time",  # the slow GEMMs' time in the steps
}


def measured_share_pct(finding: Any) -> float | None:
    """The share a finding measured (its MEASURED_SHARE_KEYS evidence), else its saving:
    every rule draws its saving from a share it measured."""
    key = MEASURED_SHARE_KEYS.get(getattr(finding, "rule", ""))
    value = (getattr(finding, "evidence", None) or {}).get(key) if key else None
    if value is None:
        value = getattr(finding, "estimated_saving_pct", None)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def saving_bound_pct(metrics: KeyMetrics, findings: Iterable[Any] = ()) -> float | None:
    """The largest measured wait or idle share the findings can explain: the data-wait
    share, the GPU's idle share (100 - utilisation) on a GPU, and each finding's measured
    share, such as the time step-time outliers took beyond the median step (a slowdown in
    the copy or the optimiser is no data wait) or Tensor-Core-eligible GEMM time on a
    GPU that never idles."""
    shares = [metrics.data_wait_pct]
    if metrics.gpu_utilization_pct is not None:
        shares.append(max(0.0, 100.0 - metrics.gpu_utilization_pct))
    shares += [measured_share_pct(f) for f in findings if f.estimated_saving_pct]
    known = [s for s in shares if s is not None and math.isfinite(s)]
    return max(known) if known else None


def _cost(result: Any, metrics: KeyMetrics, pricing: Pricing | None) -> CostEstimate:
    run = getattr(result, "run", None)
    return estimate_cost(
        saving_bound_pct=saving_bound_pct(metrics, getattr(result, "findings", ()) or ()),
        step_time_ms=metrics.mean_step_time_ms,
        config=run.config if run is not None else None,
        savings_pct=[f.estimated_saving_pct for f in getattr(result, "findings", ()) or ()],
        gpu_name=gpu_name(result),
        device=metrics.device,
        world_size=world_size(result),
        pricing=pricing,
        environment=run.environment if run is not None else None,
    )


def _analysis_json(result: Any) -> dict[str, Any]:
    to_json = getattr(result, "to_json", None)
    return dict(to_json()) if callable(to_json) else {}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _metrics_dict(metrics: KeyMetrics) -> dict[str, Any]:
    return {
        key: (None if isinstance(value, float) and not math.isfinite(value) else value)
        for key, value in metrics.to_dict().items()
    }


def build_report(result: Any, *, pricing: Pricing | None = None) -> Report:
    """The report of one AnalysisResult (a run, a trace or several rank traces)."""
    metrics = key_metrics(result)
    source = dict(getattr(result, "source", None) or {})
    kind = str(source.get("kind") or ("run" if getattr(result, "run", None) else "trace"))
    run = getattr(result, "run", None)
    noun = {"run": "run", "ranks": "rank traces", "snapshot": "memory snapshot"}.get(kind, "trace")
    return Report(
        kind=kind,
        title=f"Pipeline Doctor report: {noun} {result_label(result)}",
        generated_at=_now(),
        source_rows=tuple(source_rows(result)),
        environment_rows=tuple(environment_rows(result)),
        summary_rows=tuple(summary_rows(metrics, getattr(result, "summary", None) or {})),
        findings=tuple(
            report_finding(f, trainer_run=run is not None) for f in order_findings(result.findings)
        ),
        charts=tuple(_charts(result)),
        cost=_cost(result, metrics, pricing),
        skipped=tuple((str(s.rule), str(s.reason)) for s in getattr(result, "skipped", ()) or ()),
        warnings=tuple(str(w) for w in getattr(result, "warnings", ()) or ()),
        config_rows=tuple(flat_config(run.config)) if run is not None else (),
        ranks_table=ranks_table(getattr(result, "summary", None) or {}),
        notes=tuple(str(n) for n in getattr(result, "notes", ()) or ()),
        metrics=_metrics_dict(metrics),
        analysis=_analysis_json(result),
        memory_tables=memory_tables(
            (getattr(result, "summary", None) or {}).get("memory_snapshot")
        ),
    )


def _verdict(row: Any) -> str:
    if row.improved is None:
        known = row.delta is not None and row.better != "neither"
        return "same" if known else MISSING_VERDICT
    return "better" if row.improved else "worse"


MISSING_VERDICT = "—"


def build_comparison_report(comparison: Comparison, *, pricing: Pricing | None = None) -> Report:
    """The report of a comparison: a before (a) and an after (b), side by side."""
    a, b = comparison.a, comparison.b
    rows = tuple(
        (
            f"{row.label} ({row.unit})" if row.unit not in ("ms", "%", "bytes") else row.label,
            fmt.unit_value(row.a, row.unit),
            fmt.unit_value(row.b, row.unit),
            fmt.ratio(row.ratio),
            _verdict(row),
        )
        for row in comparison.rows
    )
    kept_rules = {fb.rule for _, fb in comparison.findings_kept}
    b_trainer = getattr(b, "run", None) is not None
    current = [
        report_finding(f, "kept" if f.rule in kept_rules else "new", trainer_run=b_trainer)
        for f in order_findings(b.findings)
    ]
    section = ComparisonSection(
        label_a=comparison.label_a,
        label_b=comparison.label_b,
        rows=rows,
        gone=tuple(
            report_finding(f, "gone", trainer_run=getattr(a, "run", None) is not None)
            for f in order_findings(comparison.findings_gone)
        ),
        new=tuple(f for f in current if f.status == "new"),
        kept=tuple(f for f in current if f.status == "kept"),
        config_changes=tuple(
            (key, fmt.config_literal(va), fmt.config_literal(vb))
            for key, va, vb in comparison.config_changes
        ),
        data=comparison.to_dict(),
        cost_a=_cost(a, comparison.metrics_a, pricing),
        prediction=fmt.prediction_line(comparison.prediction),
    )
    env_a, env_b = dict(environment_rows(a)), dict(environment_rows(b))
    env_rows = tuple(
        (
            label,
            env_a.get(label, MISSING_VERDICT)
            if env_a.get(label) == env_b.get(label)
            else f"{env_a.get(label, MISSING_VERDICT)} → {env_b.get(label, MISSING_VERDICT)}",
        )
        for label in dict.fromkeys([*env_a, *env_b])
    )
    charts: list[Chart] = []
    run_a, run_b = getattr(a, "run", None), getattr(b, "run", None)
    if run_a is not None and run_b is not None:
        charts.append(
            Chart(
                "compare_steps",
                "Step time, before and after",
                plots.compare_steps_figure(
                    run_a.steps, run_b.steps, comparison.label_a, comparison.label_b
                ),
            )
        )
    for side, result in (("after", b),):
        charts.extend(
            Chart(f"{side}_{chart.key}", f"{chart.title} ({side})", chart.figure)
            for chart in _charts(result)
            if chart.key in ("step_time", "system", "breakdown")
        )
    sources = (
        ("before (a)", comparison.label_a),
        ("after (b)", comparison.label_b),
        *((f"a: {k}", v) for k, v in source_rows(a) if k in ("path", "files")),
        *((f"b: {k}", v) for k, v in source_rows(b) if k in ("path", "files")),
    )
    run = getattr(b, "run", None)
    return Report(
        kind="comparison",
        title=f"Pipeline Doctor comparison: {comparison.label_a} vs {comparison.label_b}",
        generated_at=_now(),
        source_rows=sources,
        environment_rows=env_rows,
        summary_rows=(
            *(
                (("headline", line),)
                if (
                    line := fmt.speedup_headline(
                        comparison.speedup,
                        comparison.metrics_a.median_step_time_ms,
                        comparison.metrics_b.median_step_time_ms,
                    )
                )
                else ()
            ),
            *((label, f"{va} → {vb} ({ratio_text})") for label, va, vb, ratio_text, _ in rows),
        ),
        findings=tuple(current),
        charts=tuple(charts),
        cost=_cost(b, comparison.metrics_b, pricing),
        skipped=tuple((str(s.rule), str(s.reason)) for s in getattr(b, "skipped", ()) or ()),
        warnings=tuple(
            [f"a: {w}" for w in getattr(a, "warnings", ()) or ()]
            + [f"b: {w}" for w in getattr(b, "warnings", ()) or ()]
        ),
        config_rows=tuple(flat_config(run.config)) if run is not None else (),
        comparison=section,
        metrics={
            "a": _metrics_dict(comparison.metrics_a),
            "b": _metrics_dict(comparison.metrics_b),
        },
        analysis={"a": _analysis_json(a), "b": _analysis_json(b)},
    )
