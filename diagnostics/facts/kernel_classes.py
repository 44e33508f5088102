"""Kernel name classes: the unit a kernel runs on and the number format it runs in.

The one place that reads meaning into kernel names (the kernel table, tensor-cores-unused,
unstable-gradients, the coverage figures and the Kernels view all use it). The knowledge is
data: the ordered table of kernel families in ``facts/kernel_families.py`` (vendor, unit,
precision, a real example each); this module turns it into polars expressions. Matching is
case-insensitive, as torch-tb-profiler's tensor_core.py does (docs/KERNELS.md lists every
family with its real kernel name).

Tensor Cores / Matrix Cores (``TENSOR_CORE``) are the families of unit ``matrix``; in order of
precedence:

1. **CUDA cores, whatever else the name says**: ``ffma`` (fused fp32 multiply-add),
   ``simt`` (CUTLASS's CUDA-core op class), ``sgemm`` (single-precision GEMM on CUDA cores)
   and cuDNN's ``scudnn``. ``sm80_xmma_gemm_f32f32_..._ffma_...`` and
   ``cutlass_80_simt_sgemm_...`` carry ``xmma``/``cutlass`` but run on CUDA cores (the fp32
   H200 run: 86 % of its kernel time).
2. **Named matrix families**: the MMA instructions (``hmma``, ``wmma``, ``imma``, Hopper's
   ``wgmma``/``hgmma``/``gmma``, Blackwell's ``tcgen05``), the tile shapes of each generation
   (Volta ``884``, Turing ``1688``, Ampere ``16816`` and WMMA ``161616``), CUTLASS's
   ``tensorop``, cuDNN and cuBLAS's ``xmma``, Hopper's ``sm90`` kernels and cuBLAS's
   ``nvjet``, FlashAttention, Blackwell's ``bmm_Mx...``/``fmhaSm100...``; on AMD hipBLASLt's
   Tensile ``Cijk_..._MI..`` kernels, Composable Kernel's xdlops, MIOpen's ``igemm_..._gtcx``
   and AOTriton's ``attn_fwd``.
3. **A low-precision format in a GEMM/convolution/attention name**: ``bf16``, ``f16``,
   ``tf32``, ``i8`` (e.g. ``cutlass_tensorop_..._tf32_...``).

Float format (``PRECISION``): the family's own format or the one its name encodes (Tensile's
type letters, ``QkvE4m3``, ``MxE2m1``), else the name-wide patterns below (``NAME_PRECISION``):
``bf16`` (``bf16``, ``bfloat16``, ``c10::BFloat16``, ``__nv_bfloat16``, cuBLAS
``nvjet_*_tst_``), ``fp16`` (``fp16``, ``c10::Half``, ``__half``, ``hgemm``, Volta/Turing
``h884``/``h1688``, ``hmma``, cuBLAS ``nvjet_*_hsh_``), ``half`` when a name says only
``f16``/``half`` (ambiguous: cuDNN's fused attention is named ``..._wgmma_f16_...`` for bf16
inputs too), ``tf32``, ``fp32`` for CUDA-core GEMMs, else null.
A bf16 kernel is never fp16: that is what kept bf16 runs from being told to add a GradScaler.
"""

from __future__ import annotations

import re

import polars as pl

from diagnostics.facts.comm_families import COMM_KERNEL_NAME
from diagnostics.facts.kernel_families import FAMILIES, FAMILY_BY_ID, KernelFamily

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
# Matrix-multiply and convolution kernel names, whatever unit runs them (the fp16-training
# facts ask "a GEMM in fp16?"). Narrow on purpose: "mma" alone is in "GammaBeta...", "conv"
# in "convert_fp32_to_bf16".
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


def _regex(patterns: tuple[str, ...]) -> str:
    return "(?i)" + "|".join(re.escape(p) for p in patterns)


_NAME = pl.col("name")
# The families whose GEMMs and convolutions run on CUDA cores (rule 1 of the docstring).
CUDA_CORE_GEMM_FAMILIES: tuple[str, ...] = ("cublas-ffma", "cutlass-simt", "sgemm", "cudnn-scudnn")


def _family_hit(family: KernelFamily) -> pl.Expr:
    hit = _NAME.str.contains("(?i)" + family.match)
    if family.also is not None:
        hit = hit & _NAME.str.contains("(?i)" + family.also)
    return hit


def _first_family() -> pl.Expr:
    chain = pl.when(_family_hit(FAMILIES[0])).then(pl.lit(FAMILIES[0].id))
    for family in FAMILIES[1:]:
        chain = chain.when(_family_hit(family)).then(pl.lit(family.id))
    return chain.otherwise(pl.lit(None, pl.String))


# Every class below is built from a family expression: FAMILY itself for one-off use, or
# the column with_kernel_classes wrote. A class written over FAMILY repeats its 27-family
# regex chain wherever it names it (PRECISION did 11 times: 9.5 ms for 49 names against
# 1.4 ms for FAMILY alone); over the column, the chain runs once.
def _by_family(family: pl.Expr, values: dict[str, str | None]) -> pl.Expr:
    """One value per family id (null for an unknown family)."""
    return family.replace_strict(values, default=None, return_dtype=pl.String)


