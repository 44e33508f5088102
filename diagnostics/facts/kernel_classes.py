"""Kernel name classes: Tensor Core vs CUDA-core GEMMs, and the float format a kernel runs in.

The one place that reads meaning into kernel names (the kernel table, tensor-cores-unused,
unstable-gradients and the Kernels view all use it). Matching is on substrings,
case-insensitive, as torch-tb-profiler's tensor_core.py does; the names below are real
kernels from the traces in ``../shared/traces`` and ``../shared/gpu-runs`` (see
docs/KERNELS.md for the full table).

Tensor Cores, in order of precedence:

1. **CUDA cores, whatever else the name says**: ``ffma`` (fused fp32 multiply-add),
   ``simt`` (CUTLASS's CUDA-core op class), ``sgemm`` (single-precision GEMM on CUDA cores)
   and cuDNN's ``scudnn``. ``sm80_xmma_gemm_f32f32_..._ffma_...`` and
   ``cutlass_80_simt_sgemm_...`` carry ``xmma``/``cutlass`` but run on CUDA cores (the fp32
   H200 run: 86 % of its kernel time).
2. **Tensor Core families**: the MMA instructions (``hmma``, ``wmma``, ``imma``, Hopper's
   ``wgmma``/``hgmma``/``gmma``), the tile shapes of each generation (Volta ``884``, Turing
   ``1688``, Ampere ``16816`` and WMMA ``161616``), CUTLASS's ``tensorop`` op class, cuDNN and
   cuBLAS's ``xmma`` kernels, Hopper's ``sm90`` kernels and cuBLAS's ``nvjet``, and the cuDNN
   names on torch-tb-profiler's list.
3. **A low-precision format in a GEMM/convolution/attention name**: ``bf16``, ``f16``,
   ``tf32``, ``i8`` (e.g. ``sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_...``).

Float format (``precision``): ``bf16`` (``bf16``, ``bfloat16``, ``c10::BFloat16``,
``__nv_bfloat16``, cuBLAS ``nvjet_*_tst_``), ``fp16`` (``fp16``, ``c10::Half``, ``__half``,
``hgemm``, Volta/Turing ``h884``/``h1688``, ``hmma``, cuBLAS ``nvjet_*_hsh_``), ``half`` when
a name says only ``f16``/``half`` (ambiguous: cuDNN's fused attention is named
``..._wgmma_f16_...`` for bf16 inputs too), ``tf32``, ``fp32`` for CUDA-core GEMMs, else null.
A bf16 kernel is never fp16: that is what kept bf16 runs from being told to add a GradScaler.
"""

from __future__ import annotations

import re

import polars as pl

from diagnostics.facts.comm_families import COMM_KERNEL_NAME

# 1. CUDA-core GEMMs and convolutions (checked first: they override the families below).
CUDA_CORE_GEMM_PATTERNS: tuple[str, ...] = ("ffma", "simt", "sgemm", "scudnn")
# 2. Tensor Core families (substrings).
TENSOR_CORE_PATTERNS: tuple[str, ...] = (
    # MMA instructions: Volta/Turing/Ampere hmma/imma, WMMA API, Hopper warp-group MMA.
    "hmma",
    "wmma",
    "imma",
    "gmma",  # wgmma, hgmma, gmma_
    # Tile shapes: Volta 884, Turing 1688, Ampere 16816 and WMMA 161616 (torch-tb-profiler).
    "h884",
    "s884",
    "i884",
    "884gemm",
    "h1688",
    "s1688",
    "c1688",
    "1688gemm",
    "i8816",
    "16816",
    "161616",
    # CUTLASS tensor-op class; cuDNN/cuBLAS xmma kernels; Hopper sm90 kernels; cuBLAS nvjet.
    "tensorop",
    "xmma",
    "sm90_",
    "cutlass3x",
    "nvjet",
    # cuDNN Volta kernels on torch-tb-profiler's list (after NVIDIA PyProf).
    "dgrad_1x1_stride_2x2",
    "first_layer_wgrad_kernel",
    "conv1x1",
    "conv2d_c1_k1",
    "direct_group",
)
# 3. Matrix-multiply kernels, whose low-precision format means Tensor Cores.
# (Narrow on purpose: "mma" alone is in "GammaBeta...", "conv" in "convert_fp32_to_bf16".)
MATMUL_PATTERNS: tuple[str, ...] = (
    "gemm",
    "xmma",
    "cutlass",
    "cublas",
    "nvjet",
    "_mma",
    "convolution",
    "convolve",
    "conv2d",
    "conv3d",
    "fprop",
    "dgrad",
    "wgrad",
    "implicit",
    "winograd",
    "sdpa",
    "fmha",
    "flash_",
)
TENSOR_CORE_FORMAT_PATTERNS: tuple[str, ...] = ("bf16", "f16", "tf32", "i8")

