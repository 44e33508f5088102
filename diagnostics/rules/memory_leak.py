"""memory-leak: memory grows step after step, after warm-up.

What it finds
    Steady growth of CUDA allocated memory or of the trainer's resident set size (RSS) over
    the steps after a warm-up share: a positive robust slope (Theil-Sen, the median of all
    pairwise slopes, so a one-off jump does not make a trend), memory higher at the later
    step in most pairs of steps (Mann-Kendall: a leak's occasional small fall or transient
    spike does not hide it), and a total growth that is a material share of the baseline. It reports bytes
    per step and the steps left until the device (or host) runs out. Growth confined to the
    warm-up (optimiser state, caches filling) is reported apart and does not fire; CUDA
    *reserved* memory growing while *allocated* stays flat is the caching allocator keeping
    blocks, not a leak, and does not fire either. Where line-level memory was recorded, the
    lines with the largest increments are named (memory allocated there and not released:
    the allocation a leaked reference keeps alive). A trace is judged the same way from its
    allocation events at each step's end when it covers enough steps.

Why it matters
    A leak ends in an out-of-memory crash hours into a run, and before that it slows every
    step (allocator pressure, swapping).

How to fix
    The classic cause is ``total_loss += loss``, which keeps every step's autograd graph
    alive: accumulate ``loss.item()`` (or ``loss.detach()``) instead. Do not keep batches,
    outputs or tensors that require grad in Python lists across steps.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import polars as pl

from diagnostics.model import AnalysisInputs
from diagnostics.percent import pct
from diagnostics.rules import examples as ex
from diagnostics.rules.base import (
    Example,
    Finding,
    Fix,
    Need,
    Rule,
    Severity,
    need_any,
    need_run_steps,
)
from diagnostics.rules.evidence import (
    GPU_MEMORY_KEYS,
    HOST_MEMORY_KEYS,
    chart,
    first_positive_int,
    has_steps,
    numeric,
    r,
    run_device,
)
from diagnostics.rules.stats import increasing_share, theil_sen_slope
from diagnostics.thresholds import Thresholds

FIX_CODE = """\
# before: each step's graph stays alive through total_loss; batches pile up
total_loss = 0
history = []
for batch in loader:
    loss = model(**batch).loss
    loss.backward()
    total_loss += loss            # a tensor that requires grad: keeps the graph
    history.append(batch)         # keeps every batch

# after: accumulate a Python float, keep nothing across steps
total_loss = 0.0
for batch in loader:
    loss = model(**batch).loss
    loss.backward()
    total_loss += loss.item()     # or loss.detach()
