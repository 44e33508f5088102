"""batch-too-small: the batch leaves the GPU both idle and mostly empty.

What it finds
    A CUDA trace or run whose GPU is under-used (busy share or NVML p95 below the
    low-utilisation threshold) *and* whose peak memory is below a threshold share of the
    device, while the DataLoader is not the bottleneck (then more workers come first). The
    recommended batch grows by the factor both headrooms allow: memory (peak x factor stays
    under 80% of the device) and utilisation (busy share x factor reaches 100%), as a power
    of two.

Why it matters
    With a small batch each kernel has little work: launch overhead and fixed per-step
    costs (optimiser, synchronisation) dominate, and throughput per GPU-hour is low.

How to fix
    Raise the batch size (and the learning rate with it, e.g. linearly with warm-up), or
    train several configurations on one GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import polars as pl

from diagnostics.metrics import median_share_pct, trace_gpu_busy_pct
from diagnostics.model import AnalysisInputs
from diagnostics.percent import pct
from diagnostics.rules import examples as ex
from diagnostics.rules.base import Example, Finding, Fix, Rule, Severity, need_cuda
from diagnostics.rules.evidence import (
    GPU_MEMORY_KEYS,
    chart,
    config_value,
    cuda_trace,
    first_positive_int,
    has_steps,
    r,
    run_device,
    step_range,
)
from diagnostics.thresholds import Thresholds

# Memory a larger batch may fill: leave a fifth for fragmentation and spikes.
MEMORY_TARGET_SHARE = 0.8
MAX_FACTOR = 16

FIX_CODE = """\
# before
loader = DataLoader(dataset, batch_size=8)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

