"""Precision facts: fp16 *training* on the dense path told apart from fp16 *data*.

GradScaler exists for one case: the dense layers' GEMMs and convolutions run in fp16 and so
does their backward, so small gradients flowing back through them underflow fp16's range.
A trace shows that case in either of two ways:

- operators recorded with shapes (``record_shapes``): a GEMM or convolution op (``aten::mm``,
  ``aten::addmm``, ``aten::convolution``, ...) with a ``c10::Half`` input inside a backward
  range, or a dense autograd node (``AddmmBackward0``, ``ConvolutionBackward0``, ...) or
  backward op (``aten::convolution_backward``) with a ``c10::Half`` input;
- kernels only: a GEMM/convolution kernel named fp16 (``kernel_classes.PRECISION``) whose
  launching runtime call lies inside a backward range on the host.

A backward range is an autograd engine call (``autograd::engine::evaluate_function: ...``) or
an autograd node (``...Backward0``, PyTorch 1.x's ``...Backward``), merged per thread.

What does not count, however much fp16 it holds:

- FBGEMM's fp16 embedding tables (TorchRec): ``split_embedding_*``/``batched_embedding_*``
  kernels and the ``fbgemm::`` ops launching them. Their optimiser (row-wise Adagrad) runs
  inside the backward kernel on fp32 gradients and fp32 state, so nothing reaches
  GradScaler: the fp16 is storage. On HTA's TorchRec trace (``tests/data/trace_filter/
  sampled_rank-0.json.gz``, rank 0 of 128) every fp16 kernel is one of these, while the
  dense layers run TF32 (``cutlass_80_tensorop_s1688gemm_*``) and fp32 (``ampere_sgemm_*``).
- quantised weights or activations (fp8/int8 casts and FBGEMM's quantise kernels);
- fp16 communication buffers: NCCL kernels with ``_f16``/``half`` in their names;
- fp16 GEMMs in the forward only (inference or a frozen fp16 part): no backward to underflow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from diagnostics.facts.intervals import merge_intervals
from diagnostics.facts.kernel_classes import COMMUNICATION, with_kernel_classes
from diagnostics.facts.linking import TraceIndex
from diagnostics.facts.selectors import CPU_OP, DURATION, select_where

# the ops torch.amp.GradScaler runs each step (unscale_ + update); the kernels carry the names
SCALER_MARKERS = (
    "_amp_foreach_non_finite_check_and_unscale",
    "_amp_non_finite_check_and_unscale",
    "_amp_update_scale",
)
# GEMM and convolution operators of the dense path (forward; inside a backward range they
# are the backward's GEMMs)
DENSE_OPS: frozenset[str] = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::addbmm",
        "aten::matmul",
        "aten::linear",
        "aten::convolution",
        "aten::_convolution",
        "aten::conv1d",
        "aten::conv2d",
        "aten::conv3d",
        "aten::conv_transpose1d",
        "aten::conv_transpose2d",
        "aten::conv_transpose3d",
        "aten::cudnn_convolution",
        "aten::cudnn_convolution_transpose",
        "aten::miopen_convolution",
    }
)
# their backward: autograd nodes and aten backward ops (cuDNN's, MIOpen's, the generic one)
DENSE_BACKWARD = re.compile(
    r"^(Mm|Addmm|Bmm|Baddbmm|Addbmm|Linear|Convolution|CudnnConvolution|"
    r"CudnnConvolutionTranspose|MiopenConvolution|ConvolutionBackwardOverrideable)"
    r"Backward\d*$"
    r"|^aten::(cudnn_|miopen_)?convolution(_transpose)?_backward"
)
BACKWARD_RANGE = re.compile(r"^autograd::engine::evaluate_function: |Backward\d*$")
# FBGEMM (TorchRec's embedding tables, its quantise and permute kernels) and PyTorch's own
# embedding backward: data movement and lookups, never the dense GEMM path ("fbgemm" would
# otherwise match MATMUL's "gemm")
EMBEDDING_KERNEL = pl.col("name").str.contains(
    r"(?i)fbgemm|split_embedding|batched_embedding|embedding"
)


@dataclass(frozen=True)
class PrecisionFacts:
    """Counts over one rank's trace (see the module docstring for what each one takes)."""

    # GEMM/convolution op calls with a c10::Half input outside any backward range
    fp16_dense_forward_ops: int
    # dense backward nodes/ops with a c10::Half input, and dense ops with one inside backward
    fp16_dense_backward_ops: int
    # fp16 GEMM/convolution kernels launched from inside a backward range, and their time
    fp16_dense_backward_kernels: int
    fp16_dense_backward_kernel_us: float
    # fp16 GEMM/convolution kernels anywhere (largest first, at most five): the chart's bars
    top_fp16_dense_kernels: tuple[str, ...]
    top_fp16_dense_kernel_us: tuple[float, ...]
    # fp16 that is data, not training, reported so a reader sees what was set aside
    fp16_embedding_kernels: int  # FBGEMM / embedding kernels named fp16
    fp16_embedding_kernel_us: float
    fp16_comm_kernels: int  # NCCL kernels named f16/half
    bf16_seen: bool  # a kernel or an op input in bf16
    backward_ranges: int  # backward ranges found on the host (0: the trace shows none)
    scaler_ops: int  # calls (operators or kernels) of GradScaler's ops

    @property
    def fp16_dense_training(self) -> bool:
        """fp16 GEMMs/convolutions with their backward on the dense path."""
        return self.fp16_dense_backward_ops > 0 or self.fp16_dense_backward_kernels > 0


