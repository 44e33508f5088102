"""low-gpu-utilization: the GPU is idle for much of the step.

What it finds
    A trace whose GPU busy time (the union of kernels, copies and memsets over all streams)
    covers less than a threshold share of the profiled steps, or a run whose NVML
    utilisation samples have a low 95th percentile. It reports where the idle time went:
    the analyser attributes each idle gap to what the host was doing meanwhile (waiting for
    the DataLoader, synchronising, copying from pageable memory, running CPU ops) and HTA's
    kind (host-wait, kernel-wait, other), and names the rules that explain the largest parts.

Why it matters
    An idle GPU is paid for and does nothing; the fix is almost never on the GPU itself but
    in whatever keeps the host from feeding it.

Which figure
    A trace is judged on GPU busy (kernels, copies, memsets), not on the kernel-time
    utilisation nvidia-smi shows: the idle time this rule explains is the complement of busy
    time (its idle gaps are the stretches with no GPU work at all, and their parts add up to
    ``span - busy``), and a copy with no kernel beside it is work the step asked for, which
    missing-pin-memory judges, not idleness. Busy is never below the kernel-time figure, so
    the rule fires on no more traces than a kernel-time test would. Evidence gives both.
    A run without a trace is judged on NVML's samples, which are kernel time.

How to fix
    Follow the related findings in order of the idle time they explain: more DataLoader
    workers, fewer host-device synchronisations, pinned memory; if the host is simply not
    the bottleneck and kernels are short, a larger batch gives each launch more work.
"""

from __future__ import annotations

from typing import Any, ClassVar

import polars as pl

from diagnostics.metrics import trace_gpu_busy_pct, trace_gpu_kernel_utilization_pct
from diagnostics.model import AnalysisInputs
from diagnostics.percent import pct
from diagnostics.rules import examples as ex
from diagnostics.rules.base import Example, Finding, Fix, Need, Rule, Severity, need_cuda
from diagnostics.rules.evidence import chart, cuda_trace, r, run_device, step_range
from diagnostics.thresholds import Thresholds

# What the host did during a GPU idle gap -> the rule whose fix removes that cause.
RELATED_RULE = {
    "dataloader": "too-few-workers",
    "sync": "host-device-sync",
    "pageable_copy": "missing-pin-memory",
    "cpu_ops": "launch-bound-kernels",
}
ADVICE = {
    "dataloader": "the host was waiting for the DataLoader: add workers",
    "sync": "the host was blocked in synchronisation calls: remove per-step .item()/.cpu()",
    "pageable_copy": "the host was copying from pageable memory: pin memory",
    "cpu_ops": "the host was busy running Python/CPU ops: batch more work per launch",
    "none": "no host activity was recorded during the gaps",
    "unknown": "unknown: the trace has no CPU side, so what the host did is not recorded",
}

FIX_CODE = """\
# before: the GPU waits on the input pipeline and per-step host work
loader = DataLoader(dataset, batch_size=16)
for batch in loader:
    loss = step(batch.to("cuda"))
    print(loss.item())            # a sync every step

# after: workers, pinned async copies, fewer syncs, more work per step
loader = DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=True)
for i, batch in enumerate(loader):
    loss = step(batch.to("cuda", non_blocking=True))
    if i % 50 == 0:
        print(loss.item())
"""


def gpu_samples(inputs: AnalysisInputs) -> pl.DataFrame:
    """A CUDA run's system samples that carry an NVML utilisation reading."""
    run = inputs.run
    if run is None or run_device(run) != "cuda" or run.samples.height == 0:
        return pl.DataFrame()
    return run.samples.filter(pl.col("gpu_util_pct").is_not_null())


