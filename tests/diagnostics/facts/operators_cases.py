"""Hand-made traces of operators, calls and kernels, shared by the linking's tests."""

from __future__ import annotations

import polars as pl

from tests.diagnostics.facts.trace_fixture import events_of, gpu, op, runtime, step


def nested_trace() -> pl.DataFrame:
    return events_of(
        step(1, 0, 1000),
        op("aten::linear", 0, 100),
        op("aten::t", 2, 8),  # child of linear, no GPU work
        op("aten::addmm", 10, 80),  # child of linear
        runtime("cudaLaunchKernel", 20, 10, corr=1),  # directly in addmm
        runtime("cudaLaunchKernel", 40, 10, corr=2),
        runtime("cudaLaunchKernel", 95, 3, corr=3),  # in linear, after addmm ended
        gpu("ampere_sgemm_128x64_tn", 100, 300, corr=1),
        gpu("void splitKreduce_kernel", 400, 20, corr=2),
        gpu("void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>>", 420, 7, corr=3),
        # Same-thread sibling with a zero-length op inside (cannot contain anything).
        op("aten::relu", 200, 50),
        op("aten::empty", 210, 0),
        runtime("cudaLaunchKernel", 220, 5, corr=4),
        gpu("void at::native::vectorized_elementwise_kernel<4, ReluFunctor<float>>", 430, 5, 4),
        # Another thread: a backward op whose launch must not link to thread 1's ops.
        op("AddmmBackward0", 20, 60, tid=2),
        runtime("cudaLaunchKernel", 30, 4, corr=5, tid=2),
        gpu("ampere_sgemm_64x64_nn", 440, 100, corr=5),
    )


def tie_break_trace() -> pl.DataFrame:
    """Operators that end and start together, start together, repeat a range, and nest on
    two threads whose rows interleave."""
    return events_of(
        op("outer", 0, 10),
        op("same_as_outer", 0, 10),
        op("next_to_outer", 10, 10),
        op("short", 30, 10),  # written first, opened second
        op("long", 30, 20),
        op("in_short", 35, 5),
        op("other_thread", 0, 50, tid=2),
        op("nested_there", 10, 10, tid=2),
        op("empty", 45, 0),  # zero length: inside long, contains nothing
    )
