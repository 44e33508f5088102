"""FLOPs and bytes per CPU operator, from the shapes the trace recorded (record_shapes=True).

Every formula, with its source and where it departs from TraceLens's perf model (the anchor),
is in docs/ROOFLINE.md. The figures are the work the operator's arithmetic needs and the
bytes it must at least read and write once (its inputs and its output), not what a kernel
really moved: a cache-blocked GEMM reads its inputs several times, a fused kernel fewer.

The trace gives each operator ``Input Dims`` (shapes), ``Input type`` (dtypes) and
``Concrete Inputs`` (scalar and list arguments as text: ``"[2, 2]"``, ``"True"``). Argument
strings are read with ``ast.literal_eval``, never ``eval``. An operator whose arguments do
not fit its formula (a missing shape, an unknown dtype size) gets no cost, or no bytes:
a figure that the trace cannot support is left unknown.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import polars as pl

from diagnostics.facts.flop_args import MATRIX_KINDS, OpArgs, OpCost
from diagnostics.facts.flop_attention_elementwise import (
    ATTENTION_OPS,
    BINARY_OPS,
    REDUCTION_OPS,
    UNARY_OPS,
    attention,
    binary,
    reduction,
    unary,
)
from diagnostics.facts.flop_gemm_conv import (
    addmm,
    baddbmm,
    bmm,
    conv_nd,
    convolution,
    convolution_backward,
    gemm_backward,
    linear,
    matmul,
    mm,
    scaled_mm,
)

__all__ = ["MATRIX_KINDS", "MODELS", "OpCost", "op_cost", "operator_costs"]

MODELS: dict[str, Callable[[OpArgs], OpCost]] = {
    "aten::mm": mm,
    "aten::addmm": addmm,
    "aten::bmm": bmm,
    "aten::baddbmm": baddbmm,
    "aten::matmul": matmul,
    "aten::linear": linear,
    "aten::_scaled_mm": scaled_mm,
    "aten::convolution": convolution,
    "aten::_convolution": convolution,
    "aten::conv1d": conv_nd,
    "aten::conv2d": conv_nd,
    "aten::conv3d": conv_nd,
    "aten::convolution_backward": convolution_backward,
    **{name: attention(name) for name in ATTENTION_OPS},
    **dict.fromkeys(UNARY_OPS, unary),
    **dict.fromkeys(BINARY_OPS, binary),
    **dict.fromkeys(REDUCTION_OPS, reduction),
}


def op_cost(
    name: str, dims: list[Any] | None, types: list[Any] | None, concrete: list[Any] | None
) -> OpCost | None:
    """The cost of one operator call from its recorded arguments; None when it has no model
    or its arguments do not fit one."""
    model = MODELS.get(name)
    if model is None or not isinstance(dims, list):
        return None
    try:
        return model(OpArgs(dims, types or [], concrete or []))
    except (ValueError, TypeError, IndexError, ZeroDivisionError):
        return None


COSTS_SCHEMA: dict[str, pl.DataType] = {
    "op_id": pl.UInt32,
    "kind": pl.String,
    "flops": pl.Int64,
    "bytes": pl.Int64,
    "dtype": pl.String,
    "precision": pl.String,
    "shape": pl.String,
    "backward": pl.Boolean,
    # GEMMs (forward and backward nodes): batch, M, N, K as the formula read them; null else
    "gemm_batch": pl.Int64,
    "gemm_m": pl.Int64,
    "gemm_n": pl.Int64,
    "gemm_k": pl.Int64,
}


def operator_costs(ops: pl.DataFrame) -> pl.DataFrame:
    """One row per modelled operator call (COSTS_SCHEMA) of TraceIndex.ops (op_id, name,
    input_shapes, input_types, concrete_inputs, sequence_number, depth). Each distinct
    argument set is costed once. Autograd GEMM nodes (``MmBackward0``) are costed from
    their forward call, linked by sequence number (gemm_backward)."""
    needed = {"input_shapes", "input_types", "concrete_inputs"}
    if ops.height == 0 or not needed <= set(ops.columns):
        return pl.DataFrame(schema=COSTS_SCHEMA)
    keys = ["name", "input_shapes", "input_types", "concrete_inputs"]
    candidates = ops.filter(
        pl.col("name").is_in(list(MODELS)) & pl.col("input_shapes").is_not_null()
    ).with_columns(pl.col(keys).cast(pl.String))
    found: list[OpCost] = []
    key_rows = []
    for name, dims, types, concrete in candidates.select(keys).unique().iter_rows():
        cost = op_cost(name, _json(dims), _json(types), _json(concrete))
        if cost is not None:
            key_rows.append((name, dims, types, concrete, len(found)))
            found.append(cost)
    if not found:
        return pl.DataFrame(schema=COSTS_SCHEMA)
    index_of = pl.DataFrame(
        key_rows, schema={**dict.fromkeys(keys, pl.String), "_cost": pl.Int64}, orient="row"
    )
    costed = candidates.join(index_of, on=keys, how="inner", nulls_equal=True)
    pairs = list(zip(costed["op_id"].to_list(), costed["_cost"].to_list(), strict=True))
    pairs.extend(_backward_nodes(ops, costed, found))
    return pl.DataFrame(
        [(op_id, *_fields(found[i])) for op_id, i in pairs],
        schema=COSTS_SCHEMA,
        orient="row",
    ).sort("op_id")


# The autograd node each GEMM creates. The name must match: an operator records the
# sequence number current when it starts, so a composite one (aten::linear under autocast)
# carries the number of the first node made inside it (ToCopyBackward0, its input's cast).
GEMM_NODES: dict[str, str] = {
    "aten::mm": "MmBackward",
    "aten::addmm": "AddmmBackward",
    "aten::bmm": "BmmBackward",
    "aten::baddbmm": "BaddbmmBackward",
}


def _backward_nodes(
    ops: pl.DataFrame, costed: pl.DataFrame, found: list[OpCost]
) -> list[tuple[int, int]]:
    """(op_id, index into ``found``) of the autograd GEMM nodes (``AddmmBackward0``) whose
    forward call (aten::addmm with the same sequence number) has a cost, appending their
    backward costs to ``found``. A node is costed whether or not its children are: roofline.py
    counts only the innermost modelled call, so the node counts only when its aten::mm
    children recorded no shapes."""
    if "sequence_number" not in ops.columns:
        return []
    forwards = (
        costed.filter(
            pl.col("sequence_number").is_not_null() & pl.col("name").is_in(list(GEMM_NODES))
        )
        .select(
            "sequence_number",
            "_cost",
            pl.col("name").replace_strict(GEMM_NODES, return_dtype=pl.String).alias("_node"),
        )
        # one forward call per (number, node): a number shared otherwise is not a link
        .unique(subset=["sequence_number", "_node"], keep="none")
    )
    nodes = (
        ops.filter(pl.col("sequence_number").is_not_null())
        .with_columns(_node=pl.col("name").str.replace(r"\d+$", ""))
        .join(forwards, on=["sequence_number", "_node"], how="inner")
    )
    backward_of: dict[int, int] = {}
    out = []
    for op_id, forward in nodes.select("op_id", "_cost").iter_rows():
        if forward not in backward_of:
            cost = gemm_backward(found[forward])
            if cost is None:
                continue
            backward_of[forward] = len(found)
            found.append(cost)
        out.append((op_id, backward_of[forward]))
    return out


def _fields(cost: OpCost) -> tuple:
    dims = cost.gemm_dims[:4] if cost.gemm_dims is not None else (None, None, None, None)
    return (
        cost.kind,
        cost.flops,
        cost.bytes,
        cost.dtype,
        cost.precision,
        cost.shape,
        cost.backward,
        *dims,
    )


def _json(text: str | None) -> list[Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, list) else None
