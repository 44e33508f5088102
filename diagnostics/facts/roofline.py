"""Roofline figures per operator and per kernel: achieved TFLOP/s and TB/s, arithmetic
intensity, % of the device's peak, compute- or memory-bound.

An operator's GPU time is the union of the intervals of every GPU event (kernels, copies,
memsets) launched from inside it, its child operators included (linking.py ties each event
to the innermost operator around its launching call; the ancestors are walked here). Its
FLOPs and bytes come from facts.flops.

Nested models: aten::linear holds aten::addmm, aten::matmul holds aten::mm, both modelled.
Each keeps its own figures, but ``counted`` is true only for the innermost modelled call,
so that a sum over counted calls counts each piece of arithmetic once.

Bound: an operator whose arithmetic intensity (FLOPs per byte) is below the device's ridge
point (peak FLOP/s over peak bytes/s) is memory-bound, else compute-bound. Matrix work
(GEMM, convolution, attention) is held against the matrix peak of its dtype, vector work
(element-wise, reductions) against the fp32 vector peak. Without a known device peak the
percentages and the bound are null.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import polars as pl

from diagnostics.facts.flops import MATRIX_KINDS, operator_costs
from diagnostics.facts.intervals import merge_intervals
from diagnostics.facts.linking import TraceIndex
from diagnostics.facts.peaks import DevicePeak

# rows of the signature and kernel tables the result JSON carries (the largest by GPU time)
SUMMARY_ROWS = 20
# elements per 16 bytes: NVIDIA's Tensor Core alignment ("Matrix Multiplication Background
# User's Guide", Tensor Core Requirements: multiples of 8 for FP16, 16 for INT8/FP8)
TENSOR_CORE_ALIGNMENT: dict[str, int] = {"bf16": 8, "fp16": 8, "fp8": 16}

OP_ROOFLINE_SCHEMA: dict[str, pl.DataType] = {
    "op_id": pl.UInt32,
    "name": pl.String,
    "start_us": pl.Float64,  # the call's host range: which step it belongs to
    "end_us": pl.Float64,
    "kind": pl.String,
    "shape": pl.String,
    "dtype": pl.String,
    "precision": pl.String,
    "backward": pl.Boolean,
    "counted": pl.Boolean,  # innermost modelled call: sums over these count FLOPs once
    "gemm_batch": pl.Int64,  # GEMMs: the dimensions the formula read (null for others)
    "gemm_m": pl.Int64,
    "gemm_n": pl.Int64,
    "gemm_k": pl.Int64,
    "flops": pl.Int64,
    "bytes": pl.Int64,
    "gpu_us": pl.Float64,  # union of its GPU events' intervals; null: none linked
    "tflops_per_s": pl.Float64,
    "tb_per_s": pl.Float64,
    "flops_per_byte": pl.Float64,
    "peak_tflops": pl.Float64,
    "pct_of_peak_flops": pl.Float64,
    "pct_of_peak_bandwidth": pl.Float64,
    "bound": pl.String,  # "compute" | "memory" | null (no peak or no bytes)
}
SIGNATURE_SCHEMA: dict[str, pl.DataType] = {
    "name": pl.String,
    "kind": pl.String,
    "shape": pl.String,
    "dtype": pl.String,
    "calls": pl.UInt32,
    "gflops": pl.Float64,  # per call
    "mbytes": pl.Float64,  # per call, MiB (2^20 bytes), as TraceLens writes "Data Moved (MB)"
    "gpu_us": pl.Float64,  # all calls
    "tflops_per_s": pl.Float64,  # all FLOPs over all GPU time
    "tflops_per_s_median": pl.Float64,  # median over calls
    "tb_per_s": pl.Float64,
    "flops_per_byte": pl.Float64,
    "pct_of_peak_flops": pl.Float64,
    "pct_of_peak_bandwidth": pl.Float64,
    "bound": pl.String,
}
KERNEL_ROOFLINE_SCHEMA: dict[str, pl.DataType] = {
    "name": pl.String,
    "flops": pl.Float64,
    "bytes": pl.Float64,
    "device_us": pl.Float64,
    "tflops_per_s": pl.Float64,
    "tb_per_s": pl.Float64,
    "flops_per_byte": pl.Float64,
    "pct_of_peak_flops": pl.Float64,
    "pct_of_peak_bandwidth": pl.Float64,
    "bound": pl.String,
}


def _ancestors(ops: pl.DataFrame) -> pl.DataFrame:
    """op_id -> anc_id for the op itself and every operator enclosing it."""
    parents = ops.select("op_id", "parent_id").filter(pl.col("parent_id").is_not_null())
    pairs = [ops.select("op_id", pl.col("op_id").alias("anc_id"))]
    frontier = parents.rename({"parent_id": "anc_id"})
    while frontier.height:
        pairs.append(frontier)
        frontier = frontier.join(parents, left_on="anc_id", right_on="op_id", how="inner").select(
            "op_id", pl.col("parent_id").alias("anc_id")
        )
    return pl.concat(pairs)


def _peak_columns(frame: pl.DataFrame, peak: DevicePeak | None) -> pl.DataFrame:
    """Adds peak_tflops, the two percentages and the bound from tflops_per_s, tb_per_s,
    flops_per_byte, kind and precision."""
    if peak is None:
        return frame.with_columns(
            pl.lit(None, pl.Float64).alias(c)
            for c in ("peak_tflops", "pct_of_peak_flops", "pct_of_peak_bandwidth")
        ).with_columns(pl.lit(None, pl.String).alias("bound"))
    matrix = {p: peak.tflops(p) for p in ("bf16", "fp16", "tf32", "fp32", "fp8")}
    matrix_peak = pl.col("precision").replace_strict(matrix, default=None, return_dtype=pl.Float64)
    vector_peak = pl.lit(peak.fp32_tflops, pl.Float64)
    frame = frame.with_columns(
        pl.when(pl.col("kind").is_in(list(MATRIX_KINDS)))
        .then(matrix_peak)
        .otherwise(vector_peak)
        .alias("peak_tflops")
    )
    ridge = pl.col("peak_tflops") / peak.hbm_tbps  # FLOPs per byte where the roofs meet
    return frame.with_columns(
        (100 * pl.col("tflops_per_s") / pl.col("peak_tflops")).alias("pct_of_peak_flops"),
        (100 * pl.col("tb_per_s") / peak.hbm_tbps).alias("pct_of_peak_bandwidth"),
        pl.when(pl.col("flops_per_byte").is_null() | pl.col("peak_tflops").is_null())
        .then(pl.lit(None, pl.String))
        .when(pl.col("flops_per_byte") < ridge)
        .then(pl.lit("memory"))
        .otherwise(pl.lit("compute"))
        .alias("bound"),
    )


def _rates(flops: pl.Expr, moved: pl.Expr, us: pl.Expr) -> list[pl.Expr]:
    seconds = pl.when(us > 0).then(us / 1e6)
    return [
        (flops / seconds / 1e12).alias("tflops_per_s"),
        (moved / seconds / 1e12).alias("tb_per_s"),
        pl.when(moved > 0).then(flops / moved).alias("flops_per_byte"),
    ]


def operator_roofline(index: TraceIndex, peak: DevicePeak | None) -> pl.DataFrame:
    """One row per modelled operator call (OP_ROOFLINE_SCHEMA), by op_id."""
    costs = operator_costs(index.ops)
    if costs.height == 0:
        return pl.DataFrame(schema=OP_ROOFLINE_SCHEMA)
    ancestors = _ancestors(index.ops)
    modelled = costs.select("op_id")
    # a modelled call with a modelled call inside it is not the innermost
    outer = (
        ancestors.filter(pl.col("op_id") != pl.col("anc_id"))
        .join(modelled, on="op_id", how="semi")
        .select(pl.col("anc_id").alias("op_id"))
        .unique()
    )
    events = (
        index.gpu.filter(pl.col("op_id").is_not_null())
        .select("op_id", "device", "start_us", "end_us")
        .join(ancestors, on="op_id", how="inner")
        .join(modelled.rename({"op_id": "anc_id"}), on="anc_id", how="semi")
        .select(pl.col("anc_id").alias("op_id"), "start_us", "end_us")
    )
    busy = (
        merge_intervals(events, by=["op_id"])
        .group_by("op_id")
        .agg((pl.col("end_us") - pl.col("start_us")).sum().alias("gpu_us"))
    )
    frame = (
        costs.join(index.ops.select("op_id", "name", "start_us", "end_us"), on="op_id", how="left")
        .join(busy, on="op_id", how="left")
        .with_columns(
            (~pl.col("op_id").is_in(outer["op_id"].implode())).alias("counted"),
        )
        .with_columns(_rates(pl.col("flops"), pl.col("bytes"), pl.col("gpu_us")))
    )
    return _peak_columns(frame, peak).select(list(OP_ROOFLINE_SCHEMA)).cast(OP_ROOFLINE_SCHEMA)


def signature_roofline(calls: pl.DataFrame, peak: DevicePeak | None) -> pl.DataFrame:
    """Calls of one operator with one shape and dtype grouped (SIGNATURE_SCHEMA), as
    TraceLens's GEMM.csv groups them; by GPU time, descending."""
    timed = calls.filter(pl.col("gpu_us").is_not_null())
    if timed.height == 0:
        return pl.DataFrame(schema=SIGNATURE_SCHEMA)
    grouped = (
        timed.group_by("name", "kind", "shape", "dtype", "precision")
        .agg(
            pl.len().alias("calls"),
            (pl.col("flops").first() / 1e9).alias("gflops"),
            (pl.col("bytes").first() / 2**20).alias("mbytes"),
            pl.col("gpu_us").sum(),
            pl.col("flops").sum().alias("_flops"),
            pl.col("bytes").sum().alias("_bytes"),
            pl.col("tflops_per_s").median().alias("tflops_per_s_median"),
        )
        .with_columns(_rates(pl.col("_flops"), pl.col("_bytes"), pl.col("gpu_us")))
    )
    return (
        _peak_columns(grouped, peak)
        .select(list(SIGNATURE_SCHEMA))
        .cast(SIGNATURE_SCHEMA)
        .sort(["gpu_us", "name", "shape"], descending=[True, False, False])
    )