"""
PATCH = {"train.accumulate_loss_as_tensor": False, "train.keep_batch_history": False}


def growth_stats(
    steps: list[int], values: list[float], thresholds: Thresholds
) -> dict[str, Any] | None:
    """Growth figures of one memory series after warm-up; None when too short to judge."""
    pairs = [
        (s, v) for s, v in zip(steps, values, strict=True) if v is not None and math.isfinite(v)
    ]
    if not pairs:
        return None
    warm = int(math.ceil(len(pairs) * thresholds.leak_warmup_share))
    # too short to judge (a trace's handful of steps): decided before numpy is imported
    if max(len(pairs) - warm, 0) < thresholds.leak_min_steps:
        return None
    import numpy as np

    xs = np.array([p[0] for p in pairs], dtype=float)
    ys = np.array([p[1] for p in pairs], dtype=float)
    sx, sy = xs[warm:], ys[warm:]
    slope = theil_sen_slope(sx, sy)
    head = max(3, sx.size // 10)
    baseline = float(np.median(sy[:head]))
    span_steps = float(sx[-1] - sx[0])
    growth = slope * span_steps
    return {
        "slope_bytes_per_step": slope,
        "increasing_share": increasing_share(sy),
        "baseline_bytes": baseline,
        "growth_bytes": growth,
        "growth_pct": 100.0 * growth / baseline if baseline > 0 else 0.0,
        "warmup_growth_bytes": float(baseline - ys[0]),
        "warmup_steps": int(warm),
        "steady_steps": [int(sx[0]), int(sx[-1])],
        "last_bytes": float(sy[-1]),
    }


def is_leak(stats: dict[str, Any] | None, thresholds: Thresholds) -> bool:
    return (
        stats is not None
        and stats["slope_bytes_per_step"] > 0
        and stats["increasing_share"] >= thresholds.leak_min_increasing_share
        and stats["growth_pct"] >= thresholds.leak_min_growth_pct
    )


class MemoryLeak(Rule):
    id = "memory-leak"
    title = "Memory grows steadily across steps"
    severity = Severity.HIGH
    needs = (
        need_any(
            need_run_steps("rss_bytes"),
            need_run_steps("cuda_allocated_bytes"),
            Need(
                "a trace's memory events over its steps",
                lambda inputs: (
                    inputs.trace is not None
                    and inputs.trace.memory.height > 0
                    and inputs.trace.steps.height > 0
                ),
            ),
            text=(
                "run step records with rss_bytes or cuda_allocated_bytes, or a trace's memory "
                "events over its steps"
            ),
            skip=(
                "no memory over steps: needs run step records (rss/cuda allocated) or trace "
                "memory events"
            ),
        ),
    )
    threshold_names = (
        "leak_warmup_share",
        "leak_min_increasing_share",
        "leak_min_growth_pct",
        "leak_min_steps",
    )

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        series = self._series(inputs)
        findings = []
        for name, (steps, values, capacity, extra) in series.items():
            stats = growth_stats(steps, values, thresholds)
            if not is_leak(stats, thresholds):
                continue
            assert stats is not None
            findings.append(
                self._finding(inputs, name, steps, values, stats, capacity, extra, thresholds)
            )
        # one finding: the most telling series (device memory before host RSS)
        return findings[:1]

    def _series(
        self, inputs: AnalysisInputs
    ) -> dict[str, tuple[list[int], list[float], int | None, dict[str, Any]]]:
        out: dict[str, tuple[list[int], list[float], int | None, dict[str, Any]]] = {}
        run = inputs.run
        if run is not None and run.steps.height:
            steps = run.steps["step"].to_list()
            env = run.environment
            if has_steps(run, "cuda_allocated_bytes") and run_device(run) == "cuda":
                capacity = first_positive_int(env, GPU_MEMORY_KEYS)
                if capacity is None and run.samples.height:
                    total = run.samples["gpu_mem_total_bytes"].max()
                    capacity = int(total) if total is not None else None
                extra: dict[str, Any] = {}
                if has_steps(run, "cuda_reserved_bytes"):
                    extra["reserved"] = numeric(run.steps, "cuda_reserved_bytes")
                out["CUDA allocated memory"] = (
                    steps,
                    numeric(run.steps, "cuda_allocated_bytes"),
                    capacity,
                    extra,
                )
            if has_steps(run, "rss_bytes"):
                out["host RSS of the trainer"] = (
                    steps,
                    numeric(run.steps, "rss_bytes"),
                    first_positive_int(env, HOST_MEMORY_KEYS),
                    {},
                )
            return out
        trace = inputs.trace
        if trace is not None and trace.memory.height and trace.steps.height:
            mem = (
                trace.memory.filter(pl.col("device") >= 0)
                if trace.device == "cuda"
                else trace.memory
            )
            if mem.height == 0:
                mem = trace.memory
            ends = trace.steps.select("step", pl.col("end_us").alias("ts_us")).sort("ts_us")
            at_end = ends.join_asof(
                mem.select("ts_us", "allocated_bytes").sort("ts_us"), on="ts_us"
            )
            out["allocated memory at each profiler step's end"] = (
                at_end["step"].to_list(),
                numeric(at_end, "allocated_bytes"),
                trace.device_memory_bytes,
                {},
            )
        return out

    def _finding(
        self,
        inputs: AnalysisInputs,
        name: str,
        steps: list[int],
        values: list[float],
        stats: dict[str, Any],
        capacity: int | None,
        extra: dict[str, Any],
        thresholds: Thresholds,
    ) -> Finding:
        slope = stats["slope_bytes_per_step"]
        steps_to_oom = (
            int((capacity - stats["last_bytes"]) / slope)
            if capacity and capacity > stats["last_bytes"]
            else None
        )
        evidence: dict[str, Any] = {
            "series": name,
            "slope_bytes_per_step": r(slope, 0),
            "slope_mib_per_100_steps": r(slope * 100 / 2**20, 2),
            "increasing_share": r(stats["increasing_share"], 2),
            "growth_bytes": r(stats["growth_bytes"], 0),
            "growth_pct_of_baseline": r(stats["growth_pct"], 1),
            "baseline_bytes": r(stats["baseline_bytes"], 0),
            "warmup_steps": stats["warmup_steps"],
            "warmup_growth_bytes": r(stats["warmup_growth_bytes"], 0),
            "capacity_bytes": capacity,
            "projected_steps_to_oom": steps_to_oom,
            "steps": stats["steady_steps"],
            "method": "Theil-Sen slope over the steps after warm-up",
        }
        if "reserved" in extra:
            reserved_stats = growth_stats(steps, extra["reserved"], thresholds)
            evidence["reserved_slope_bytes_per_step"] = (
                r(reserved_stats["slope_bytes_per_step"], 0) if reserved_stats else None
            )
        lines = self._memory_lines(inputs)
        if lines:
            evidence["memory_lines"] = lines
        fitted = [stats["baseline_bytes"] + slope * (s - stats["steady_steps"][0]) for s in steps]
        evidence["chart"] = chart(
            "line",
            f"{name} per step",
            "step",
            "bytes",
            steps,
            {
                name: values,
                "Theil-Sen fit": [
                    f if s >= stats["steady_steps"][0] else None
                    for s, f in zip(steps, fitted, strict=True)
                ],
            },
        )
        oom_text = (
            f" At this rate memory runs out in about {steps_to_oom} more steps."
            if steps_to_oom is not None
            else ""
        )
        line_text = (
            f" The recorded lines whose allocations stay are led by {lines[0]['function']} "
            f"line {lines[0]['line']} (+{lines[0]['increment_mib']} MiB over the run): "
            f"{lines[0]['source']!r}; what keeps them alive is a reference held across steps."
            if lines
            else ""
        )
        return Finding(
            rule=self.id,
            severity=Severity.HIGH,
            title=f"{name} grows {slope / 2**20:.2f} MiB per step after warm-up",
            evidence=evidence,
            recommendation=(
                f"{name} grew {stats['growth_bytes'] / 2**20:.1f} MiB "
                f"({pct(stats['growth_pct'])}) from step {stats['steady_steps'][0]} to "
                f"{stats['steady_steps'][1]}, higher at the later step in "
                f"{pct(100 * stats['increasing_share'])} of pairs of steps.{oom_text}{line_text} Accumulate "
                "loss.item() instead of the loss tensor and keep no per-batch tensors across steps."
            ),
            fix=Fix(code=FIX_CODE, config_patch=dict(PATCH)),
            estimated_saving_pct=None,
        )

    @staticmethod
    def _memory_lines(inputs: AnalysisInputs) -> list[dict[str, Any]]:
        run = inputs.run
        if run is None or run.memory_lines is None or run.memory_lines.height == 0:
            return []
        # memory_profiler reports the process's memory at entry on a function's `def` line:
        # a baseline, not an allocation, so those lines are left out
        header = (
            pl.col("source").fill_null("").str.strip_chars().str.contains(r"^(async\s+)?def\s|^@")
        )
        top = (
            run.memory_lines.filter((pl.col("increment_mib") > 0) & ~header)
            .sort("increment_mib", descending=True)
            .head(5)
        )
        return [
            {
                "function": row["function"],
                "filename": row["filename"],
                "line": row["line"],
                "increment_mib": r(row["increment_mib"], 2),
                "source": (row["source"] or "").strip(),
            }
            for row in top.iter_rows(named=True)
        ]

    examples: ClassVar = (
        Example(
            "run: RSS grows 4 MiB every step after warm-up",
            True,
            lambda: ex.inputs(
                run=ex.run(
                    ex.series(50, rss_bytes=lambda s: 800 * 2**20 + 4 * 2**20 * s),
                    environment={**ex.CPU_ENV, "memory_total_bytes": 16 * 2**30},
                    memory_lines=[
                        {
                            "function": "train_step",
                            "filename": "loop.py",
                            "line": 42,
                            "mem_usage_mib": 900.0,
                            "increment_mib": 150.0,
                            "occurrences": 50,
                            "source": "total_loss += loss",
                        }
                    ],
                )
            ),
        ),
        Example(
            "run: RSS jumps during warm-up, then stays flat with noise",
            False,
            lambda: ex.inputs(
                run=ex.run(
                    ex.series(
                        50,
                        rss_bytes=lambda s: (
                            (400 if s <= 5 else 800) * 2**20 + ((s * 37) % 7 - 3) * 2**16
                        ),
                    ),
                    environment=ex.CPU_ENV,
                )
            ),
        ),
        Example(
            "run on CUDA: reserved grows (caching allocator) while allocated is flat",
            False,
            lambda: ex.inputs(
                run=ex.run(
                    ex.series(
                        50,
                        cuda_allocated_bytes=2 * 2**30,
                        cuda_reserved_bytes=lambda s: 2 * 2**30 + s * 2**24,
                        rss_bytes=3 * 2**30,
                    ),
                    environment=ex.CUDA_ENV,
                )
            ),
        ),
        Example(
            "run on CUDA: allocated grows 8 MiB per step",
            True,
            lambda: ex.inputs(
                run=ex.run(
                    ex.series(
                        40,
                        cuda_allocated_bytes=lambda s: 2**30 + s * 2**23,
                        cuda_reserved_bytes=lambda s: 2**31 + s * 2**23,
                        rss_bytes=3 * 2**30,
                    ),
                    environment={**ex.CUDA_ENV, "gpu_memory_bytes": 80 * 2**30},
                )
            ),
        ),
    )