class LowGpuUtilization(Rule):
    id = "low-gpu-utilization"
    title = "The GPU is idle for much of each step"
    severity = Severity.HIGH
    needs = (
        need_cuda("GPU utilisation"),
        Need(
            "without a CUDA trace, the run's NVML utilisation samples",
            lambda inputs: cuda_trace(inputs) is not None or gpu_samples(inputs).height > 0,
            "the CUDA run has no NVML utilisation samples (NVML unavailable?) and no trace",
        ),
    )
    threshold_names = ("gpu_util_low_pct", "gpu_util_p95_low_pct", "gpu_util_min_samples")

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        trace = cuda_trace(inputs)
        if trace is not None and trace.gpu.height:
            return self._from_trace(inputs, thresholds)
        return self._from_samples(inputs, thresholds)

    def _from_trace(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        trace = inputs.trace
        assert trace is not None
        busy = float(trace.gpu["busy_us"].sum())
        span = float(trace.gpu["span_us"].sum())
        # the key metrics' utilisation: the number on the card and in the reports
        util = trace_gpu_busy_pct(trace)
        if util is None or util >= thresholds.gpu_util_low_pct:
            return []
        idle_us = max(span - busy, 0.0)
        # without ProfilerStep ranges the span is a recording window, not training steps
        window = (
            "the recorded window (no ProfilerStep ranges)"
            if trace.steps_inferred
            else "the profiled steps"
        )
        # a GPU-only trace cannot say what the host did while the GPU idled
        causes = self._idle_causes(trace.idle_gaps) if trace.host_side else {}
        ranked = sorted(causes.items(), key=lambda kv: kv[1]["idle_us"], reverse=True)
        related = [
            RELATED_RULE[k] for k, v in ranked if k in RELATED_RULE and v["share_pct"] >= 10.0
        ]
        top = ranked[0][0] if ranked else ("none" if trace.host_side else "unknown")
        evidence: dict[str, Any] = {
            "source": f"trace: GPU busy time over {window}",
            "gpu_busy_pct": r(util, 1),
            "gpu_kernel_utilization_pct": r(trace_gpu_kernel_utilization_pct(trace), 1),
            "gpu_busy_us": r(busy, 0),
            "gpu_span_us": r(span, 0),
            "gpu_idle_us": r(idle_us, 0),
            "threshold_pct": thresholds.gpu_util_low_pct,
            "idle_by_host_activity": causes,
            "idle_by_kind": self._idle_kinds(trace.idle_gaps) if trace.host_side else None,
            "related_rules": related,
            # which steps, not absolute timestamps (a range of those read as a duration
            # printed "1451 h 20 min")
            "steps": step_range(trace.steps["step"]),
            "chart": chart(
                "bar",
                "Where the GPU idle time went (host activity during gaps)",
                "host activity",
                "idle time (ms)",
                [k for k, _ in ranked],
                {"idle (ms)": [round(v["idle_us"] / 1000.0, 3) for _, v in ranked]},
            ),
        }
        explanation = ADVICE.get(top, ADVICE["none"])
        return [
            Finding(
                rule=self.id,
                severity=Severity.HIGH
                if util < thresholds.gpu_util_low_pct / 2
                else Severity.MEDIUM,
                title=f"GPU busy only {pct(util)} of {window}",
                evidence=evidence,
                recommendation=(
                    f"The GPU was idle {idle_us / 1000:.1f} ms of {span / 1000:.1f} ms. "
                    f"Most idle time: {explanation}."
                    + (f" See {', '.join(related)}." if related else "")
                ),
                fix=Fix(code=FIX_CODE, config_patch=None),
                estimated_saving_pct=None,
            )
        ]

    @staticmethod
    def _idle_causes(gaps: pl.DataFrame) -> dict[str, dict[str, float | None]]:
        if gaps.height == 0:
            return {}
        total = float(gaps["dur_us"].sum()) or 1.0
        grouped = (
            gaps.with_columns(pl.col("host_activity").fill_null("none"))
            .group_by("host_activity")
            .agg(pl.col("dur_us").sum().alias("idle_us"), pl.len().alias("gaps"))
            .sort("idle_us", descending=True)
        )
        return {
            row["host_activity"]: {
                "idle_us": r(row["idle_us"], 0),
                "gaps": row["gaps"],
                "share_pct": r(100.0 * row["idle_us"] / total, 1),
            }
            for row in grouped.iter_rows(named=True)
        }

    @staticmethod
    def _idle_kinds(gaps: pl.DataFrame) -> dict[str, float | None]:
        if gaps.height == 0:
            return {}
        total = float(gaps["dur_us"].sum()) or 1.0
        # largest share first, then by name: the same JSON, key for key, on every run
        grouped = (
            gaps.group_by("idle_kind")
            .agg(pl.col("dur_us").sum())
            .sort(["dur_us", "idle_kind"], descending=[True, False])
        )
        return {
            str(row["idle_kind"]): r(100.0 * row["dur_us"] / total, 1)
            for row in grouped.iter_rows(named=True)
        }

    def _from_samples(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        import numpy as np

        samples = gpu_samples(inputs)
        if samples.height < thresholds.gpu_util_min_samples:
            return []
        util = samples["gpu_util_pct"].to_numpy().astype(float)
        p95, p5, mean = (
            float(np.percentile(util, 95)),
            float(np.percentile(util, 5)),
            float(util.mean()),
        )
        if p95 >= thresholds.gpu_util_p95_low_pct:
            return []
        t0 = float(samples["wall_time"].min())
        evidence = {
            "source": "run: NVML utilisation samples",
            "samples": samples.height,
            "gpu_util_p95_pct": r(p95, 1),
            "gpu_util_p5_pct": r(p5, 1),
            "gpu_util_mean_pct": r(mean, 1),
            "threshold_p95_pct": thresholds.gpu_util_p95_low_pct,
            "time_range_s": [0.0, r(float(samples["wall_time"].max()) - t0, 1)],
            "related_rules": [],
            "chart": chart(
                "line",
                "GPU utilisation (NVML samples)",
                "time since first sample (s)",
                "utilisation (%)",
                [w - t0 for w in samples["wall_time"].to_list()],
                {"GPU util (%)": util.tolist()},
            ),
        }
        return [
            Finding(
                rule=self.id,
                severity=Severity.HIGH
                if p95 < thresholds.gpu_util_p95_low_pct / 2
                else Severity.MEDIUM,
                title=f"GPU utilisation p95 is {pct(p95)} over the run (NVML samples)",
                evidence=evidence,
                recommendation=(
                    f"NVML shows the GPU busy {pct(mean)} of the time on average (p95 {pct(p95)}). "
                    "Profile a few steps to see where the idle time goes; check the data-wait "
                    "and host-sync findings first."
                ),
                fix=Fix(code=FIX_CODE, config_patch=None),
            )
        ]

    examples: ClassVar = (
        Example(
            "trace: GPU busy 3 of 10 ms, gaps while the host waits for the DataLoader",
            True,
            lambda: ex.inputs(
                trace=ex.trace(
                    gpu=ex.gpu_rows(15_000.0),
                    idle_gaps=[
                        {
                            "device": 0,
                            "stream": 7,
                            "start_us": 0.0,
                            "end_us": 30_000.0,
                            "dur_us": 30_000.0,
                            "idle_kind": "host_wait",
                            "host_activity": "dataloader",
                        },
                        {
                            "device": 0,
                            "stream": 7,
                            "start_us": 40_000.0,
                            "end_us": 45_000.0,
                            "dur_us": 5_000.0,
                            "idle_kind": "other",
                            "host_activity": "cpu_ops",
                        },
                    ],
                )
            ),
        ),
        Example(
            "trace: GPU busy 92% of the steps",
            False,
            lambda: ex.inputs(trace=ex.trace(gpu=ex.gpu_rows(46_000.0))),
        ),
        Example(
            "run: NVML p95 utilisation 40%",
            True,
            lambda: ex.inputs(
                run=ex.run(
                    ex.series(5, step_time_ms=10.0, cuda_allocated_bytes=2**30),
                    environment=ex.CUDA_ENV,
                    samples={
                        "wall_time": [i * 0.1 for i in range(30)],
                        "gpu_index": [0] * 30,
                        "gpu_util_pct": [20.0 + (i % 3) * 10 for i in range(30)],
                    },
                )
            ),
        ),
        Example(
            "run on CPU: skipped, no GPU to measure",
            False,
            lambda: ex.cpu_run(5, step_time_ms=10.0),
            skipped=True,
        ),
    )
