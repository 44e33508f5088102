"""Operators and kernels, with host time and the device time they caused.

Device time reaches an operator through linking.py: GPU event -> launching runtime call
(correlation id) -> innermost operator on the same thread containing that call.

- device_us ("self" device time, torch-tb-profiler's device_self_duration): GPU time of the
  events whose launching call sits directly in the operator (not in a child operator).
- device_total_us: GPU time of every event launched by a call anywhere inside the operator,
  children included. Per thread, runtime calls sorted by start carry a running sum of the GPU
  time they launched; an operator's total is that sum at its end minus the sum before its
  start (two as-of joins).
- host_us: the operator's wall time; host_self_us: minus the wall time of its direct child
  operators and of the runtime calls made directly in it (torch-tb-profiler's host self
  duration: the time the operator's own code ran).
"""

from __future__ import annotations

import polars as pl

from diagnostics.facts.kernel_classes import with_kernel_classes
from diagnostics.facts.linking import TraceIndex

OPERATORS_SCHEMA: dict[str, pl.DataType] = {
    "name": pl.String,
    "calls": pl.UInt32,
    "host_us": pl.Float64,
    "host_self_us": pl.Float64,
    "device_us": pl.Float64,
    "device_total_us": pl.Float64,
}
KERNELS_SCHEMA: dict[str, pl.DataType] = {
    "name": pl.String,
    "calls": pl.UInt32,
    "device_us": pl.Float64,
    "mean_us": pl.Float64,
    "min_us": pl.Float64,
    "max_us": pl.Float64,
    "tensor_core": pl.Boolean,
    "fp16": pl.Boolean,  # named fp16 (never bf16): see kernel_classes
    "bf16": pl.Boolean,
    "cuda_core_gemm": pl.Boolean,  # a GEMM/convolution on CUDA cores (ffma, simt, sgemm)
    "precision": pl.String,  # kernel_families.PRECISIONS (half: 16-bit, not named), null
    "family": pl.String,  # kernel_families.FAMILIES id, null: not known
    "unit": pl.String,  # matrix, vector, memory, communication, null: not known
}


def operator_instances(index: TraceIndex) -> pl.DataFrame:
    """One row per operator call: op_id, name, pid, tid, start_us, end_us, host_us,
    host_self_us, device_us, device_total_us."""
    ops = index.ops
    if ops.height == 0:
        return ops.select("op_id", "name", "pid", "tid", "start_us", "end_us").with_columns(
            *(
                pl.lit(0.0).alias(c)
                for c in ("host_us", "host_self_us", "device_us", "device_total_us")
            )
        )
    # op_id is the operator's row: each sum is set at its operator's position, where joins
    # on op_id would copy the operators' columns (names included) four times. One call runs
    # the five queries side by side.
    gpu, runtime, ops_plan = index.gpu.lazy(), index.runtime.lazy(), ops.lazy()
    # Running GPU time launched per thread, by launching-call start: in time order within
    # each thread, all an as-of join by thread needs.
    launched = (
        gpu.filter(pl.col("rt_start_us").is_not_null())
        .group_by("rt_id")
        .agg(
            pl.col("rt_pid").first().alias("pid"),
            pl.col("rt_tid").first().alias("tid"),
            pl.col("rt_start_us").first().alias("_t"),
            pl.col("dur_us").sum().alias("_gpu_us"),
        )
        .sort(["pid", "tid", "_t"])
        .select("pid", "tid", "_t", _cum=pl.col("_gpu_us").cum_sum().over(["pid", "tid"]))
    )
    running_at = {"left_on": "_at", "right_on": "_t", "by": ["pid", "tid"], "strategy": "backward"}
    device_us, children_us, calls_us, at_end, at_start = pl.collect_all(
        [
            gpu.filter(pl.col("op_id").is_not_null()).group_by("op_id").agg(pl.col("dur_us").sum()),
            ops_plan.filter(pl.col("parent_id").is_not_null())
            .group_by("parent_id")
            .agg(pl.col("dur_us").sum()),
            runtime.filter(pl.col("op_id").is_not_null())
            .group_by("op_id")
            .agg(pl.col("dur_us").sum()),
            ops_plan.select("op_id", "pid", "tid", _at="end_us")
            .sort("_at")
            .join_asof(launched, **running_at, check_sortedness=False)
            .select("op_id", "_cum"),
            ops_plan.select("op_id", "pid", "tid", _at="start_us")
            .sort("_at")
            .join_asof(launched, **running_at, allow_exact_matches=False, check_sortedness=False)
            .select("op_id", "_cum"),
        ],
        engine="in-memory",  # the streaming engine's start-up is most of a small trace's cost
    )
    n = ops.height
    return ops.select(
        "op_id",
        "name",
        "pid",
        "tid",
        "start_us",
        "end_us",
        pl.col("dur_us").alias("host_us"),
        (pl.col("dur_us") - _by_position(n, children_us) - _by_position(n, calls_us)).alias(
            "host_self_us"
        ),
        _by_position(n, device_us).alias("device_us"),
        (_by_position(n, at_end) - _by_position(n, at_start)).alias("device_total_us"),
    )


