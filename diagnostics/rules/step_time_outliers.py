"""step-time-outliers: some steps are far slower than the rest, again and again.

What it finds
    Recurring slowdowns within a training phase: steps slower than both the median plus a
    multiple of the robust standard deviation (1.4826 x MAD; SageMaker Debugger's
    StepOutlier uses mean + 3 sigma, which the outliers themselves inflate) and a multiple
    of the median, in at least a threshold number of separate episodes (runs of
    consecutive slow steps), when the time they lose beyond the median step is a material
    share of all step time. Steps with a known cause are left out first, and the evidence
    lists them: the first step of a phase, the profiler's warm-up and active steps and the
    step after it wrote its trace, the first step of an epoch, and the steps right after an
    evaluation or a checkpoint (the step records' ``marks``; for records without them,
    derived from ``profiled``, the epoch and ``train.checkpoint_every``). Where the records
    say how long each step waited for a CPU (``cpu_wait_ms``: the training thread runnable
    while another process or thread had the core), each step is judged on its own time,
    less its wait beyond the usual one: a step slow only by that wait came from the host,
    not the pipeline, and is listed as left out, and a stretch of host load neither raises
    the baseline nor hides a stall in it. It names the part of the step that grew: waiting
    for the next batch, the host-to-device copy, forward and backward, or the optimiser
    step.

Why it matters
    A slowdown that keeps coming back has one cause worth finding (a storage hiccup, a
    DataLoader worker restart, garbage collection, another process on the machine), and in
    distributed training every rank waits for the slowest one. The saving is at most the
    measured excess: the time the slow steps took beyond the median step (own times, the
    host's extra wait left out), over all step time.

How to fix
    Follow the part that grew: for the data wait, keep workers alive and queue more batches
    (``persistent_workers=True``, a larger ``prefetch_factor``); for the copy, pin memory;
    for forward/backward, freeze the garbage collector after set-up (``gc.freeze()``) and
    keep tensor shapes fixed; for the optimiser step, a fused optimiser (``fused=True``)
    and ``gc.freeze()``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import polars as pl

from diagnostics.model import AnalysisInputs
from diagnostics.percent import pct
from diagnostics.rules import examples as ex
from diagnostics.rules.base import Example, Finding, Fix, Need, Rule, Severity
from diagnostics.rules.evidence import (
    chart,
    config_value,
    has_steps,
    numeric,
    r,
    step_number,
    step_range,
)
from diagnostics.rules.stats import median, robust_sigma_outliers
from diagnostics.rules.step_time_fixes import FIX_CODE
from diagnostics.thresholds import Thresholds

MIN_STEPS = 8
# step-record or trace-breakdown column -> the part of the step it measures
RUN_PARTS = {
    "data_wait_ms": "data",
    "h2d_ms": "copy",
    "compute_ms": "compute",
    "optimizer_ms": "optimizer",
}
TRACE_PARTS = {
    "dataloader_us": "data",
    "memcpy_us": "copy",
    "kernel_us": "compute",
    "cpu_exec_us": "compute",
    "runtime_us": "compute",
}
CAUSE_WORDS = {
    "data": "waiting for the next batch",
    "copy": "the host-to-device copy",
    "compute": "forward and backward",
    "optimizer": "the optimiser step",
    "unknown": "a part of the step the records do not break down",
}
# known causes of a slow step (a step record's marks), in words for the evidence
KNOWN_CAUSES = {
    "phase_start": "first step of a phase",
    "profiler_warmup": "profiler warm-up",
    "profiler_active": "profiler recording",
    "memory_history": "CUDA allocator history on (memory snapshots)",
    "after_trace_export": "after the trace export",
    "epoch_start": "first step of an epoch",
    "after_evaluation": "after an evaluation",
    "checkpoint": "checkpoint step",
    "after_checkpoint": "after a checkpoint",
    "cpu_wait": "waiting for a CPU another process or thread had",
}


def _phase_frames(steps: pl.DataFrame) -> list[tuple[str, pl.DataFrame]]:
    timed = steps.filter(pl.col("step_time_ms").is_not_null()).sort("step")
    if "phase" not in timed.columns or timed["phase"].null_count() == timed.height:
        return [("all", timed)]
    return [
        (str(name), timed.filter(pl.col("phase") == name))
        for name in timed["phase"].unique(maintain_order=True).to_list()
    ]


def known_causes(frame: pl.DataFrame, run: Any) -> list[str | None]:
    """Each step's known cause of extra time (a KNOWN_CAUSES key) or None."""
    rows = frame.to_dicts()
    marked = "marks" in frame.columns and frame["marks"].null_count() < frame.height
    every = config_value(run, "train.checkpoint_every")
    every = every if isinstance(every, int) and every > 0 else None
    causes: list[str | None] = []
    for i, row in enumerate(rows):
        found: list[str] = ["phase_start"] if i == 0 else []
        if marked:
            found += [m for m in str(row.get("marks") or "").split(",") if m]
        else:  # records written before the trainer recorded marks
            previous = rows[i - 1] if i else None
            if row.get("profiled"):
                found.append("profiler_active")
            if previous is not None and previous.get("profiled") and not row.get("profiled"):
                found.append("after_trace_export")
            if previous is not None and row.get("epoch") != previous.get("epoch"):
                found.append("epoch_start")
            step = row.get("step")
            if every and isinstance(step, int):
                if step % every == 0:
                    found.append("checkpoint")
                elif step > 1 and (step - 1) % every == 0:
                    found.append("after_checkpoint")
        causes.append(next((c for c in found if c in KNOWN_CAUSES), None))
    return causes


