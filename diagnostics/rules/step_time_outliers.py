"""step-time-outliers: some steps take far longer than the rest.

What it finds
    Within each training phase, steps slower than the median plus a multiple of the robust standard deviation
    (1.4826 x MAD; SageMaker Debugger's StepOutlier uses mean + 3 sigma, which the outliers
    themselves inflate), after the first step and outside the profiler's active
    window (profiled steps are slower by design), when the time they lose beyond the median
    step is a material share of all step time. It says which part of the step grew (data
    wait, host-to-device copy, compute, optimiser) and whether the outliers fall on
    checkpoint steps.

Why it matters
    Periodic slow steps are usually one cause (a checkpoint written synchronously, a
    DataLoader worker restart at each epoch, garbage collection, another process on the
    machine); in distributed training every rank waits for the slowest one.

How to fix
    Follow the component that grew: checkpoint less often or asynchronously, keep workers
    alive between epochs (``persistent_workers=True``), ``gc.freeze()`` after set-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import polars as pl

from diagnostics.model import AnalysisInputs
from diagnostics.rules import examples as ex
from diagnostics.rules.base import Example, Finding, Fix, Rule, Severity
from diagnostics.rules.evidence import chart, config_value, has_steps, numeric, r
from diagnostics.rules.stats import robust_sigma_outliers
from diagnostics.thresholds import Thresholds

if TYPE_CHECKING:
    import numpy as np

COMPONENTS = ("data_wait_ms", "h2d_ms", "compute_ms", "optimizer_ms")
MIN_STEPS = 8
ADVICE = {
    "checkpoint": "they fall on checkpoint steps: checkpoint less often or asynchronously",
    "data_wait_ms": "the data wait grew: keep workers alive (persistent_workers=True) and "
    "prefetch more",
    "h2d_ms": "the host-to-device copy grew: pin memory",
    "compute_ms": "forward/backward grew: look for shape changes (recompilation, cuDNN "
    "autotuning) or other processes on the machine",
    "optimizer_ms": "the optimiser step grew: look for garbage collection or host contention",
    "unknown": "the step records do not say which part grew",
}

FIX_CODE = """\
# before: a synchronous checkpoint inside the loop stalls those steps
if step % 100 == 0:
    torch.save(state, path)

# after: checkpoint less often (or with torch.distributed.checkpoint.async_save)
if step % 1000 == 0:
    torch.save(state, path)