def kernel_roofline(
    index: TraceIndex, calls: pl.DataFrame, peak: DevicePeak | None
) -> pl.DataFrame:
    """Per kernel name: the FLOPs and bytes of the counted operator calls that launched it,
    each call's share split over its GPU events by duration (KERNEL_ROOFLINE_SCHEMA)."""
    counted = calls.filter(pl.col("counted") & pl.col("gpu_us").is_not_null())
    if counted.height == 0:
        return pl.DataFrame(schema=KERNEL_ROOFLINE_SCHEMA)
    ancestors = _ancestors(index.ops)
    launched = (
        index.gpu.filter(pl.col("op_id").is_not_null() & (pl.col("cat") == "kernel"))
        .select("op_id", "name", "dur_us")
        .join(ancestors, on="op_id", how="inner")
        .join(
            counted.select(pl.col("op_id").alias("anc_id"), "flops", "bytes", "kind", "precision"),
            on="anc_id",
            how="inner",
        )
        .with_columns(_share=pl.col("dur_us") / pl.col("dur_us").sum().over("anc_id"))
    )
    grouped = (
        launched.group_by("name")
        .agg(
            (pl.col("flops") * pl.col("_share")).sum().alias("flops"),
            (pl.col("bytes") * pl.col("_share")).sum().alias("bytes"),
            pl.col("dur_us").sum().alias("device_us"),
            pl.col("kind").mode().first(),
            pl.col("precision").mode().first(),
        )
        .with_columns(_rates(pl.col("flops"), pl.col("bytes"), pl.col("device_us")))
    )
    return (
        _peak_columns(grouped, peak)
        .select(list(KERNEL_ROOFLINE_SCHEMA))
        .cast(KERNEL_ROOFLINE_SCHEMA)
        .sort(["device_us", "name"], descending=[True, False])
    )


