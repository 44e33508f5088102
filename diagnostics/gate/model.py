"""The gate's verdicts: is the candidate a regression, an improvement, no change, or can the
input not say?

A measure with a sample on each side (step time, throughput) gets a Mann–Whitney U test and
a bootstrap interval on its median ratio (diagnostics.gate.stats). As in asv's
``asv compare``, a change is a regression or an improvement only when it is both
significant and larger than the tolerance (``max_regression``, default 5 %), and the
significance level is asv's (``asv.statistics.is_different``: p < 0.002). Steps within one
run are not independent of that run's luck on a shared host (another job's burst slows a
whole run), so a looser level turns the host's noise into false alarms: the same config run
twice on this 2-core host gave p = 0.038 for a 44 % difference in medians.

- significant, beyond the tolerance: regression or improvement;
- significant, within it: no change (real but smaller than the gate cares about);
- not significant: no change, whatever the ratio (the reason gives it and its p, as asv
  prints such a change with "~" and does not count it);
- too few steps for any outcome to reach significance (7 against 7 is the least at
  p < 0.002: 2 / C(14, 7) = 0.00058), or the figure unknown on a side: inconclusive, with
  that reason.

A measure with one value a side (peak memory, MFU) has no sample to test: beyond the
tolerance it is a regression or an improvement, within it no change, and unknown on a side
inconclusive. Measures are a tuple of specs, so a new figure (MFU from the FLOP model) is
one more entry. Findings gained or lost are matched by rule id, as diagnostics.compare does;
they are reported and do not fail the gate.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from diagnostics.gate.sides import FindingRef, GateSide
from diagnostics.gate.stats import (
    bootstrap_median_ratio_ci,
    mann_whitney_u,
    smallest_p_value,
)

Verdict = Literal["regression", "improvement", "no change", "inconclusive"]
Better = Literal["higher", "lower"]

DEFAULT_MAX_REGRESSION = 0.05
DEFAULT_ALPHA = 0.002  # asv.statistics.is_different's p_threshold


@dataclass(frozen=True)
class MeasureSpec:
    key: str
    label: str
    unit: str
    better: Better
    # a sample (tuple) to test, a single value, or None when the side does not have it
    values: Callable[[GateSide], tuple[float, ...] | float | None]
    unknown_reason: str = "not measured"
    # a rate per step (k / step time): its centre is k / median step time, as every card
    # and report quotes throughput (diagnostics.metrics), i.e. 1 / median(1 / value)
    per_step_rate: bool = False
    # what a value is a share of (a utilisation's peak): values on different bases are
    # not compared
    basis: Callable[[GateSide], str | None] | None = None


def _step_times(side: GateSide) -> tuple[float, ...] | None:
    return side.step_times_ms or None


def _throughput(side: GateSide) -> tuple[float, ...] | None:
    # per step, so the test sees the same sample as step time (its ranks reversed)
    if side.job_batch is None:
        return None
    return tuple(side.job_batch * 1000.0 / t for t in side.step_times_ms) or None


def _steps_per_s(side: GateSide) -> tuple[float, ...] | None:
    return tuple(1000.0 / t for t in side.step_times_ms) or None


# throughput of a side whose batch is not known (a trace): steps a second on both sides
STEPS_PER_S = MeasureSpec(
    "throughput", "throughput", "steps/s", "higher", _steps_per_s, per_step_rate=True
)


def _peak_memory(side: GateSide) -> float | None:
    return None if side.peak_memory_bytes is None else float(side.peak_memory_bytes)


MEASURES: tuple[MeasureSpec, ...] = (
    MeasureSpec("step_time_ms", "median step time", "ms", "lower", _step_times),
    MeasureSpec("throughput", "throughput", "samples/s", "higher", _throughput, per_step_rate=True),
    MeasureSpec("peak_memory_bytes", "peak memory", "bytes", "lower", _peak_memory),
    MeasureSpec(
        "mfu_pct",
        "MFU (model FLOPs: the trainer's config or the HF Trainer's model)",
        "%",
        "higher",
        lambda side: side.mfu_pct,
        unknown_reason="no model FLOPs: not a GPU run of the reference trainer or of a sized "
        "HF Trainer model, or no peak for the device and precision",
        basis=lambda side: side.mfu_basis,
    ),
    MeasureSpec(
        "counted_flops_utilization_pct",
        "hardware FLOPs utilisation (counted operators)",
        "%",
        "higher",
        lambda side: side.counted_flops_utilization_pct,
        unknown_reason="no counted FLOPs: no GPU trace with shapes, no peak for the device, or "
        "too little GPU time in counted operators",
        basis=lambda side: side.counted_flops_basis,
    ),
)


@dataclass(frozen=True)
class MeasureVerdict:
    key: str
    label: str
    unit: str
    better: Better
    verdict: Verdict
    reason: str
    baseline: float | None = None  # the median of a sample, else the value
    candidate: float | None = None
    ratio: float | None = None  # candidate / baseline
    ci_low: float | None = None  # 95 % bootstrap interval of the ratio of medians
    ci_high: float | None = None
    p_value: float | None = None  # two-sided Mann–Whitney U
    test: str | None = None  # "Mann-Whitney U (exact)" / "(normal approximation)"
    n_baseline: int | None = None
    n_candidate: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class GateResult:
    baseline: GateSide
    candidate: GateSide
    max_regression: float
    alpha: float
    measures: tuple[MeasureVerdict, ...]
    findings_gained: tuple[FindingRef, ...]
    findings_lost: tuple[FindingRef, ...]

    @property
    def regressions(self) -> tuple[MeasureVerdict, ...]:
        return tuple(m for m in self.measures if m.verdict == "regression")

    @property
    def failed(self) -> bool:
        return bool(self.regressions)

    def measure(self, key: str) -> MeasureVerdict:
        for measure in self.measures:
            if measure.key == key:
                return measure
        raise KeyError(key)

    def to_dict(self) -> dict[str, Any]:
        def side(s: GateSide) -> dict[str, Any]:
            return {
                "label": s.label,
                "path": s.path,
                "kind": s.kind,
                "steps": len(s.step_times_ms),
                "step_source": s.step_source,
                "peak_memory_kind": s.peak_memory_kind,
            }

        return {
            "schema": "pipeline-doctor/gate/v1",
            "baseline": side(self.baseline),
            "candidate": side(self.candidate),
            "max_regression_pct": self.max_regression * 100.0,
            "alpha": self.alpha,
            "failed": self.failed,
            "measures": [m.to_dict() for m in self.measures],
            "findings_gained": [f.to_dict() for f in self.findings_gained],
            "findings_lost": [f.to_dict() for f in self.findings_lost],
        }


def _direction(ratio: float, better: Better, tolerance: float) -> Verdict:
    """Beyond the tolerance which way, else no change; a ratio r and 1/r are the same size
    of change, so 5 % slower (1.05) and 5 % less throughput (1/1.05) read alike."""
    worse = ratio > 1.0 + tolerance if better == "lower" else ratio < 1.0 / (1.0 + tolerance)
    improved = ratio < 1.0 / (1.0 + tolerance) if better == "lower" else ratio > 1.0 + tolerance
    return "regression" if worse else "improvement" if improved else "no change"


def _change_text(ratio: float) -> str:
    return f"{(ratio - 1.0) * 100.0:+.1f} %"


def _unknown(spec: MeasureSpec, reason: str, base: Any, cand: Any) -> MeasureVerdict:
    return MeasureVerdict(
        spec.key, spec.label, spec.unit, spec.better, "inconclusive", reason, base, cand
    )


def _sample_verdict(
    spec: MeasureSpec,
    base: tuple[float, ...],
    cand: tuple[float, ...],
    tolerance: float,
    alpha: float,
) -> MeasureVerdict:
    if spec.per_step_rate:
        inverse_base, inverse_cand = [1.0 / v for v in base], [1.0 / v for v in cand]
        median_base = 1.0 / statistics.median(inverse_base)
        median_cand = 1.0 / statistics.median(inverse_cand)
    else:
        median_base, median_cand = statistics.median(base), statistics.median(cand)
    ratio = median_cand / median_base if median_base > 0 else None
    counts = (len(base), len(cand))
    if smallest_p_value(*counts) >= alpha:
        reason = (
            f"too few steps ({counts[0]} and {counts[1]}): no outcome could reach p < {alpha:g}"
        )
        unknown = _unknown(spec, reason, median_base, median_cand)
        return replace(unknown, ratio=ratio, n_baseline=counts[0], n_candidate=counts[1])
    test = mann_whitney_u(base, cand)
    interval = (
        # centre(cand) / centre(base) = median(1 / base) / median(1 / cand)
        bootstrap_median_ratio_ci(inverse_cand, inverse_base)
        if spec.per_step_rate
        else bootstrap_median_ratio_ci(base, cand)
    )
    name = f"Mann-Whitney U ({'exact' if test.method == 'exact' else 'normal approximation'})"
    significant = test.p_value < alpha
    if ratio is None:
        verdict, reason = "inconclusive", "the baseline's median is zero"
    else:
        direction = _direction(ratio, spec.better, tolerance)
        if direction == "no change":
            verdict = "no change"
            reason = f"{_change_text(ratio)}, within ±{tolerance * 100:g} %" + (
                " (significant)" if significant else ""
            )
        elif significant:
            verdict, reason = direction, f"{_change_text(ratio)}, p = {test.p_value:.2g}"
        else:
            verdict = "no change"
            reason = (
                f"{_change_text(ratio)} but not significant (p = {test.p_value:.2g} ≥ "
                f"{alpha:g}): within the noise"
            )
    return MeasureVerdict(
        spec.key,
        spec.label,
        spec.unit,
        spec.better,
        verdict,
        reason,
        median_base,
        median_cand,
        ratio,
        interval[0] if interval else None,
        interval[1] if interval else None,
        test.p_value,
        name,
        counts[0],
        counts[1],
    )


def _single_verdict(
    spec: MeasureSpec, base: float, cand: float, tolerance: float
) -> MeasureVerdict:
    if base <= 0:
        return _unknown(spec, "the baseline's value is zero", base, cand)
    ratio = cand / base
    verdict = _direction(ratio, spec.better, tolerance)
    reason = (
        f"{_change_text(ratio)}, within ±{tolerance * 100:g} %"
        if verdict == "no change"
        else f"{_change_text(ratio)} (one value a side: no test)"
    )
    return MeasureVerdict(
        spec.key,
        spec.label,
        spec.unit,
        spec.better,
        verdict,
        reason,
        base,
        cand,
        ratio=ratio,
    )


def _measure(
    spec: MeasureSpec, baseline: GateSide, candidate: GateSide, tolerance: float, alpha: float
) -> MeasureVerdict:
    base, cand = spec.values(baseline), spec.values(candidate)
    if base is None or cand is None:
        missing = [name for name, v in (("baseline", base), ("candidate", cand)) if v is None]
        return _unknown(
            spec, f"unknown in the {' and the '.join(missing)}: {spec.unknown_reason}", None, None
        )
    if isinstance(base, tuple) and isinstance(cand, tuple):
        return _sample_verdict(spec, base, cand, tolerance, alpha)
    assert isinstance(base, float) and isinstance(cand, float)
    return _single_verdict(spec, base, cand, tolerance)


# measures timed by the steps' wall time, which waiting for a CPU lengthens
STEP_TIMED = ("step_time_ms", "throughput", "steps_per_s")
NET_STEP_TIME = MeasureSpec(
    "step_time_net_of_cpu_wait_ms", "median step time less its wait for a CPU", "ms", "lower",
    lambda side: None,
)  # fmt: skip


def _net_of_cpu_wait(side: GateSide) -> tuple[float, ...] | None:
    if side.cpu_wait_ms is None or len(side.cpu_wait_ms) != len(side.step_times_ms):
        return None
    net = tuple(t - w for t, w in zip(side.step_times_ms, side.cpu_wait_ms, strict=True))
    return net if all(v > 0 for v in net) else None


def _unless_cpu_contention(
    verdict: MeasureVerdict,
    baseline: GateSide,
    candidate: GateSide,
    tolerance: float,
    alpha: float,
) -> MeasureVerdict:
    """A step-time change that is only time waiting for a CPU is not the job's to claim.

    Both sides' records hold each step's run-queue wait (``cpu_wait_ms``). When the wall
    times differ significantly but the steps less that wait do not, the difference is
    who had the cores: the host's other work, or the job's own other processes (more
    DataLoader workers than cores). Neither a regression nor an improvement can be told
    from it, so the verdict is inconclusive, with both figures (two runs of one scenario on
    a shared 2-core host differed by +33 % in wall time, p = 0.00016, and by 146-161 ms a
    step less their wait in both)."""
    if verdict.verdict not in ("regression", "improvement"):
        return verdict
    base, cand = _net_of_cpu_wait(baseline), _net_of_cpu_wait(candidate)
    if base is None or cand is None:
        return verdict
    net = _sample_verdict(NET_STEP_TIME, base, cand, tolerance, alpha)
    if net.verdict != "no change":
        return verdict
    reason = (
        f"{verdict.reason} in wall time, but the steps less their wait for a CPU: "
        f"{net.reason}; the difference is CPU contention (the host's other work, or the "
        "job's own processes such as more DataLoader workers than cores)"
    )
    return replace(verdict, verdict="inconclusive", reason=reason)


def _memory_kinds_differ(baseline: GateSide, candidate: GateSide) -> bool:
    kinds = (baseline.peak_memory_kind, candidate.peak_memory_kind)
    return None not in kinds and kinds[0] != kinds[1]


def gate(
    baseline: GateSide,
    candidate: GateSide,
    *,
    max_regression: float = DEFAULT_MAX_REGRESSION,
    alpha: float = DEFAULT_ALPHA,
    measures: tuple[MeasureSpec, ...] = MEASURES,
) -> GateResult:
    """Each measure's verdict for ``candidate`` against ``baseline``."""
    if not 0 < max_regression < 10 or not 0 < alpha < 1:
        raise ValueError(f"max_regression {max_regression} or alpha {alpha} out of range")
    verdicts = []
    for spec in measures:
        if spec.key == "peak_memory_bytes" and _memory_kinds_differ(baseline, candidate):
            reason = (
                f"not comparable: {baseline.peak_memory_kind} against "
                f"{candidate.peak_memory_kind} memory"
            )
            verdicts.append(_unknown(spec, reason, None, None))
            continue
        bases = (spec.basis(baseline), spec.basis(candidate)) if spec.basis else (None, None)
        if None not in bases and bases[0] != bases[1]:
            reason = f"not comparable: a share of {bases[0]} against one of {bases[1]}"
            base, cand = spec.values(baseline), spec.values(candidate)
            # both values shown (single figures), no ratio: they are shares of different peaks
            verdicts.append(
                _unknown(
                    spec,
                    reason,
                    base if isinstance(base, float) else None,
                    cand if isinstance(cand, float) else None,
                )
            )
            continue
        if spec.values is _throughput and None in (baseline.job_batch, candidate.job_batch):
            spec = STEPS_PER_S
        verdict = _measure(spec, baseline, candidate, max_regression, alpha)
        if spec.key in STEP_TIMED:
            verdict = _unless_cpu_contention(verdict, baseline, candidate, max_regression, alpha)
        verdicts.append(verdict)
    rules_base = {f.rule for f in baseline.findings}
    rules_cand = {f.rule for f in candidate.findings}
    return GateResult(
        baseline=baseline,
        candidate=candidate,
        max_regression=max_regression,
        alpha=alpha,
        measures=tuple(verdicts),
        findings_gained=tuple(f for f in candidate.findings if f.rule not in rules_base),
        findings_lost=tuple(f for f in baseline.findings if f.rule not in rules_cand),
    )
