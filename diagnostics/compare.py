"""Two analyses side by side: a run and its re-run with a fix, or any two runs or traces.

``compare(a, b)`` reads ``a`` as *before* and ``b`` as *after*: every ratio is b / a, so a
throughput ratio of 2.0 means the second job is twice as fast, a step-time ratio of 0.5
that its steps take half as long. The headline is the median step-time ratio
(``Comparison.speedup`` = median a / median b); throughput is derived from the same medians
(diagnostics.metrics), so the two never disagree. Findings are matched by rule id: *gone*
(in a only), *new* (in b only), *kept* (in both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from diagnostics.dotted import flatten_dotted
from diagnostics.metrics import GPU_BUSY, GPU_KERNEL_UTILISATION, KeyMetrics, key_metrics

Better = Literal["higher", "lower", "neither"]

# Changes smaller than this share of the first value read as "same": two runs of one
# config differ by a percent or two in step time and memory without anything changing.
SAME_WITHIN = 0.02


@dataclass(frozen=True)
class MetricRow:
    key: str
    label: str
    unit: str
    a: float | None
    b: float | None
    better: Better

    @property
    def ratio(self) -> float | None:
        """b / a, None when either is missing or a is zero."""
        if self.a is None or self.b is None or self.a == 0:
            return None
        ratio = self.b / self.a
        return ratio if math.isfinite(ratio) else None

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def improved(self) -> bool | None:
        """Whether b is better than a (None when unknown, within SAME_WITHIN of a, or when
        neither direction is better)."""
        if self.delta is None or self.delta == 0 or self.better == "neither":
            return None
        if self.ratio is not None and abs(self.ratio - 1.0) < SAME_WITHIN:
            return None
        return (self.delta > 0) == (self.better == "higher")

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "unit": self.unit,
            "a": self.a,
            "b": self.b,
            "ratio": self.ratio,
            "delta": self.delta,
            "better": self.better,
            "improved": self.improved,
        }


@dataclass(frozen=True)
class Prediction:
    """A re-run's fix as its finding predicted it and as the re-run measured it: the finding
    in the first run whose patch the re-run applied, its expected saving, and the saving in
    median step time the re-run showed (the rule's calibration, measured / predicted)."""

    rule: str
    patch: dict[str, Any]
    predicted_saving_pct: float
    measured_saving_pct: float | None  # 100 x (1 - median b / median a)

    @property
    def measured_over_predicted(self) -> float | None:
        if self.measured_saving_pct is None or self.predicted_saving_pct <= 0:
            return None
        return self.measured_saving_pct / self.predicted_saving_pct

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "patch": dict(self.patch),
            "predicted_saving_pct": self.predicted_saving_pct,
            "measured_saving_pct": self.measured_saving_pct,
            "measured_over_predicted": self.measured_over_predicted,
        }


@dataclass(frozen=True)
class Comparison:
    a: Any  # AnalysisResult (before)
    b: Any  # AnalysisResult (after)
    label_a: str
    label_b: str
    metrics_a: KeyMetrics
    metrics_b: KeyMetrics
    rows: tuple[MetricRow, ...]
    findings_gone: tuple[Any, ...]  # Finding in a whose rule did not fire in b
    findings_new: tuple[Any, ...]  # Finding in b whose rule did not fire in a
    findings_kept: tuple[tuple[Any, Any], ...]  # (finding in a, finding in b), same rule
    config_changes: tuple[tuple[str, Any, Any], ...]  # (dotted key, a value, b value)
    # b re-runs a with one of a's fixes: what that finding predicted, what b measured
    prediction: Prediction | None = None

    @property
    def speedup(self) -> float | None:
        """Median step time of a over that of b: 1.34 means b's steps are 1.34x faster."""
        a, b = self.metrics_a.median_step_time_ms, self.metrics_b.median_step_time_ms
        if a is None or b is None or a <= 0 or b <= 0:
            return None
        return a / b

    def row(self, key: str) -> MetricRow:
        for row in self.rows:
            if row.key == key:
                return row
        raise KeyError(key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label_a": self.label_a,
            "label_b": self.label_b,
            "speedup": self.speedup,
            "metrics": [row.to_dict() for row in self.rows],
            "findings_gone": [f.to_dict() for f in self.findings_gone],
            "findings_new": [f.to_dict() for f in self.findings_new],
            "findings_kept": [
                {"rule": fa.rule, "a": fa.to_dict(), "b": fb.to_dict()}
                for fa, fb in self.findings_kept
            ],
            "config_changes": [
                {"key": key, "a": va, "b": vb} for key, va, vb in self.config_changes
            ],
            "prediction": self.prediction.to_dict() if self.prediction is not None else None,
        }


def result_label(result: Any) -> str:
    """A short name for an analysis: the run id, else the trace's file name."""
    run = getattr(result, "run", None)
    if run is not None:
        return str(run.manifest.run_id)
    source = getattr(result, "source", None) or {}
    files = source.get("files") or []
    if len(files) == 1:
        return Path(str(files[0])).name
    path = source.get("path")
    return Path(str(path)).name if path else "analysis"