def _backward_ranges(ops: pl.DataFrame) -> pl.DataFrame:
    """pid, tid, start_us, end_us: the union of backward ranges per host thread."""
    backward = ops.filter(pl.col("name").str.contains(BACKWARD_RANGE.pattern))
    return merge_intervals(backward.select("pid", "tid", "start_us", "end_us"), by=["pid", "tid"])


def _inside(points: pl.DataFrame, ranges: pl.DataFrame, start: str, end: str) -> pl.Series:
    """For each row of ``points`` (pid, tid, ``start``, ``end``): does one of the merged
    ``ranges`` on its thread contain it? Merged ranges are disjoint, so the latest one
    starting at or before the point is the only candidate."""
    if points.height == 0:
        return pl.Series("inside", [], dtype=pl.Boolean)
    if ranges.height == 0:
        return pl.Series("inside", [False] * points.height)
    keyed = points.with_row_index("_row").select("_row", "pid", "tid", start, end)
    found = (
        keyed.sort(start)
        .join_asof(
            ranges.rename({"start_us": "_r_start", "end_us": "_r_end"}).sort("_r_start"),
            left_on=start,
            right_on="_r_start",
            by=["pid", "tid"],
            strategy="backward",
            check_sortedness=False,
        )
        .with_columns(inside=(pl.col("_r_end") >= pl.col(end)).fill_null(False))
        .sort("_row")
    )
    return found["inside"]


def _host_ops(events: pl.DataFrame) -> pl.DataFrame:
    return select_where(
        events,
        CPU_OP & DURATION & pl.col("dur").is_not_null(),
        "name",
        "pid",
        "tid",
        pl.col("ts").alias("start_us"),
        (pl.col("ts") + pl.col("dur")).alias("end_us"),
        pl.col("half_dtypes").fill_null(""),
    )


def _classified_kernels(kernels: pl.DataFrame) -> pl.DataFrame:
    """The kernels with their name's precision and classes (``_matmul``, ``_comm``,
    ``_embedding``). The classes are regexes over the name: evaluated once per distinct
    name and joined back, since a trace repeats a few dozen names over millions of rows."""
    names = with_kernel_classes(kernels.select("name").unique()).select(
        "name",
        "precision",
        pl.col("matmul").fill_null(False).alias("_matmul"),
        COMMUNICATION.fill_null(False).alias("_comm"),
        EMBEDDING_KERNEL.fill_null(False).alias("_embedding"),
    )
    return kernels.join(names, on="name", how="left", nulls_equal=True)


def precision_facts(events: pl.DataFrame, index: TraceIndex) -> PrecisionFacts:
    ops = _host_ops(events)
    backward = _backward_ranges(ops)
    ops = ops.with_columns(_inside(ops, backward, "start_us", "end_us").alias("in_backward"))
    half = pl.col("half_dtypes").str.contains("c10::Half", literal=True)
    dense = pl.col("name").is_in(sorted(DENSE_OPS))
    dense_backward = pl.col("name").str.contains(DENSE_BACKWARD.pattern)
    fp16_forward = ops.filter(half & dense & ~pl.col("in_backward")).height
    fp16_backward = ops.filter(half & (dense_backward | (dense & pl.col("in_backward")))).height

    kernels = _classified_kernels(index.gpu.filter(pl.col("cat") == "kernel"))
    bf16_seen = bool((kernels["precision"] == "bf16").any()) or bool(
        ops["half_dtypes"].str.contains("c10::BFloat16", literal=True).any()
    )
    fp16_named = pl.col("precision") == "fp16"
    # "f16"/"half" only: fp16 unless the trace shows bf16 (cuDNN names bf16 attention
    # ..._f16_...)
    half_named = pl.col("precision") == "half"
    fp16_kernel = fp16_named | (half_named & pl.lit(not bf16_seen))
    fp16_dense = kernels.filter(
        fp16_kernel & pl.col("_matmul") & ~pl.col("_comm") & ~pl.col("_embedding")
    ).with_columns(pl.col("rt_start_us").alias("_t0"), pl.col("rt_end_us").alias("_t1"))
    launched = fp16_dense.filter(pl.col("rt_start_us").is_not_null()).rename(
        {"rt_pid": "pid", "rt_tid": "tid"}, strict=False
    )
    in_backward = launched.filter(
        _inside(launched.select("pid", "tid", "_t0", "_t1"), backward, "_t0", "_t1")
    )
    top = (
        fp16_dense.group_by("name")
        .agg(pl.col("dur_us").sum())
        .sort(["dur_us", "name"], descending=[True, False])
        .head(5)
    )
    embedding = kernels.filter((fp16_named | half_named) & pl.col("_embedding"))
    comm = kernels.filter((fp16_named | half_named) & pl.col("_comm"))
    scaler = pl.col("name").str.contains("|".join(SCALER_MARKERS))
    return PrecisionFacts(
        fp16_dense_forward_ops=fp16_forward,
        fp16_dense_backward_ops=fp16_backward,
        fp16_dense_backward_kernels=in_backward.height,
        fp16_dense_backward_kernel_us=float(in_backward["dur_us"].sum()),
        top_fp16_dense_kernels=tuple(top["name"].to_list()),
        top_fp16_dense_kernel_us=tuple(float(v) for v in top["dur_us"].to_list()),
        fp16_embedding_kernels=embedding.height,
        fp16_embedding_kernel_us=float(embedding["dur_us"].sum()),
        fp16_comm_kernels=comm.height,
        bf16_seen=bf16_seen,
        backward_ranges=backward.height,
        scaler_ops=ops.filter(scaler).height + kernels.filter(scaler).height,
    )