@dataclass(frozen=True)
class RooflineFacts:
    """The roofline of one trace: per operator call, per signature, per kernel."""

    calls: pl.DataFrame  # OP_ROOFLINE_SCHEMA, one row per modelled operator call
    signatures: pl.DataFrame  # SIGNATURE_SCHEMA, over the counted (innermost) calls
    kernels: pl.DataFrame  # KERNEL_ROOFLINE_SCHEMA
    peak: DevicePeak | None  # None: device unknown, no percentage

    @property
    def counted_flops(self) -> int:
        """FLOPs of the innermost modelled calls: each piece of arithmetic once."""
        return int(self.calls.filter(pl.col("counted"))["flops"].sum())

    def to_summary(self, top: int = SUMMARY_ROWS) -> dict[str, Any]:
        counted = self.calls.filter(pl.col("counted"))
        timed = counted.filter(pl.col("gpu_us").is_not_null())
        return {
            "device_peak": asdict(self.peak) if self.peak is not None else None,
            "modelled_calls": self.calls.height,
            "counted_gflops": self.counted_flops / 1e9,
            "counted_gpu_us": float(timed["gpu_us"].sum()) if timed.height else None,
            "matrix_gflops": float(
                counted.filter(pl.col("kind").is_in(list(MATRIX_KINDS)))["flops"].sum() / 1e9
            ),
            "signatures": _finite_rows(self.signatures.head(top)),
            "kernels": _finite_rows(self.kernels.head(top)),
        }