def _by_position(n: int, sums: pl.DataFrame) -> pl.Series:
    """``sums`` (an operator's row number, a value) as a column of ``n`` rows, 0.0 where an
    operator has none."""
    rows, values = sums.get_columns()
    return pl.zeros(n, pl.Float64, eager=True).scatter(rows, values.fill_null(0.0))


def operator_table(index: TraceIndex) -> pl.DataFrame:
    """name, calls, host_us, host_self_us, device_us, device_total_us; by device_us, desc."""
    calls = operator_instances(index)
    if calls.height == 0:
        return pl.DataFrame(schema=OPERATORS_SCHEMA)
    return (
        calls.group_by("name")
        .agg(
            pl.len().alias("calls"),
            pl.col("host_us").sum(),
            pl.col("host_self_us").sum(),
            pl.col("device_us").sum(),
            pl.col("device_total_us").sum(),
        )
        .cast(OPERATORS_SCHEMA)
        .sort(["device_us", "host_us", "name"], descending=[True, True, False])
    )


def kernel_table(index: TraceIndex) -> pl.DataFrame:
    """name, calls, device_us, mean_us, min_us, max_us, tensor_core, fp16, bf16,
    cuda_core_gemm, precision, family, unit over every kernel in the trace; by device_us."""
    kernels = index.gpu.filter(pl.col("cat") == "kernel")
    if kernels.height == 0:
        return pl.DataFrame(schema=KERNELS_SCHEMA)
    table = kernels.group_by("name").agg(
        pl.len().alias("calls"),
        pl.col("dur_us").sum().alias("device_us"),
        pl.col("dur_us").mean().alias("mean_us"),
        pl.col("dur_us").min().alias("min_us"),
        pl.col("dur_us").max().alias("max_us"),
    )
    return (
        with_kernel_classes(table)
        .with_columns(
            (pl.col("precision") == "fp16").fill_null(False).alias("fp16"),
            (pl.col("precision") == "bf16").fill_null(False).alias("bf16"),
        )
        .select(list(KERNELS_SCHEMA))
        .cast(KERNELS_SCHEMA)
        .sort(["device_us", "name"], descending=[True, False])
    )


OP_DTYPES_SCHEMA: dict[str, pl.DataType] = {"dtype": pl.String, "ops": pl.UInt32}


def half_dtype_ops(events: pl.DataFrame) -> pl.DataFrame:
    """dtype ("c10::Half" | "c10::BFloat16"), ops: how many CPU operator calls had an input
    of that 16-bit float dtype (recorded with record_shapes; empty without)."""
    if "half_dtypes" not in events.columns:
        return pl.DataFrame(schema=OP_DTYPES_SCHEMA)
    return (
        events.filter((pl.col("cat") == "cpu_op") & pl.col("half_dtypes").is_not_null())
        .select(pl.col("half_dtypes").str.split(",").alias("dtype"))
        .explode("dtype")
        .group_by("dtype")
        .agg(pl.len().alias("ops"))
        .cast(OP_DTYPES_SCHEMA)
        .sort("dtype")
    )


def top(frame: pl.DataFrame, by: str, n: int = 10) -> pl.DataFrame:
    """The ``n`` rows with the largest ``by`` (e.g. top(facts.operators, "host_us"))."""
    return frame.sort([by, "name"], descending=[True, False]).head(n)
