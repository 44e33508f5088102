"""Kernel name classes: Tensor Core kernels and half-precision (fp16/bf16) kernels.

torch-tb-profiler's list (tensor_core.py, after NVIDIA PyProf) stops at Ampere's 16816 and
cuDNN's xmma names; Hopper kernels (wgmma/hgmma, sm90 CUTLASS 3.x, cuBLAS's nvjet) are
missing from it, so on an H100 it reports "0% Tensor Cores" for a bf16 model. Ours adds them.
Matching is on substrings, case-insensitive, as the plugin does.
"""

from __future__ import annotations

import re

import polars as pl

TENSOR_CORE_PATTERNS: tuple[str, ...] = (
    # torch-tb-profiler / PyProf: Volta (884), Turing (1688), Ampere (16816), cuDNN xmma.
    "h884",
    "s884",
    "i884",
    "h1688",
    "s1688",
    "c1688",
    "i8816",
    "16816",
    "hmma",
    "dgrad_1x1_stride_2x2",
    "first_layer_wgrad_kernel",
    "conv1x1",
    "conv2d_c1_k1",
    "direct_group",
    "xmma_implicit_gemm",
    "xmma_sparse_conv",
    "xmma_warp_specialized_implicit_gemm",
    "xmma_gemm",
    "xmma_sparse_gemm",
    # CUTLASS tensor-op kernels (cutlass_80_tensorop_*, ampere_*_tensorop_*), TF32 GEMMs.
    "tensorop",
    "_tf32",
    "1688gemm",
    "884gemm",
    # Hopper: warp-group MMA, CUTLASS 3.x, cuBLAS nvjet kernels.
    "wgmma",
    "hgmma",
    "gmma_",
    "sm90_",
    "cutlass3x",
    "nvjet",
)
HALF_PRECISION_PATTERNS: tuple[str, ...] = (
    "fp16",
    "half",
    "bf16",
    "bfloat16",
    "f16",
    "hgemm",
    "h884",
    "h1688",
    "h16816",
    "hmma",
    "hgmma",
)


def _regex(patterns: tuple[str, ...]) -> str:
    return "(?i)" + "|".join(re.escape(p) for p in patterns)


TENSOR_CORE = pl.col("name").str.contains(_regex(TENSOR_CORE_PATTERNS))
HALF_PRECISION = pl.col("name").str.contains(_regex(HALF_PRECISION_PATTERNS))


def is_tensor_core(name: str) -> bool:
    return re.search(_regex(TENSOR_CORE_PATTERNS), name) is not None


def is_half_precision(name: str) -> bool:
    return re.search(_regex(HALF_PRECISION_PATTERNS), name) is not None