loader = DataLoader(dataset, num_workers=4, persistent_workers=True)
"""


def _phase_frames(steps: pl.DataFrame) -> list[tuple[str, pl.DataFrame]]:
    if "phase" not in steps.columns or steps["phase"].null_count() == steps.height:
        return [("all", steps)]
    return [
        (str(name), steps.filter(pl.col("phase") == name))
        for name in steps["phase"].unique(maintain_order=True).to_list()
    ]


class StepTimeOutliers(Rule):
    id = "step-time-outliers"
    title = "Some steps are far slower than the rest"
    severity = Severity.LOW
    needs = frozenset({"run_steps", "trace"})
    threshold_names = ("step_outlier_sigma", "step_outlier_min_excess_pct")

    def skip_reason(self, inputs: AnalysisInputs) -> str | None:
        if has_steps(inputs.run, "step_time_ms") and inputs.run.steps.height >= MIN_STEPS:
            return None
        if inputs.trace is not None and inputs.trace.steps.height >= MIN_STEPS:
            return None
        return f"needs at least {MIN_STEPS} steps of step-time records"

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        run = inputs.run
        if has_steps(run, "step_time_ms") and run is not None and run.steps.height >= MIN_STEPS:
            findings = []
            for phase, frame in _phase_frames(run.steps):
                # a phase's first step builds optimiser state and caches: not an outlier
                frame = frame.slice(1)
                if "profiled" in frame.columns:
                    frame = frame.filter(~pl.col("profiled").fill_null(False))
                source = f"run step records, phase {phase} (first and profiled steps excluded)"
                found = self._judge(frame, numeric(frame, "step_time_ms"), source, run, thresholds)
                findings.extend(found)
            # one finding: the phase whose outliers cost most
            findings.sort(key=lambda f: -(f.estimated_saving_pct or 0.0))
            return findings[:1]
        assert inputs.trace is not None
        frame = inputs.trace.steps
        times = [v / 1000 for v in numeric(frame, "dur_us")]
        return self._judge(frame, times, "trace profiler steps", None, thresholds)

    def _judge(
        self,
        frame: pl.DataFrame,
        times: list[float],
        source: str,
        run: Any,
        thresholds: Thresholds,
    ) -> list[Finding]:
        import numpy as np

        if len(times) < MIN_STEPS:
            return []
        idx = robust_sigma_outliers(times, thresholds.step_outlier_sigma)
        if idx.size == 0:
            return []
        arr = np.asarray(times)
        med = float(np.nanmedian(arr))
        excess = float(np.sum(arr[idx] - med))
        total = float(np.nansum(arr))
        excess_pct = 100.0 * excess / total if total > 0 else 0.0
        if excess_pct < thresholds.step_outlier_min_excess_pct:
            return []
        steps = frame["step"].to_list()
        outlier_steps = [int(steps[i]) for i in idx]
        cause, growth = self._cause(frame, idx, run)
        patch = None
        every = config_value(run, "train.checkpoint_every")
        if cause == "checkpoint" and isinstance(every, int):
            patch = {"train.checkpoint_every": every * 10}
        evidence: dict[str, Any] = {
            "source": source,
            "outlier_steps": outlier_steps[:100],
            "outliers": int(idx.size),
            "median_step_ms": r(med),
            "outlier_step_ms_mean": r(float(arr[idx].mean())),
            "limit_ms": r(
                med
                + thresholds.step_outlier_sigma * 1.4826 * float(np.nanmedian(np.abs(arr - med)))
            ),
            "excess_pct_of_step_time": r(excess_pct, 1),
            "likely_cause": cause,
            "component_growth_ms": growth,
            "steps": [int(steps[0]), int(steps[-1])],
            "chart": chart(
                "line",
                "Step time",
                "step",
                "time (ms)",
                steps,
                {"step time (ms)": times},
                highlight_x=outlier_steps[:100],
            ),
        }
        return [
            Finding(
                rule=self.id,
                severity=Severity.MEDIUM if excess_pct >= 10 else self.severity,
                title=f"{idx.size} step(s) slower than median + {thresholds.step_outlier_sigma:g}σ "
                f"cost {excess_pct:.1f}% of step time",
                evidence=evidence,
                recommendation=(
                    f"{idx.size} step(s) (e.g. {', '.join(map(str, outlier_steps[:5]))}) took "
                    f"{float(arr[idx].mean()):.1f} ms against a median of {med:.1f} ms; "
                    f"{ADVICE[cause]}."
                ),
                fix=Fix(code=FIX_CODE, config_patch=patch),
                estimated_saving_pct=r(excess_pct, 1),
            )
        ]

    @staticmethod
    def _cause(frame: pl.DataFrame, idx: np.ndarray, run: Any) -> tuple[str, dict[str, Any]]:
        import numpy as np

        every = config_value(run, "train.checkpoint_every")
        steps = np.asarray(frame["step"].to_list())
        if isinstance(every, int) and every > 0:
            on_checkpoint = np.sum(steps[idx] % every == 0)
            if on_checkpoint * 2 >= idx.size:
                return "checkpoint", {}
        growth: dict[str, Any] = {}
        for column in COMPONENTS:
            if column in frame.columns and frame[column].null_count() < frame.height:
                values = np.asarray(numeric(frame, column))
                growth[column] = r(float(np.nanmean(values[idx]) - np.nanmedian(values)))
        finite = {k: v for k, v in growth.items() if v is not None}
        if not finite:
            return "unknown", growth
        return max(finite, key=finite.get), growth

    examples: ClassVar = (
        Example(
            "run: every 10th step takes 300 ms instead of 50 ms (checkpoints)",
            True,
            lambda: ex.inputs(
                run=ex.run(
                    ex.series(
                        40,
                        step_time_ms=lambda s: 300.0 if s % 10 == 0 else 50.0 + (s % 3),
                        compute_ms=40.0,
                    ),
                    config={"train.checkpoint_every": 10},
                    environment=ex.CPU_ENV,
                )
            ),
        ),
        Example(
            "run: steady 50 ms steps with 2 ms noise",
            False,
            lambda: ex.inputs(
                run=ex.run(
                    ex.series(40, step_time_ms=lambda s: 50.0 + (s * 7 % 5) * 0.5),
                    environment=ex.CPU_ENV,
                )
            ),
        ),
    )