# after: {factor}x the batch; scale the learning rate with it (with a warm-up)
loader = DataLoader(dataset, batch_size=8 * {factor})
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4 * {factor})
"""


class BatchTooSmall(Rule):
    id = "batch-too-small"
    title = "The batch is too small for the GPU"
    severity = Severity.MEDIUM
    needs = (need_cuda("judging the batch against the GPU"),)
    threshold_names = (
        "gpu_util_low_pct",
        "gpu_util_p95_low_pct",
        "gpu_util_min_samples",
        "batch_memory_low_pct",
        "dataloader_share_min_pct",
    )

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        measured = self._measure(inputs, thresholds)
        if measured is None:
            return []
        util, util_limit, peak, capacity, loader_pct, where = measured
        mem_pct = 100.0 * peak / capacity
        if (
            util >= util_limit
            or mem_pct >= thresholds.batch_memory_low_pct
            or loader_pct >= thresholds.dataloader_share_min_pct
        ):
            return []
        by_memory = MEMORY_TARGET_SHARE * capacity / max(peak, 1.0)
        by_util = 100.0 / max(util, 1.0)
        factor = 2 ** int(math.floor(math.log2(max(2.0, min(by_memory, by_util, MAX_FACTOR)))))
        batch = config_value(inputs.run, "train.batch_size")
        patch = {"train.batch_size": batch * factor} if isinstance(batch, int) else None
        evidence: dict[str, Any] = {
            **where,
            "gpu_busy_pct": r(util, 1),
            "peak_memory_bytes": int(peak),
            "capacity_bytes": int(capacity),
            "peak_memory_pct": r(mem_pct, 1),
            "dataloader_share_pct": r(loader_pct, 1),
            "batch_size": batch,
            "growth_factor": factor,
            "factor_allowed_by_memory": r(by_memory, 1),
            "factor_allowed_by_utilisation": r(by_util, 1),
            "chart": chart(
                "bar",
                "GPU headroom",
                "resource",
                "used (%)",
                ["GPU busy", "GPU memory"],
                {"used (%)": [r(util, 1), r(mem_pct, 1)]},
            ),
        }
        batch_text = f"from {batch} to {batch * factor}" if isinstance(batch, int) else f"{factor}x"
        return [
            Finding(
                rule=self.id,
                severity=self.severity,
                title=f"GPU {pct(util)} busy with {pct(mem_pct)} of its memory used: "
                "the batch is too small",
                evidence=evidence,
                recommendation=(
                    f"The GPU is busy {pct(util)} of the time and holds {pct(mem_pct)} of its "
                    f"memory at peak, and the DataLoader is not the bottleneck. Raise the batch "
                    f"{batch_text} (scale the learning rate with it)."
                ),
                fix=Fix(code=FIX_CODE.format(factor=factor), config_patch=patch),
                estimated_saving_pct=None,
            )
        ]

    @staticmethod
    def _measure(inputs: AnalysisInputs, t: Thresholds) -> tuple | None:
        trace = cuda_trace(inputs)
        if trace is not None and trace.gpu.height and trace.device_memory_bytes:
            util = trace_gpu_busy_pct(trace)
            util = 100.0 if util is None else util
            mem = trace.memory.filter(pl.col("device") >= 0)
            if mem.height == 0:
                return None
            peak = float(mem["allocated_bytes"].max())
            bd = trace.breakdown
            # the key metrics' data-wait share: median over steps of DataLoader / step
            loader = (
                median_share_pct(bd["dataloader_us"], bd["total_us"]) if bd.height else 0.0
            ) or 0.0
            steps = trace.steps
            where = {
                "source": "trace: GPU busy share, [memory] peak, DataLoader share",
                "steps": step_range(steps["step"]),
            }
            return util, t.gpu_util_low_pct, peak, float(trace.device_memory_bytes), loader, where
        run = inputs.run
        if run is None or run_device(run) != "cuda":
            return None
        samples = run.samples.filter(pl.col("gpu_util_pct").is_not_null())
        capacity = first_positive_int(run.environment, GPU_MEMORY_KEYS)
        if capacity is None and samples.height:
            total_mem = samples["gpu_mem_total_bytes"].max()
            capacity = int(total_mem) if total_mem is not None else None
        if samples.height < t.gpu_util_min_samples or not capacity:
            return None
        if not has_steps(run, "cuda_peak_bytes"):
            return None
        import numpy as np

        util = float(np.percentile(samples["gpu_util_pct"].to_numpy(), 95))
        peak = float(run.steps["cuda_peak_bytes"].max())
        # the key metrics' data-wait share (median over steady-state steps)
        loader = inputs.metrics.data_wait_pct or 0.0
        steps = run.steps["step"].to_list()
        where = {
            "source": "run: NVML utilisation p95, per-step CUDA peak, data wait share",
            "steps": [steps[0], steps[-1]],
        }
        return util, t.gpu_util_p95_low_pct, peak, float(capacity), loader, where

    examples: ClassVar = (
        Example(
            "run on CUDA: batch 2, NVML p95 20%, peak 2 of 80 GiB, no data wait",
            True,
            lambda: _small_batch_run(data_wait_ms=0.1, gpu_util_pct=lambda i: 15.0 + i % 5),
        ),
        Example(
            "run on CUDA: GPU idle because the loader starves it (too-few-workers comes first)",
            False,
            lambda: _small_batch_run(data_wait_ms=6.0, gpu_util_pct=lambda i: 15.0),
        ),
        Example(
            "trace: GPU 90% busy",
            False,
            lambda: ex.inputs(
                trace=ex.trace(
                    gpu=ex.gpu_rows(45_000.0),
                    memory={
                        "ts_us": [0.0],
                        "device": [0],
                        "allocated_bytes": [2**30],
                        "reserved_bytes": [2**31],
                    },
                )
            ),
        ),
    )


def _small_batch_run(data_wait_ms: float, gpu_util_pct: Callable[[int], float]) -> Any:
    """20 steps of 10 ms at batch 2 on an 80 GiB GPU, peak 2 GiB; 20 NVML samples (examples)."""
    return ex.inputs(
        run=ex.run(
            ex.series(
                20,
                step_time_ms=10.0,
                data_wait_ms=data_wait_ms,
                cuda_allocated_bytes=2**30,
                cuda_peak_bytes=2 * 2**30,
            ),
            config={"train.batch_size": 2},
            environment={**ex.CUDA_ENV, "gpu_memory_bytes": 80 * 2**30},
            samples={
                "wall_time": [i * 0.1 for i in range(20)],
                "gpu_index": [0] * 20,
                "gpu_util_pct": [gpu_util_pct(i) for i in range(20)],
            },
        )
    )
