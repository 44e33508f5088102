"""launch-bound-kernels: most kernels finish faster than the host can launch them.

What it finds
    A CUDA trace in which most kernel launches are *short* as HTA defines it (the kernel
    runs for less time than its launching runtime call takes) while the GPU is under-used:
    the host's launch overhead, not the GPU, sets the pace. Reported with the kernels that
    contribute most short launches and their mean kernel, launch and launch-delay times.

Why it matters
    Each launch costs the host a few microseconds; a model made of many tiny kernels (small
    batch, small layers, unfused element-wise ops, a per-parameter optimizer loop) leaves
    the GPU waiting between them however fast it is.

How to fix
    Give each kernel more work (a larger batch), fuse kernels (``torch.compile``), capture
    the step in a CUDA graph (``torch.compile(mode="reduce-overhead")``), and use the
    ``foreach``/``fused`` optimizer implementations.
"""

from __future__ import annotations

from typing import Any, ClassVar

from diagnostics.metrics import trace_gpu_busy_pct
from diagnostics.model import AnalysisInputs
from diagnostics.percent import pct
from diagnostics.rules import examples as ex
from diagnostics.rules.base import (
    Example,
    Finding,
    Fix,
    Rule,
    Severity,
    need_cuda_trace,
    need_trace_host_side,
)
from diagnostics.rules.evidence import chart, config_value, cuda_trace, r, step_range
from diagnostics.thresholds import Thresholds

FIX_CODE = """\
# before: many tiny kernels, one launch each
model = Model().cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

# after: fused kernels and a CUDA graph per step, fused optimizer, more work per launch
model = torch.compile(Model().cuda(), mode="reduce-overhead")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
loader = DataLoader(dataset, batch_size=2 * batch_size)
"""


class LaunchBoundKernels(Rule):
    id = "launch-bound-kernels"
    title = "Kernels are shorter than their launches"
    severity = Severity.MEDIUM
    needs = (
        need_cuda_trace("kernel launches are only visible in a GPU profile"),
        need_trace_host_side("the launching runtime calls"),
    )
    threshold_names = ("short_kernel_share_min_pct", "gpu_util_low_pct", "launch_delay_outlier_us")

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        trace = cuda_trace(inputs)
        assert trace is not None
        launches = trace.launches
        if launches.height == 0:
            return []
        total = int(launches["count"].sum())
        short = int(launches["short_count"].sum())
        share = 100.0 * short / total if total else 0.0
        util = None
        if trace.gpu.height and float(trace.gpu["span_us"].sum()) > 0:
            util = trace_gpu_busy_pct(trace)
        # with a busy GPU the launches overlap kernels and their cost is hidden
        if share < thresholds.short_kernel_share_min_pct or (
            util is not None and util >= thresholds.gpu_util_low_pct
        ):
            return []
        top = launches.sort("short_count", descending=True).head(10)
        weighted_delay = (
            float((launches["launch_delay_us_mean"].fill_null(0) * launches["count"]).sum()) / total
        )
        rows = [
            {
                "name": row["name"],
                "count": row["count"],
                "short_count": row["short_count"],
                "kernel_us_mean": r(row["kernel_us_mean"], 1),
                "launch_us_mean": r(row["launch_us_mean"], 1),
                "launch_delay_us_mean": r(row["launch_delay_us_mean"], 1),
            }
            for row in top.iter_rows(named=True)
        ]
        steps = trace.steps
        batch = config_value(inputs.run, "train.batch_size")
        patch = {"train.batch_size": 2 * batch} if isinstance(batch, int) else None
        evidence: dict[str, Any] = {
            "source": "trace: runtime launch call <-> kernel by correlation id (HTA's method)",
            "launches": total,
            "short_launches": short,
            "short_share_pct": r(share, 1),
            "gpu_busy_pct": r(util, 1),
            "launch_delay_us_mean": r(weighted_delay, 1),
            "launch_delay_queueing": weighted_delay > thresholds.launch_delay_outlier_us,
            "top_kernels": rows,
            "steps": step_range(steps["step"]),
            "chart": chart(
                "bar",
                "Short launches by kernel (GPU time below launch time)",
                "kernel",
                "launches",
                [row["name"][:60] for row in rows],
                {
                    "short": [row["short_count"] for row in rows],
                    "all": [row["count"] for row in rows],
                },
            ),
        }
        return [
            Finding(
                rule=self.id,
                severity=self.severity,
                title=f"{pct(share)} of kernel launches are shorter than the launch itself",
                evidence=evidence,
                recommendation=(
                    f"{short} of {total} kernels ran for less time than their launch call while "
                    f"the GPU was busy only {pct(util)} of the steps. "
                    if util is not None
                    else f"{short} of {total} kernels ran for less time than their launch call. "
                )
                + "Give each kernel more work (larger batch), fuse with torch.compile, or "
                "capture the step in a CUDA graph; use fused optimizers.",
                fix=Fix(code=FIX_CODE, config_patch=patch),
                estimated_saving_pct=None,
            )
        ]

    examples: ClassVar = (
        Example(
            "trace: 900 of 1000 launches short, GPU 20% busy",
            True,
            lambda: ex.inputs(
                trace=ex.trace(
                    launches=[
                        {
                            "name": "vectorized_elementwise_kernel",
                            "count": 1000,
                            "kernel_us_mean": 2.0,
                            "launch_us_mean": 6.0,
                            "launch_delay_us_mean": 8.0,
                            "short_count": 900,
                        }
                    ],
                    gpu=ex.gpu_rows(10_000.0),
                )
            ),
        ),
        Example(
            "trace: many short launches but the GPU is 95% busy (launches hidden)",
            False,
            lambda: ex.inputs(
                trace=ex.trace(
                    launches=[
                        {
                            "name": "vectorized_elementwise_kernel",
                            "count": 1000,
                            "kernel_us_mean": 2.0,
                            "launch_us_mean": 6.0,
                            "launch_delay_us_mean": 300.0,
                            "short_count": 900,
                        }
                    ],
                    gpu=ex.gpu_rows(47_500.0),
                )
            ),
        ),
    )