def episodes(indices: list[int]) -> int:
    """Runs of consecutive indices: [3, 4, 9, 15, 16] -> 3."""
    return sum(1 for k, i in enumerate(indices) if k == 0 or i != indices[k - 1] + 1)


def _excluded_text(steps: list[int], causes: list[str | None]) -> str:
    by_cause: dict[str, list[int]] = {}
    for step, cause in zip(steps, causes, strict=True):
        if cause is not None:
            by_cause.setdefault(cause, []).append(step)
    if not by_cause:
        return "none"
    parts = []
    for cause, listed in by_cause.items():
        shown = ", ".join(map(str, listed[:6])) + (" …" if len(listed) > 6 else "")
        parts.append(f"{KNOWN_CAUSES[cause]} ({shown})")
    return "; ".join(parts)


class StepTimeOutliers(Rule):
    id = "step-time-outliers"
    title = "Some steps keep taking far longer than the rest"
    severity = Severity.LOW
    needs = (
        Need(
            f"at least {MIN_STEPS} steps of step-time records",
            lambda inputs: (
                (has_steps(inputs.run, "step_time_ms") and inputs.run.steps.height >= MIN_STEPS)
                or (inputs.trace is not None and inputs.trace.steps.height >= MIN_STEPS)
            ),
        ),
    )
    threshold_names = (
        "step_outlier_sigma",
        "step_outlier_min_ratio",
        "step_outlier_min_episodes",
        "step_outlier_min_excess_pct",
    )

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        run = inputs.run
        if has_steps(run, "step_time_ms") and run is not None and run.steps.height >= MIN_STEPS:
            findings = []
            for phase, frame in _phase_frames(run.steps):
                parts = {c: p for c, p in RUN_PARTS.items() if c in frame.columns}
                causes = known_causes(frame, run)
                source = f"run step records, phase {phase}"
                found = self._judge(frame, "step_time_ms", 1.0, parts, causes, source, thresholds)
                findings.extend(found)
            # one finding: the phase whose slow steps cost most
            findings.sort(key=lambda f: -(f.estimated_saving_pct or 0.0))
            return findings[:1]
        assert inputs.trace is not None
        frame = inputs.trace.steps.select("step", "dur_us")
        breakdown = inputs.trace.breakdown
        if breakdown.height:
            frame = frame.join(breakdown.drop("total_us", strict=False), on="step", how="left")
        parts = {c: p for c, p in TRACE_PARTS.items() if c in frame.columns}
        causes: list[str | None] = [None] * frame.height
        source = "trace profiler steps (no step records: nothing to exclude)"
        return self._judge(frame, "dur_us", 1000.0, parts, causes, source, thresholds)

    def _judge(
        self,
        frame: pl.DataFrame,
        time_column: str,
        per_ms: float,
        parts: dict[str, str],
        causes: list[str | None],
        source: str,
        thresholds: Thresholds,
    ) -> list[Finding]:
        all_steps = frame["step"].to_list()
        all_times = [v / per_ms for v in numeric(frame, time_column)]
        keep = [i for i, cause in enumerate(causes) if cause is None]
        if len(keep) < MIN_STEPS:
            return []
        times = [all_times[i] for i in keep]
        med = median(times)
        extra_waits = self._extra_cpu_waits(frame, per_ms, keep)
        # judged on each step's own time, the host's extra wait left out: a slow step that
        # was only waiting for a CPU is not slow there, and a stretch of host load raises
        # no baseline (busy mid-run, a CI host's ordinary steps went from 50 to 500 ms and
        # hid 1.5 s loader stalls among them)
        own = [t - w for t, w in zip(times, extra_waits, strict=True)]
        own_med = median(own)
        slow_on_the_clock = self._outliers(times, thresholds)
        slow = self._outliers(own, thresholds)
        waited = set(slow_on_the_clock) - set(slow)
        if waited:
            causes = list(causes)
            for i in waited:
                causes[keep[i]] = "cpu_wait"
        count = episodes(slow)
        if count < thresholds.step_outlier_min_episodes:
            return []
        # the time the slow steps lost beyond the median step, the host's share left out
        excess_ms = sum(max(own[i] - own_med, 0.0) for i in slow)
        total_ms = sum(t for t in all_times if t == t)
        excess_pct = 100.0 * excess_ms / total_ms if total_ms > 0 else 0.0
        if excess_pct < thresholds.step_outlier_min_excess_pct:
            return []
        slow_rows = [keep[i] for i in slow]
        slow_steps = [step_number(all_steps[i]) for i in slow_rows]
        growth = self._growth(frame, parts, per_ms, slow_rows, keep)
        cause = max(growth, key=growth.get) if growth else "unknown"
        if growth and growth[cause] <= 0:
            cause = "unknown"
        words = CAUSE_WORDS[cause]
        growth_text = ", ".join(
            f"{CAUSE_WORDS[part]} {value:+.1f} ms" for part, value in growth.items()
        )
        slow_median = median([times[i] for i in slow])
        evidence: dict[str, Any] = {
            "source": source,
            "cause": words,
            "slow_steps": slow_steps[:100],
            "slow_step_count": len(slow),
            "episodes": count,
            "step_time_ms_median": r(med),
            "slow_step_ms_median": r(slow_median),
            "excess_pct_of_step_time": r(excess_pct, 1),
            "growth_of_each_part": growth_text or None,
            "excluded_steps": _excluded_text(all_steps, causes),
            "steps": step_range(frame["step"]),
            "chart": chart(
                "line",
                "Step time (slow steps marked)",
                "step",
                "time (ms)",
                all_steps,
                {"step time (ms)": all_times},
                highlight_x=slow_steps[:100],
            ),
        }
        shown = ", ".join("?" if s is None else str(s) for s in slow_steps[:6]) + (
            " …" if len(slow_steps) > 6 else ""
        )
        return [
            Finding(
                rule=self.id,
                severity=self.severity,
                title=(
                    f"{len(slow)} slow steps in {count} separate episodes, from {words}: "
                    f"{pct(excess_pct)} of step time"
                ),
                evidence=evidence,
                recommendation=(
                    f"Steps {shown} took {slow_median:.1f} ms (median of the slow steps) "
                    f"against a median step of {med:.1f} ms, again and again through the "
                    f"phase; the part that grew is {words}. Steps with a known cause were "
                    f"left out: {evidence['excluded_steps']}."
                ),
                fix=Fix(code=FIX_CODE[cause], config_patch=None),
                # the most removing the slowdowns can give back: their measured excess
                estimated_saving_pct=r(excess_pct, 1),
            )
        ]

    @staticmethod
    def _outliers(times: list[float], thresholds: Thresholds) -> list[int]:
        """Indices of the steps above median + sigma x robust sigma and the median's ratio."""
        med = median(times)
        return [
            int(i)
            for i in robust_sigma_outliers(times, thresholds.step_outlier_sigma)
            if times[i] >= thresholds.step_outlier_min_ratio * med
        ]

    @staticmethod
    def _extra_cpu_waits(frame: pl.DataFrame, per_ms: float, keep: list[int]) -> list[float]:
        """Each kept step's wait for a CPU beyond the usual wait (0 where not recorded): the
        host's share of its time, busy with other work."""
        if "cpu_wait_ms" not in frame.columns or frame["cpu_wait_ms"].null_count() == frame.height:
            return [0.0] * len(keep)
        waits = [v / per_ms for v in numeric(frame, "cpu_wait_ms")]
        kept_waits = [waits[i] for i in keep]
        usual = median([w for w in kept_waits if w == w])
        return [max(w - usual, 0.0) if w == w else 0.0 for w in kept_waits]

    @staticmethod
    def _growth(
        frame: pl.DataFrame, parts: dict[str, str], per_ms: float, slow: list[int], keep: list[int]
    ) -> dict[str, float]:
        """Per part of the step: mean over the slow steps minus the median step, ms."""
        growth: dict[str, float] = {}
        for column, part in parts.items():
            if frame[column].null_count() == frame.height:
                continue
            values = [v / per_ms for v in numeric(frame, column)]
            typical = median([values[i] for i in keep])
            grown = sum(values[i] for i in slow) / len(slow) - typical
            if grown == grown:  # not NaN
                growth[part] = growth.get(part, 0.0) + grown
        return growth

    examples: ClassVar = (
        Example(
            "run: every 7th step waits 150 ms more for its batch (a recurring stall)",
            True,
            lambda: _every_7th(step_time_ms=200.0, data_wait_ms=(151.0, 1.0), compute_ms=40.0),
            expect=lambda finding: _expect_cause(finding, "data"),
        ),
        Example(
            "run: every 7th step's host-to-device copy takes 150 ms more",
            True,
            lambda: _every_7th(step_time_ms=200.0, h2d_ms=(151.0, 1.0), compute_ms=40.0),
            expect=lambda finding: _expect_cause(finding, "copy"),
        ),
        Example(
            "run: every 7th step's forward and backward take 150 ms more (a collector pause)",
            True,
            lambda: _every_7th(
                step_time_ms=200.0, data_wait_ms=1.0, compute_ms=(190.0, lambda s: 40.0 + s % 3)
            ),
            expect=lambda finding: _expect_cause(finding, "compute"),
        ),
        Example(
            "run: every 7th step's optimiser step takes 150 ms more",
            True,
            lambda: _every_7th(
                step_time_ms=200.0, data_wait_ms=1.0, compute_ms=40.0, optimizer_ms=(151.0, 1.0)
            ),
            expect=lambda finding: _expect_cause(finding, "optimizer"),
        ),
        Example(
            "run: steady 50 ms steps with 2 ms noise",
            False,
            lambda: ex.cpu_run(40, step_time_ms=lambda s: 50.0 + (s * 7 % 5) * 0.5),
        ),
        Example(
            "run: the slow steps are the checkpoint steps (a known cause, left out)",
            False,
            lambda: ex.cpu_run(
                60,
                config={"train.checkpoint_every": 10},
                step_time_ms=lambda s: 300.0 if s % 10 == 0 else 50.0,
            ),
        ),
        Example(
            "run: every 7th step is slow, and all of its extra time is spent waiting for a CPU "
            "another process had (a busy shared host, not the pipeline)",
            False,
            lambda: _every_7th(
                step_time_ms=120.0,
                cpu_wait_ms=(71.0, 1.0),
                compute_ms=(118.0, lambda s: 48.0 + (s % 3)),
            ),
        ),
        Example(
            "run: every 7th step is slow and waits a little for a CPU, but most of the extra "
            "time is the wait for its batch",
            True,
            lambda: _every_7th(
                step_time_ms=200.0,
                cpu_wait_ms=(21.0, 1.0),
                data_wait_ms=(131.0, 1.0),
                compute_ms=40.0,
            ),
        ),
        Example(
            "run: every 7th step waits 1.5 s for its batch, and from step 20 to 45 the host is "
            "so busy that every step waits 450 ms more for a CPU (the busy stretch hides no "
            "stall)",
            True,
            lambda: ex.cpu_run(
                60,
                config={"train.checkpoint_every": 1000},
                step_time_ms=lambda s: (1550.0 if s % 7 == 0 else 50.0) + _busy(s),
                cpu_wait_ms=lambda s: 1.0 + _busy(s),
                data_wait_ms=lambda s: 1501.0 if s % 7 == 0 else 1.0,
                compute_ms=40.0,
            ),
            expect=lambda finding: _expect_stalls_found_through_host_load(finding),
        ),
        Example(
            "run: one burst of five slow steps (not recurring)",
            False,
            lambda: ex.cpu_run(
                60,
                config={"train.checkpoint_every": 1000},
                step_time_ms=lambda s: 300.0 if 30 <= s < 35 else 50.0,
            ),
        ),
    )