BF16_PATTERNS: tuple[str, ...] = ("bf16", "bfloat16", "nvjet_tst_", "_tst_")
FP16_PATTERNS: tuple[str, ...] = (
    "fp16",
    "c10::half",
    "__half",
    "hgemm",
    "h884",
    "h1688",
    "h16816",
    "hmma",
    "_hsh_",
    "_hss_",
    "_hhh_",
)
# 16-bit, format not named: fp16 unless the trace shows bf16 elsewhere (see the docstring).
HALF_PATTERNS: tuple[str, ...] = ("f16", "half", "hgmma")
# Ampere's CUTLASS fp32-in tensor-op GEMMs run as TF32 (cutlass_80_tensorop_s1688gemm_*).
TF32_PATTERNS: tuple[str, ...] = ("tf32", "tensorop_s1688gemm")


def _regex(patterns: tuple[str, ...]) -> str:
    return "(?i)" + "|".join(re.escape(p) for p in patterns)


_NAME = pl.col("name")
CUDA_CORE_GEMM = _NAME.str.contains(_regex(CUDA_CORE_GEMM_PATTERNS))
MATMUL = _NAME.str.contains(_regex(MATMUL_PATTERNS))
TENSOR_CORE = ~CUDA_CORE_GEMM & (
    _NAME.str.contains(_regex(TENSOR_CORE_PATTERNS))
    | (MATMUL & _NAME.str.contains(_regex(TENSOR_CORE_FORMAT_PATTERNS)))
)
BF16 = _NAME.str.contains(_regex(BF16_PATTERNS))
FP16 = ~BF16 & _NAME.str.contains(_regex(FP16_PATTERNS))
HALF = BF16 | FP16 | _NAME.str.contains(_regex(HALF_PATTERNS))
# Communication kernels of every family (NCCL/RCCL, symmetric memory, DeepEP, ...): the
# one table in facts.comm_families
COMMUNICATION = COMM_KERNEL_NAME
# kept for callers of the earlier name: any 16-bit float kernel, fp16 or bf16
HALF_PRECISION = HALF
PRECISION = (
    pl.when(BF16)
    .then(pl.lit("bf16"))
    .when(FP16)
    .then(pl.lit("fp16"))
    .when(HALF)
    .then(pl.lit("half"))
    .when(_NAME.str.contains(_regex(TF32_PATTERNS)))
    .then(pl.lit("tf32"))
    .when(CUDA_CORE_GEMM)
    .then(pl.lit("fp32"))
    .otherwise(pl.lit(None, pl.String))
)


def classify(names: list[str]) -> pl.DataFrame:
    """name, tensor_core, cuda_core_gemm, precision for each name (the Kernels view's columns)."""
    return pl.DataFrame({"name": names}, schema={"name": pl.String}).with_columns(
        TENSOR_CORE.alias("tensor_core"),
        CUDA_CORE_GEMM.alias("cuda_core_gemm"),
        PRECISION.alias("precision"),
    )


def _one(expr: pl.Expr, name: str) -> bool:
    return bool(pl.DataFrame({"name": [name]}).select(expr).item())


def is_tensor_core(name: str) -> bool:
    return _one(TENSOR_CORE, name)


def is_cuda_core_gemm(name: str) -> bool:
    return _one(CUDA_CORE_GEMM, name)


def is_half_precision(name: str) -> bool:
    """Any 16-bit float kernel (fp16 or bf16)."""
    return _one(HALF, name)


def precision_of(name: str) -> str | None:
    """bf16, fp16, half (16-bit, format not named), tf32, fp32 (CUDA-core GEMM) or None."""
    return pl.DataFrame({"name": [name]}).select(PRECISION).item()
