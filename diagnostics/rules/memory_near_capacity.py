"""memory-near-capacity: peak GPU memory is close to the device's total.

What it finds
    Peak allocated memory above a threshold share of the device's memory: from a trace's
    allocation events against ``deviceProperties.totalGlobalMem``, or from a run's
    per-step CUDA peak (or NVML memory used) against the GPU's total.

Why it matters
    A run this close to the limit fails with an out-of-memory error on a slightly longer
    sequence or a new library version, and the caching allocator starts freeing and
    re-allocating (``cudaFree`` syncs) well before that.

How to fix
    Lower the batch size (keep the effective batch with gradient accumulation), train in
    bf16, or recompute activations (``torch.utils.checkpoint``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import polars as pl

from diagnostics import percent
from diagnostics.model import AnalysisInputs
from diagnostics.rules import examples as ex
from diagnostics.rules.base import Example, Finding, Fix, Rule, Severity, need_cuda
from diagnostics.rules.device_advice import DeviceAdvice, device_advice
from diagnostics.rules.evidence import (
    GPU_MEMORY_KEYS,
    chart,
    config_value,
    cuda_trace,
    first_positive_int,
    has_steps,
    numeric,
    r,
    run_device,
)
from diagnostics.thresholds import Thresholds


def fix_code(advice: DeviceAdvice) -> str:
    """Half the batch, the same effective batch through accumulation, half-precision
    activations in the precision this GPU takes."""
    step = advice.autocast(
        "loss = model(**batch).loss / 2",
        "loss.backward()\nif (step + 1) % 2 == 0:\n    optimizer.step()\n    optimizer.zero_grad()",
    )
    return (
        "# before\n"
        "loader = DataLoader(dataset, batch_size=64)\n"
        "loss = model(**batch).loss\n\n"
        "# after: half the batch, same effective batch through accumulation, "
        f"{advice.dtype} activations\n"
        "loader = DataLoader(dataset, batch_size=32)\n" + step
    )


class MemoryNearCapacity(Rule):
    id = "memory-near-capacity"
    title = "GPU memory is nearly full"
    severity = Severity.MEDIUM
    needs = (need_cuda("device memory capacity"),)
    threshold_names = ("memory_capacity_high_pct",)

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        measured = self._measure(inputs)
        if measured is None:
            return []
        peak, capacity, source, xs, ys, x_label, where = measured
        pct = 100.0 * peak / capacity
        if pct < thresholds.memory_capacity_high_pct:
            return []
        advice = device_advice(inputs)
        batch = config_value(inputs.run, "train.batch_size")
        patch = {"train.batch_size": max(1, batch // 2)} if isinstance(batch, int) else None
        evidence: dict[str, Any] = {
            "source": source,
            "peak_bytes": int(peak),
            "capacity_bytes": int(capacity),
            "peak_pct": r(pct, 1),
            "threshold_pct": thresholds.memory_capacity_high_pct,
            **where,
            "chart": chart(
                "line",
                "GPU memory against capacity",
                x_label,
                "bytes",
                xs,
                {"memory (bytes)": ys, "capacity (bytes)": [capacity] * len(xs)},
            ),
        }
        return [
            Finding(
                rule=self.id,
                severity=Severity.HIGH if pct >= 97 else self.severity,
                title=f"Peak GPU memory is {percent.pct(pct)} of the device's {capacity / 2**30:.0f} GiB",
                evidence=evidence,
                recommendation=(
                    f"Peak memory reached {peak / 2**30:.2f} of {capacity / 2**30:.2f} GiB. Lower "
                    "the batch size (accumulate gradients to keep the effective batch), use "
                    f"{advice.precision} autocast, or checkpoint activations."
                ),
                fix=Fix(code=fix_code(advice), config_patch=patch),
            )
        ]

    @staticmethod
    def _measure(inputs: AnalysisInputs) -> tuple | None:
        trace = cuda_trace(inputs)
        if trace is not None and trace.memory.height and trace.device_memory_bytes:
            mem = trace.memory.filter(pl.col("device") >= 0)
            if mem.height:
                # relative to the first event: absolute trace timestamps read as durations
                # would print as "1451 h 20 min"
                first = min(mem["ts_us"].to_list())
                ts = [(t - first) / 1000.0 for t in mem["ts_us"].to_list()]
                return (
                    float(mem["allocated_bytes"].max()),
                    float(trace.device_memory_bytes),
                    "trace: [memory] allocation events vs deviceProperties.totalGlobalMem",
                    ts,
                    mem["allocated_bytes"].to_list(),
                    "time since the first [memory] event (ms)",
                    {"time_range_us": [0, r((max(ts) - min(ts)) * 1000.0, 0)]},
                )
        run = inputs.run
        if run is None or run_device(run) != "cuda":
            return None
        capacity = first_positive_int(run.environment, GPU_MEMORY_KEYS)
        samples = run.samples.filter(pl.col("gpu_mem_total_bytes").is_not_null())
        if capacity is None and samples.height:
            capacity = int(samples["gpu_mem_total_bytes"].max())
        if not capacity:
            return None
        steps = run.steps["step"].to_list()
        if has_steps(run, "cuda_peak_bytes"):
            return (
                float(run.steps["cuda_peak_bytes"].max()),
                float(capacity),
                "run: per-step CUDA peak allocated memory vs the GPU's total",
                steps,
                numeric(run.steps, "cuda_peak_bytes"),
                "step",
                {"steps": [steps[0], steps[-1]]},
            )
        if samples.height and samples["gpu_mem_used_bytes"].null_count() < samples.height:
            t0 = float(samples["wall_time"].min())
            times = [w - t0 for w in samples["wall_time"].to_list()]
            return (
                float(samples["gpu_mem_used_bytes"].max()),
                float(capacity),
                "run: NVML memory used vs total",
                times,
                samples["gpu_mem_used_bytes"].to_list(),
                "time since first sample (s)",
                {"time_range_s": [0.0, r(max(times), 1)]},
            )
        return None

    examples: ClassVar = (
        Example(
            "trace: 75 of 80 GiB allocated",
            True,
            lambda: ex.inputs(
                trace=ex.trace(
                    memory={
                        "ts_us": [0.0, 1000.0, 2000.0],
                        "device": [0, 0, 0],
                        "allocated_bytes": [60 * 2**30, 75 * 2**30, 70 * 2**30],
                        "reserved_bytes": [78 * 2**30] * 3,
                    }
                )
            ),
        ),
        Example(
            "run on CUDA: peak 20 of 80 GiB",
            False,
            lambda: ex.inputs(
                run=ex.run(
                    ex.series(10, cuda_allocated_bytes=2**34, cuda_peak_bytes=20 * 2**30),
                    environment={**ex.CUDA_ENV, "gpu_memory_bytes": 80 * 2**30},
                )
            ),
        ),
        Example(
            "run on CUDA: peak 78 of 80 GiB, batch 64",
            True,
            lambda: ex.inputs(
                run=ex.run(
                    ex.series(10, cuda_allocated_bytes=2**34, cuda_peak_bytes=78 * 2**30),
                    config={"train.batch_size": 64},
                    environment={**ex.CUDA_ENV, "gpu_memory_bytes": 80 * 2**30},
                )
            ),
        ),
    )