def timed_gemm_calls(calls: pl.DataFrame) -> pl.DataFrame:
    """The counted GEMM calls (OP_ROOFLINE_SCHEMA) with GPU time and all three dimensions:
    what the GEMM shape rules compare."""
    return calls.filter(
        pl.col("counted")
        & (pl.col("kind") == "gemm")
        & (pl.col("gpu_us") > 0)
        & pl.col("gemm_m").is_not_null()
        & pl.col("gemm_n").is_not_null()
        & pl.col("gemm_k").is_not_null()
    )


def misaligned_dims(precision: str | None, m: int, n: int, k: int) -> list[str]:
    """``["N=50257", ...]``: the dimensions off the precision's Tensor Core alignment; none
    for a precision without one (fp32: TF32 or not is not in the shapes)."""
    align = TENSOR_CORE_ALIGNMENT.get(precision or "")
    if not align:
        return []
    return [f"{name}={size}" for name, size in (("M", m), ("N", n), ("K", k)) if size % align]


def roofline_facts(index: TraceIndex, peak: DevicePeak | None) -> RooflineFacts | None:
    """None when no operator call has a model (a trace recorded without shapes)."""
    calls = operator_roofline(index, peak)
    if calls.height == 0:
        return None
    return RooflineFacts(
        calls=calls,
        signatures=signature_roofline(calls.filter(pl.col("counted")), peak),
        kernels=kernel_roofline(index, calls, peak),
        peak=peak,
    )


def _finite_rows(frame: pl.DataFrame) -> list[dict[str, Any]]:
    return [
        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        for row in frame.to_dicts()
    ]


VIEW_ROOFLINE_SCHEMA: dict[str, pl.DataType] = {
    "gflops": pl.Float64,  # all calls of the row
    "tflops_per_s": pl.Float64,
    "tb_per_s": pl.Float64,
    "flops_per_byte": pl.Float64,
    "pct_of_peak_flops": pl.Float64,
    "bound": pl.String,
}


def grouped_roofline(calls: pl.DataFrame, keys: list[str], peak: DevicePeak | None) -> pl.DataFrame:
    """``keys`` + VIEW_ROOFLINE_SCHEMA over the timed calls of each group (the Operators
    view's rows): all FLOPs over all GPU time; the kind and precision most calls have."""
    timed = calls.filter(pl.col("gpu_us").is_not_null())
    if timed.height == 0:
        return pl.DataFrame(schema={**calls.select(keys).schema, **VIEW_ROOFLINE_SCHEMA})
    grouped = (
        timed.group_by(keys)
        .agg(
            pl.col("flops").sum().alias("_flops"),
            pl.col("bytes").sum().alias("_bytes"),
            pl.col("bytes").null_count().alias("_no_bytes"),
            pl.col("gpu_us").sum(),
            pl.col("kind").mode().first(),
            pl.col("precision").mode().first(),
        )
        .with_columns(
            (pl.col("_flops") / 1e9).alias("gflops"),
            # a group with a call of unknown bytes has no byte figure rather than a low one
            pl.when(pl.col("_no_bytes") == 0).then(pl.col("_bytes")).alias("_bytes"),
        )
        .with_columns(_rates(pl.col("_flops"), pl.col("_bytes"), pl.col("gpu_us")))
    )
    return (
        _peak_columns(grouped, peak).select(*keys, *VIEW_ROOFLINE_SCHEMA).cast(VIEW_ROOFLINE_SCHEMA)  # type: ignore[arg-type]
    )