def _every_7th(step_time_ms: float, **parts: Any) -> AnalysisInputs:
    """60 steps of 50-52 ms where every 7th takes ``step_time_ms``; each part is a value for
    every step or (every 7th step's, the others') values, the latter a value or a function
    of the step (examples)."""

    def column(value: Any) -> Any:
        slow, usual = value if isinstance(value, tuple) else (value, value)
        return lambda s: slow if s % 7 == 0 else (usual(s) if callable(usual) else usual)

    return ex.cpu_run(
        60,
        config={"train.checkpoint_every": 1000},
        step_time_ms=column((step_time_ms, lambda s: 50.0 + (s % 3))),
        **{name: column(value) for name, value in parts.items()},
    )


def _busy(step: int) -> float:
    """The host's extra CPU wait in the busy stretch of an example, ms."""
    return 450.0 if 20 <= step <= 45 else 0.0


def _expect_stalls_found_through_host_load(finding: Finding) -> None:
    """All eight stalls are found, the busy stretch's steps are not, and the saving is the
    stalls' own 1.5 s each, not the host's wait inside them."""
    assert finding.evidence["slow_steps"] == [7, 14, 21, 28, 35, 42, 49, 56]
    assert finding.evidence["cause"] == CAUSE_WORDS["data"]
    total_ms = sum((1550.0 if s % 7 == 0 else 50.0) + _busy(s) for s in range(1, 61))
    own_excess = 8 * 1500.0
    assert finding.estimated_saving_pct == round(100 * own_excess / total_ms, 1)


def _expect_cause(finding: Finding, cause: str) -> None:
    """An example's finding names ``cause`` in words, gives that cause's fix code and
    claims no more saving than the excess it measured."""
    assert finding.evidence["cause"] == CAUSE_WORDS[cause], finding.evidence["cause"]
    assert f"from {CAUSE_WORDS[cause]}:" in finding.title, finding.title
    assert f"the part that grew is {CAUSE_WORDS[cause]}." in finding.recommendation
    assert finding.fix.code == FIX_CODE[cause], cause
    # the saving is the measured excess, no more: 150 ms extra on 8 of 60 ~51 ms steps
    excess = finding.evidence["excess_pct_of_step_time"]
    assert finding.estimated_saving_pct == excess and 0 < excess < 50, excess
