"""Benchmark: matmuls with a misaligned dimension against the same matmul padded, on CPU.

The misshapen-matmul rule's premise on a GPU is NVIDIA's Tensor Core alignment (a multiple
of 8 elements in fp16/bf16; 64 recommended, hence GPT-2's 50,257 padded to 50,304). This
measures what the same shapes cost on this machine's CPU BLAS (PyTorch's oneDNN/MKL), in
one run, each pair alternated round by round so both see the same drift in the host's load:

- the LM head's forward, x[M, 768] @ W[768, V], and its input gradient, dY[M, V] @ W[V, 768],
  for V = 50,257 against 50,304;
- a feed-forward width, N = 3,071 against 3,072;
- a 10-class head, N = 10 against 16.

Times are medians over ``--rounds`` rounds (the first, a warm-up, dropped); the rate is
the pair's own FLOPs (2·M·N·K) over its time, so padding's extra FLOPs count against it.
A GPU is not measured here (none on this host): the rule measures GPU rates from the trace
itself.

    .venv/bin/python bench/bench_misshapen_matmul.py
    .venv/bin/python bench/bench_misshapen_matmul.py --tokens 512 --rounds 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

HIDDEN = 768


def _pairs(tokens: int) -> list[tuple[str, tuple[int, int, int], tuple[int, int, int]]]:
    """(label, misaligned (M, K, N), aligned (M, K, N))."""
    return [
        ("LM head forward, N = vocabulary", (tokens, HIDDEN, 50_257), (tokens, HIDDEN, 50_304)),
        ("LM head dX, K = vocabulary", (tokens, 50_257, HIDDEN), (tokens, 50_304, HIDDEN)),
        ("feed-forward, N = width", (tokens, HIDDEN, 3_071), (tokens, HIDDEN, 3_072)),
        ("10-class head, N = classes", (tokens, HIDDEN, 10), (tokens, HIDDEN, 16)),
    ]


def _operands(shape: tuple[int, int, int], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    m, k, n = shape
    generator = torch.Generator().manual_seed(0)
    return (
        torch.randn(m, k, generator=generator).to(dtype),
        torch.randn(k, n, generator=generator).to(dtype),
    )


def _time(a: torch.Tensor, b: torch.Tensor, repeats: int) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    return (time.perf_counter() - started) / repeats


def _repeats(shape: tuple[int, int, int]) -> int:
    m, k, n = shape
    # small matmuls repeated until a round takes a measurable time (>= ~20 MFLOP a round)
    return max(1, int(2e9 // (2 * m * k * n)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="M: tokens in the batch")
    parser.add_argument("--rounds", type=int, default=6, help="rounds, the first a warm-up")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    args = parser.parse_args(argv)
    dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} CPUs, load average {load:.1f}; M = {args.tokens} tokens, "
        f"{args.rounds - 1} measured rounds (median)\n"
    )
    header = (
        "| matmul | dtype | misaligned (M, K, N) | ms | GFLOP/s | aligned (M, K, N) | ms | "
        "GFLOP/s | aligned ÷ misaligned rate |"
    )
    print(header)
    print("|---|---|---|---:|---:|---|---:|---:|---:|")
    for dtype in dtypes:
        for label, bad, good in _pairs(args.tokens):
            operands = {bad: _operands(bad, dtype), good: _operands(good, dtype)}
            repeats = {shape: _repeats(shape) for shape in (bad, good)}
            times: dict[tuple[int, int, int], list[float]] = {bad: [], good: []}
            for round_index in range(args.rounds):
                order = (bad, good) if round_index % 2 == 0 else (good, bad)
                for shape in order:
                    took = _time(*operands[shape], repeats[shape])
                    if round_index > 0:
                        times[shape].append(took)
            median = {shape: statistics.median(t) for shape, t in times.items()}
            rate = {s: 2 * s[0] * s[1] * s[2] / median[s] / 1e9 for s in (bad, good)}
            print(
                f"| {label} | {str(dtype).removeprefix('torch.')} | {bad} | "
                f"{median[bad] * 1e3:.3f} | {rate[bad]:.1f} | {good} | {median[good] * 1e3:.3f} | "
                f"{rate[good]:.1f} | {rate[good] / rate[bad]:.3f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
