"""FLOPs and bytes of fused attention, element-wise operators and reductions (docs/ROOFLINE.md)."""

from __future__ import annotations

import math
from collections.abc import Callable

from diagnostics.facts.flop_args import OpArgs, OpCost, broadcast, moved_bytes

# --- attention ---------------------------------------------------------------------------

# name -> (layout of q/k/v, index of is_causal in the arguments, backward, index of q)
# Argument orders from native_functions.yaml (PyTorch 2.x).
ATTENTION_OPS: dict[str, tuple[str, int, bool, int]] = {
    "aten::scaled_dot_product_attention": ("bhnd", 5, False, 0),
    "aten::_scaled_dot_product_flash_attention": ("bhnd", 4, False, 0),
    "aten::_scaled_dot_product_flash_attention_for_cpu": ("bhnd", 4, False, 0),
    "aten::_scaled_dot_product_efficient_attention": ("bhnd", 5, False, 0),
    "aten::_scaled_dot_product_cudnn_attention": ("bhnd", 6, False, 0),
    "aten::_flash_attention_forward": ("bnhd", 8, False, 0),
    "aten::_efficient_attention_forward": ("bnhd", 8, False, 0),
    "aten::_scaled_dot_product_flash_attention_backward": ("bhnd", 11, True, 1),
    "aten::_scaled_dot_product_efficient_attention_backward": ("bhnd", 11, True, 1),
    "aten::_scaled_dot_product_cudnn_attention_backward": ("bhnd", 14, True, 1),
    "aten::_flash_attention_backward": ("bnhd", 10, True, 1),
}


def attention(name: str) -> Callable[[OpArgs], OpCost]:
    layout, causal_at, backward, q_at = ATTENTION_OPS[name]

    def cost(a: OpArgs) -> OpCost:
        q, k, v = a.shape(q_at), a.shape(q_at + 1), a.shape(q_at + 2)
        if len(q) != 4 or len(k) != 4 or len(v) != 4:
            raise ValueError("attention inputs are not 4-D")
        if layout == "bhnd":
            (b, h_q, n_q, d_qk), (_, h_kv, n_kv, _), d_v = q, k, v[3]
        else:
            (b, n_q, h_q, d_qk), (_, n_kv, h_kv, _), d_v = q, k, v[3]
        causal = a.value(causal_at)
        if not isinstance(causal, bool):
            raise ValueError("is_causal not recorded")
        if causal and n_q != n_kv:
            raise ValueError("causal attention with unequal query and key lengths")
        pairs = b * h_q * n_q * n_kv
        if backward:
            # recompute S = QKᵀ, then dV, dP, dQ, dK: five matmuls of the forward's size
            # (softmax terms and the GQA head reduction left out, as small)
            flops = 2 * pairs * (3 * d_qk + 2 * d_v)
            elements = 2 * (b * n_q * h_q * d_qk + b * n_kv * h_kv * (d_qk + d_v))
            elements += b * n_q * h_q * d_v  # dO
        else:
            flops = 2 * pairs * (d_qk + d_v)
            elements = b * n_q * h_q * (d_qk + d_v) + b * n_kv * h_kv * (d_qk + d_v)
        if causal:
            flops //= 2
        shape = f"B={b} Hq={h_q} Hkv={h_kv} Nq={n_q} Nkv={n_kv} d={d_qk}" + (
            " causal" if causal else ""
        )
        return OpCost(
            "attention", flops, moved_bytes((elements, a.bpe(q_at))), a.dtype(q_at), shape, backward
        )

    return cost


# --- element-wise and reductions ---------------------------------------------------------

UNARY_OPS = frozenset(
    "aten::" + n
    for n in [
        "silu",
        "gelu",
        "relu",
        "sigmoid",
        "tanh",
        "exp",
        "log",
        "neg",
        "rsqrt",
        "sqrt",
        "abs",
        "cos",
        "sin",
        "reciprocal",
        "erf",
        "silu_",
        "gelu_",
        "relu_",
        "sigmoid_",
        "tanh_",
        "exp_",
        "neg_",
        "rsqrt_",
        "sqrt_",
        "abs_",
        "clamp",
        "clamp_",
        "clamp_min",
        "clamp_min_",
        "pow",
    ]
)
BINARY_OPS = frozenset(
    "aten::" + n
    for n in [
        "add",
        "sub",
        "mul",
        "div",
        "add_",
        "sub_",
        "mul_",
        "div_",
        "maximum",
        "minimum",
        "gelu_backward",
    ]
)
REDUCTION_OPS = frozenset("aten::" + n for n in ["sum", "mean", "amax", "amin", "max", "min"])


def unary(a: OpArgs) -> OpCost:
    x = a.shape(0)
    n = math.prod(x)
    return OpCost("elementwise", n, moved_bytes((n, a.bpe(0)), (n, a.bpe(0))), a.dtype(0), f"{x}")


def binary(a: OpArgs) -> OpCost:
    """One FLOP per output element; a Scalar operand moves no bytes."""
    x = a.shape(0)
    y = a.dims[1] if len(a.dims) > 1 and isinstance(a.dims[1], list) else []
    out = broadcast(x, y)
    n_out = math.prod(out)
    scalar = not y and a.dtype(1) in (None, "Scalar")
    terms = [(math.prod(x), a.bpe(0)), (n_out, a.bpe(0))]
    if not scalar:
        terms.append((math.prod(y), a.bpe(1)))
    return OpCost("elementwise", n_out, moved_bytes(*terms), a.dtype(0), f"{x} {y}")


def reduction(a: OpArgs) -> OpCost:
    """One FLOP per input element; the output's size from dim/keepdim when recorded."""
    x = a.shape(0)
    n_in = math.prod(x)
    dims = a.value(1)
    if dims is None:
        n_out: int | None = 1
    elif isinstance(dims, int) or (
        isinstance(dims, list) and all(isinstance(d, int) for d in dims)
    ):
        axes = {d % len(x) for d in ([dims] if isinstance(dims, int) else dims)} if x else set()
        n_out = math.prod(s for i, s in enumerate(x) if i not in axes) if axes else 1
    else:
        n_out = None
    moved = moved_bytes((n_in, a.bpe(0)), (n_out, a.bpe(0))) if n_out is not None else None
    return OpCost("reduction", n_in, moved, a.dtype(0), f"{x} dim={dims}")