def _config_changes(a: Any, b: Any) -> tuple[tuple[str, Any, Any], ...]:
    run_a, run_b = getattr(a, "run", None), getattr(b, "run", None)
    if run_a is None or run_b is None:
        return ()
    flat_a, flat_b = flatten_dotted(run_a.config), flatten_dotted(run_b.config)
    changes = []
    for key in sorted(set(flat_a) | set(flat_b)):
        value_a, value_b = flat_a.get(key), flat_b.get(key)
        if value_a != value_b:
            changes.append((key, value_a, value_b))
    return tuple(changes)


def _rows(ma: KeyMetrics, mb: KeyMetrics) -> tuple[MetricRow, ...]:
    # throughput is derived from the median step (diagnostics.metrics): its ratio is the
    # inverse of the step-time ratio whenever the batch size is the same
    use_samples = ma.samples_per_s is not None and mb.samples_per_s is not None
    throughput = (
        MetricRow(
            "throughput", "throughput", "samples/s", ma.samples_per_s, mb.samples_per_s, "higher"
        )
        if use_samples
        else MetricRow(
            "throughput", "throughput", "steps/s", ma.steps_per_s, mb.steps_per_s, "higher"
        )
    )
    return (
        throughput,
        MetricRow(
            "median_step_time_ms",
            "median step time",
            "ms",
            ma.median_step_time_ms,
            mb.median_step_time_ms,
            "lower",
        ),
        MetricRow(
            "data_wait_pct", "data-wait share", "%", ma.data_wait_pct, mb.data_wait_pct, "lower"
        ),
        MetricRow(
            "gpu_kernel_utilization_pct",
            GPU_KERNEL_UTILISATION,
            "%",
            ma.gpu_kernel_utilization_pct,
            mb.gpu_kernel_utilization_pct,
            "higher",
        ),
        MetricRow("gpu_busy_pct", GPU_BUSY, "%", ma.gpu_busy_pct, mb.gpu_busy_pct, "higher"),
        MetricRow(
            "peak_memory_bytes",
            "peak memory",
            "bytes",
            None if ma.peak_memory_bytes is None else float(ma.peak_memory_bytes),
            None if mb.peak_memory_bytes is None else float(mb.peak_memory_bytes),
            "lower",
        ),
    )


def _prediction(a: Any, b: Any, metrics_a: KeyMetrics, metrics_b: KeyMetrics) -> Prediction | None:
    """The prediction b tests: b is a's re-run (its parent_run_id) and applied every key of
    one of a's fixes with that fix's value; None otherwise (any two runs predict nothing)."""
    run_a, run_b = getattr(a, "run", None), getattr(b, "run", None)
    if run_a is None or run_b is None:
        return None
    if run_b.manifest.parent_run_id != run_a.manifest.run_id:
        return None
    applied = run_b.manifest.applied_patch or {}
    for finding in a.findings:
        patch = finding.fix.config_patch if finding.fix is not None else None
        if not patch or finding.estimated_saving_pct is None:
            continue
        if fix_applied(patch, applied):
            measured = measured_saving_pct(
                metrics_a.median_step_time_ms, metrics_b.median_step_time_ms
            )
            return Prediction(finding.rule, dict(patch), finding.estimated_saving_pct, measured)
    return None


def fix_applied(patch: dict[str, Any], applied: dict[str, Any]) -> bool:
    """A re-run applied a fix when it set every key of the fix's patch to the fix's value."""
    return all(key in applied and applied[key] == value for key, value in patch.items())


def measured_saving_pct(before_ms: float | None, after_ms: float | None) -> float | None:
    """100 x (1 - after / before) of median step times; None without both."""
    if before_ms is None or after_ms is None or before_ms <= 0:
        return None
    return 100.0 * (1.0 - after_ms / before_ms)


def compare(
    a: Any, b: Any, *, label_a: str | None = None, label_b: str | None = None
) -> Comparison:
    """Compare two AnalysisResults, ``a`` before and ``b`` after."""
    metrics_a, metrics_b = key_metrics(a), key_metrics(b)
    by_rule_a = {f.rule: f for f in reversed(a.findings)}  # first finding of each rule wins
    by_rule_b = {f.rule: f for f in reversed(b.findings)}
    gone = tuple(f for f in a.findings if f.rule not in by_rule_b)
    new = tuple(f for f in b.findings if f.rule not in by_rule_a)
    kept = tuple(
        (by_rule_a[rule], by_rule_b[rule])
        for rule in dict.fromkeys(f.rule for f in a.findings)
        if rule in by_rule_b
    )
    name_a, name_b = label_a or result_label(a), label_b or result_label(b)
    if name_a == name_b:  # two uploads of the same file name would be indistinguishable
        name_a, name_b = f"A: {name_a}", f"B: {name_b}"
    return Comparison(
        a=a,
        b=b,
        label_a=name_a,
        label_b=name_b,
        metrics_a=metrics_a,
        metrics_b=metrics_b,
        rows=_rows(metrics_a, metrics_b),
        findings_gone=gone,
        findings_new=new,
        findings_kept=kept,
        config_changes=_config_changes(a, b),
        prediction=_prediction(a, b, metrics_a, metrics_b),
    )
