"""What the FLOP model reads off one operator call: its recorded shapes, dtypes and argument
values (``Input Dims``, ``Input type``, ``Concrete Inputs``), and the cost it returns.

Argument strings are read with ``ast.literal_eval``, never ``eval``: a trace is untrusted
input. The formulas are in flop_gemm_conv.py and flop_attention_elementwise.py; the dispatch
by operator name and the polars entry point in flops.py; docs/ROOFLINE.md writes them down.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BYTES_PER_ELEMENT: dict[str, int] = {
    "double": 8,
    "float": 4,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
}
# The precision of the arithmetic an input dtype implies, as the peak table names it.
PRECISION_OF_DTYPE: dict[str, str] = {
    "double": "fp64",
    "float": "fp32",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
}
# c10::ScalarType codes, as _scaled_mm's out_dtype appears in Concrete Inputs.
SCALAR_TYPE_CODES: dict[int, str] = {5: "c10::Half", 6: "float", 15: "c10::BFloat16"}

# Kinds of work: matrix ones run on Tensor/Matrix Cores, vector ones on the SIMD lanes.
MATRIX_KINDS = frozenset({"gemm", "conv", "attention"})


@dataclass(frozen=True)
class OpCost:
    kind: str  # "gemm" | "conv" | "attention" | "elementwise" | "reduction"
    flops: int
    bytes: int | None  # None: a dtype's size is unknown
    dtype: str | None  # the first tensor input's dtype as Kineto wrote it
    shape: str  # the formula's parameters, e.g. "M=8944 N=2816 K=1024"
    backward: bool = False
    # GEMMs: (batch, M, N, K, bias), what a backward node costed from this call needs
    gemm_dims: tuple[int, int, int, int, bool] | None = None

    @property
    def precision(self) -> str | None:
        return PRECISION_OF_DTYPE.get(self.dtype or "")


class OpArgs:
    """One operator's recorded arguments, read defensively: a wrong shape raises ValueError."""

    def __init__(self, dims: list[Any], types: list[Any], concrete: list[Any]) -> None:
        self.dims = dims
        self.types = types
        self.concrete = concrete

    def shape(self, i: int) -> list[int]:
        if i >= len(self.dims) or not isinstance(self.dims[i], list):
            raise ValueError(f"no shape at input {i}")
        shape = self.dims[i]
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"input {i} is not a tensor shape")
        return shape

    def dtype(self, i: int) -> str | None:
        return self.types[i] if i < len(self.types) and isinstance(self.types[i], str) else None

    def bpe(self, i: int) -> int | None:
        return BYTES_PER_ELEMENT.get(self.dtype(i) or "")

    def value(self, i: int) -> Any:
        """A Concrete Inputs entry as a Python value ("" and unreadable text: None)."""
        if i >= len(self.concrete) or not isinstance(self.concrete[i], str):
            return None
        text = self.concrete[i].strip()
        if not text:
            return None
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None

    def has_tensor(self, i: int) -> bool:
        return i < len(self.dims) and isinstance(self.dims[i], list) and bool(self.dims[i])


def moved_bytes(*terms: tuple[int, int | None]) -> int | None:
    """Sum of elements x bytes per element; None when any size is unknown."""
    total = 0
    for elements, bpe in terms:
        if bpe is None:
            return None
        total += elements * bpe
    return total


def same_inner(a: int, b: int) -> None:
    """Raises when a matrix product's inner dimensions differ (the shapes are not what the
    formula takes)."""
    if a != b:
        raise ValueError(f"inner dimensions differ: {a} and {b}")


def per_dim(value: Any, n: int) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value] * n
    if isinstance(value, list | tuple) and all(isinstance(v, int) for v in value):
        return list(value) * n if len(value) == 1 else list(value)
    raise ValueError(f"not a per-dimension argument: {value!r}")


def broadcast(x: Sequence[int], y: Sequence[int]) -> list[int]:
    n = max(len(x), len(y))
    x2 = [1] * (n - len(x)) + list(x)
    y2 = [1] * (n - len(y)) + list(y)
    out = []
    for p, q in zip(x2, y2, strict=True):
        if p != q and p != 1 and q != 1:
            raise ValueError(f"shapes do not broadcast: {x} and {y}")
        out.append(max(p, q))
    return out
