"""The training loop bench_profile_overhead.py measures, run plain, under
``pipeline-doctor profile`` and under TraceML (``BENCH_TRACEML=1``: TraceML needs
``traceml.init()`` and ``trace_step`` in a plain loop; its zero-code mode sees only HF
Trainer and Lightning).

    python bench/overhead_workload.py tiny|realistic STEPS

``tiny``: a Linear(8, 1) on 4 samples, ~0.1-0.4 ms a CPU step, so the per-step cost of the
hooks is most of what changes. ``realistic``: an MLP sized for ~50 ms a step on one core.
Prints one JSON line: the median and mean step time after 10 warm-up steps, and the
median of the training thread's CPU time a step.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

WARMUP = 10


def build(kind: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    if kind == "tiny":
        return torch.nn.Linear(8, 1), torch.randn(4, 8), torch.randn(4, 1)
    width = int(os.environ.get("BENCH_WIDTH", "1024"))
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
    )
    return (
        model,
        torch.randn(int(os.environ.get("BENCH_BATCH", "1024")), width),
        torch.randn(int(os.environ.get("BENCH_BATCH", "1024")), 1),
    )


def main() -> None:
    kind, steps = sys.argv[1], int(sys.argv[2])
    model, x, y = build(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    traced = os.environ.get("BENCH_TRACEML") == "1"
    if traced:
        import traceml_ai as traceml

        traceml.init()
    times, cpu_times = [], []
    for _ in range(steps):
        began, cpu_began = time.perf_counter(), time.thread_time()
        if traced:
            with traceml.trace_step(model):
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
        else:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        times.append(time.perf_counter() - began)
        cpu_times.append(time.thread_time() - cpu_began)
    steady = times[WARMUP:] or times
    steady_cpu = cpu_times[WARMUP:] or cpu_times
    print(
        "BENCH "
        + json.dumps(
            {
                "median_ms": statistics.median(steady) * 1e3,
                "mean_ms": statistics.fmean(steady) * 1e3,
                # the training thread's CPU time: what other work on a shared host moves least
                "cpu_median_ms": statistics.median(steady_cpu) * 1e3,
                "steps": steps,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