def _unit(family: pl.Expr) -> pl.Expr:
    return _by_family(family, {f.id: f.unit for f in FAMILIES})


def _vendor(family: pl.Expr) -> pl.Expr:
    return _by_family(family, {f.id: f.vendor for f in FAMILIES})


def _cuda_core_gemm(family: pl.Expr) -> pl.Expr:
    return family.is_in(list(CUDA_CORE_GEMM_FAMILIES)).fill_null(False)


def _tensor_core(family: pl.Expr) -> pl.Expr:
    return (_unit(family) == "matrix").fill_null(False)


def _matmul(family: pl.Expr) -> pl.Expr:
    """A GEMM or convolution: on matrix units, on CUDA cores, or named as one."""
    return (
        _tensor_core(family) | _cuda_core_gemm(family) | _NAME.str.contains(_regex(MATMUL_PATTERNS))
    )


BF16 = _NAME.str.contains(_regex(BF16_PATTERNS))
FP16 = ~BF16 & _NAME.str.contains(_regex(FP16_PATTERNS))
HALF = BF16 | FP16 | _NAME.str.contains(_regex(HALF_PATTERNS))


def _name_precision(family: pl.Expr) -> pl.Expr:
    """The format the name itself says, family aside (rule "float format" of the docstring)."""
    return (
        pl.when(BF16)
        .then(pl.lit("bf16"))
        .when(FP16)
        .then(pl.lit("fp16"))
        .when(HALF)
        .then(pl.lit("half"))
        .when(_NAME.str.contains(_regex(TF32_PATTERNS)))
        .then(pl.lit("tf32"))
        .when(_cuda_core_gemm(family))
        .then(pl.lit("fp32"))
        .otherwise(pl.lit(None, pl.String))
    )


def _decoded_precision(family: pl.Expr) -> pl.Expr:
    """The format a family's name encodes (Tensile type letters, QkvE4m3, ...), else null."""
    decoded = pl.lit(None, pl.String)
    for known in FAMILIES:
        if known.precision_token is None:
            continue
        token = _NAME.str.extract("(?i)" + known.precision_token, 1)
        value = token.replace_strict(known.token_precision, default=None, return_dtype=pl.String)
        decoded = pl.when(family.eq(known.id)).then(value).otherwise(decoded)
    return decoded


def _precision(family: pl.Expr) -> pl.Expr:
    return pl.coalesce(
        _by_family(family, {f.id: f.precision for f in FAMILIES if f.precision is not None}),
        _decoded_precision(family),
        _name_precision(family),
    )


# The kernel's family id (kernel_families.FAMILIES, first match wins); null: not known.
FAMILY = _first_family()
UNIT = _unit(FAMILY)
VENDOR = _vendor(FAMILY)
CUDA_CORE_GEMM = _cuda_core_gemm(FAMILY)
TENSOR_CORE = _tensor_core(FAMILY)
# Kept for callers that want "on Tensor Cores or Matrix Cores" in the vendor's own words.
MATRIX_CORE = TENSOR_CORE
MATMUL = _matmul(FAMILY)
# Communication kernels of every family (NCCL/RCCL, symmetric memory, DeepEP, ...): the
# one table in facts.comm_families
COMMUNICATION = COMM_KERNEL_NAME
# kept for callers of the earlier name: any 16-bit float kernel, fp16 or bf16
HALF_PRECISION = HALF
NAME_PRECISION = _name_precision(FAMILY)
PRECISION = _precision(FAMILY)

# The columns with_kernel_classes adds, in order.
KERNEL_CLASS_COLUMNS = (
    "family",
    "vendor",
    "unit",
    "tensor_core",
    "cuda_core_gemm",
    "matmul",
    "precision",
)


def with_kernel_classes(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` (a ``name`` column, best one row per distinct name) with the columns of
    :data:`KERNEL_CLASS_COLUMNS`: the family found once, every other class read off it."""
    family = pl.col("family")
    return frame.with_columns(FAMILY.alias("family")).with_columns(
        _vendor(family).alias("vendor"),
        _unit(family).alias("unit"),
        _tensor_core(family).alias("tensor_core"),
        _cuda_core_gemm(family).alias("cuda_core_gemm"),
        _matmul(family).alias("matmul"),
        _precision(family).alias("precision"),
    )


def classify(names: list[str]) -> pl.DataFrame:
    """name, family, vendor, unit, tensor_core, cuda_core_gemm, precision for each name."""
    frame = pl.DataFrame({"name": names}, schema={"name": pl.String})
    return with_kernel_classes(frame).select(
        "name", "family", "vendor", "unit", "tensor_core", "cuda_core_gemm", "precision"
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
    """One of kernel_families.PRECISIONS (half: 16-bit, format not named) or None."""
    return pl.DataFrame({"name": [name]}).select(PRECISION).item()


def family_of(name: str) -> KernelFamily | None:
    """The kernel's family (kernel_families.FAMILIES, first match wins), or None."""
    family_id = pl.DataFrame({"name": [name]}).select(FAMILY).item()
    return FAMILY_BY_ID.get(family_id) if family_id is not None else None
