"""FLOPs and bytes of the GEMM family and of convolutions (docs/ROOFLINE.md, with sources)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from diagnostics.facts.flop_args import (
    BYTES_PER_ELEMENT,
    SCALAR_TYPE_CODES,
    OpArgs,
    OpCost,
    broadcast,
    moved_bytes,
    per_dim,
    same_inner,
)

# --- GEMM family -------------------------------------------------------------------------


def _gemm(a: OpArgs, *, m: int, n: int, k: int, batch: int = 1, bias: bool, at: int) -> OpCost:
    """2·M·N·K multiply-adds per batch, +M·N for the bias; bytes: A, B, C (+ a 1×N bias)."""
    bpe = a.bpe(at)
    flops = batch * (2 * m * n * k + (m * n if bias else 0))
    moved = moved_bytes((batch * (m * k + k * n + m * n + (n if bias else 0)), bpe))
    shape = f"B={batch} M={m} N={n} K={k}" if batch != 1 else f"M={m} N={n} K={k}"
    return OpCost(
        "gemm",
        flops,
        moved,
        a.dtype(at),
        shape + (" bias" if bias else ""),
        gemm_dims=(batch, m, n, k, bias),
    )


def gemm_backward(forward: OpCost) -> OpCost | None:
    """An autograd GEMM node costed from its forward call (TraceLens GEMM.flops_bwd): the
    input gradient dX = dY·Wᵀ and the weight gradient dW = Xᵀ·dY, 2·M·N·K each, and the
    bias gradient (a sum of dY over rows, M·N). Bytes: each product's two inputs read and
    its output written; dY read once more for the bias."""
    if forward.gemm_dims is None:
        return None
    batch, m, n, k, bias = forward.gemm_dims
    flops = batch * (4 * m * n * k + (m * n if bias else 0))
    elements = batch * (2 * (m * n + k * n + m * k) + ((m * n + n) if bias else 0))
    shape = f"{forward.shape} (backward, from the forward's shapes)"
    bpe = BYTES_PER_ELEMENT.get(forward.dtype or "")
    return OpCost(
        "gemm",
        flops,
        moved_bytes((elements, bpe)),
        forward.dtype,
        shape,
        backward=True,
        gemm_dims=forward.gemm_dims,
    )


def mm(a: OpArgs) -> OpCost:
    (m, k), (k2, n) = a.shape(0), a.shape(1)
    same_inner(k, k2)
    return _gemm(a, m=m, n=n, k=k, bias=False, at=0)


def addmm(a: OpArgs) -> OpCost:
    (m, k), (k2, n) = a.shape(1), a.shape(2)
    same_inner(k, k2)
    return _gemm(a, m=m, n=n, k=k, bias=True, at=1)


def bmm(a: OpArgs) -> OpCost:
    (b, m, k), (_, k2, n) = a.shape(0), a.shape(1)
    same_inner(k, k2)
    return _gemm(a, m=m, n=n, k=k, batch=b, bias=False, at=0)


def baddbmm(a: OpArgs) -> OpCost:
    (b, m, k), (_, k2, n) = a.shape(1), a.shape(2)
    same_inner(k, k2)
    return _gemm(a, m=m, n=n, k=k, batch=b, bias=True, at=1)


def matmul(a: OpArgs) -> OpCost:
    """torch.matmul's broadcasting: 1-D operands gain a unit dimension, leading dims batch."""
    x, w = a.shape(0), a.shape(1)
    if not x or not w:
        raise ValueError("matmul of a scalar")
    x2 = [1, *x] if len(x) == 1 else x
    w2 = [*w, 1] if len(w) == 1 else w
    same_inner(x2[-1], w2[-2])
    lead_x, lead_w = x2[:-2], w2[:-2]
    batch = math.prod(broadcast(lead_x, lead_w))
    if len(lead_w) == 0:  # (…, M, K) @ (K, N) is one GEMM of M·prod(…) rows
        return _gemm(a, m=math.prod(x2[:-1]), n=w2[-1], k=x2[-1], bias=False, at=0)
    return _gemm(a, m=x2[-2], n=w2[-1], k=x2[-1], batch=batch, bias=False, at=0)


def linear(a: OpArgs) -> OpCost:
    x, w = a.shape(0), a.shape(1)
    n, k = w
    same_inner(x[-1], k)
    return _gemm(a, m=math.prod(x[:-1]), n=n, k=k, bias=a.has_tensor(2), at=0)


def scaled_mm(a: OpArgs) -> OpCost:
    """fp8 GEMM: inputs at their own size, the output at out_dtype (argument 6) when given."""
    (m, k), (k2, n) = a.shape(0), a.shape(1)
    same_inner(k, k2)
    out_code = a.value(6)
    out_dtype = SCALAR_TYPE_CODES.get(out_code) if isinstance(out_code, int) else a.dtype(0)
    bias = a.has_tensor(4)
    flops = 2 * m * n * k + (m * n if bias else 0)
    moved = moved_bytes(
        (m * k, a.bpe(0)),
        (k * n, a.bpe(1)),
        (m * n, BYTES_PER_ELEMENT.get(out_dtype or "")),
        (n if bias else 0, a.bpe(4) if bias else 0),
    )
    shape = f"M={m} N={n} K={k}" + (" bias" if bias else "")
    return OpCost("gemm", flops, moved, a.dtype(0), shape, gemm_dims=(1, m, n, k, bias))


# --- convolution -------------------------------------------------------------------------


def _conv_cost(
    a: OpArgs,
    *,
    x: list[int],
    w: list[int],
    bias: bool,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool = False,
    output_padding: Any = 0,
    backward_mask: Sequence[bool] | None = None,
) -> OpCost:
    """Per output element 2·(C_in/groups)·prod(kernel) FLOPs (weight[1:] holds exactly that);
    the output size from the usual floor formula (PyTorch's Conv docs)."""
    spatial = len(x) - 2
    if spatial < 1 or len(w) != len(x):
        raise ValueError("convolution shapes")
    s, p, d = (per_dim(v, spatial) for v in (stride, padding, dilation))
    op = per_dim(output_padding, spatial)
    kernel = w[2:]
    if transposed:
        out_spatial = [
            (x[2 + i] - 1) * s[i] - 2 * p[i] + d[i] * (kernel[i] - 1) + op[i] + 1
            for i in range(spatial)
        ]
        out = [x[0], w[1] * (x[1] // w[0] if w[0] else 1), *out_spatial]
        per_element = 2 * math.prod(w[1:])
        conv = math.prod(x) * per_element
    else:
        out_spatial = [
            (x[2 + i] + 2 * p[i] - d[i] * (kernel[i] - 1) - 1) // s[i] + 1 for i in range(spatial)
        ]
        out = [x[0], w[0], *out_spatial]
        conv = math.prod(out) * 2 * math.prod(w[1:])
    if min(out) <= 0:
        raise ValueError("convolution output is empty")
    bpe = a.bpe(0)
    shape = f"x={x} w={w} stride={s} padding={p} dilation={d}"
    if backward_mask is None:
        flops = conv + (math.prod(out) if bias else 0)
        moved = moved_bytes(
            (math.prod(x) + math.prod(w) + (out[1] if bias else 0) + math.prod(out), bpe)
        )
        return OpCost("conv", flops, moved, a.dtype(0), shape + (" bias" if bias else ""))
    # backward: the input gradient and the weight gradient each cost one forward conv
    grad_input, grad_weight, grad_bias = (list(backward_mask) + [True, True, True])[:3]
    flops = conv * (int(grad_input) + int(grad_weight)) + (math.prod(out) if grad_bias else 0)
    moved = moved_bytes(
        (
            math.prod(out)  # grad_output read
            + math.prod(x)  # input read (for the weight gradient) or written (its gradient)
            + math.prod(w) * (1 + int(grad_weight))  # weight read, its gradient written
            + (math.prod(x) if grad_input and grad_weight else 0)
            + (out[1] if grad_bias else 0),
            bpe,
        )
    )
    return OpCost("conv", flops, moved, a.dtype(0), shape, backward=True)


def convolution(a: OpArgs) -> OpCost:
    # aten::convolution / aten::_convolution(input, weight, bias, stride, padding, dilation,
    # transposed, output_padding, groups, ...)
    return _conv_cost(
        a,
        x=a.shape(0),
        w=a.shape(1),
        bias=a.has_tensor(2),
        stride=a.value(3),
        padding=a.value(4),
        dilation=a.value(5),
        transposed=bool(a.value(6)),
        output_padding=a.value(7) or 0,
    )


def conv_nd(a: OpArgs) -> OpCost:
    # aten::conv1d/2d/3d(input, weight, bias, stride, padding, dilation, groups); padding
    # may be the string "same"/"valid", which this formula does not take
    return _conv_cost(
        a,
        x=a.shape(0),
        w=a.shape(1),
        bias=a.has_tensor(2),
        stride=a.value(3),
        padding=a.value(4),
        dilation=a.value(5),
    )


def convolution_backward(a: OpArgs) -> OpCost:
    # aten::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
    # dilation, transposed, output_padding, groups, output_mask)
    mask = a.value(10)
    return _conv_cost(
        a,
        x=a.shape(1),
        w=a.shape(2),
        bias=False,
        stride=a.value(4),
        padding=a.value(5),
        dilation=a.value(6),
        transposed=bool(a.value(7)),
        output_padding=a.value(8) or 0,
        backward_mask=[bool(v) for v in mask] if isinstance(mask, list) else None,
    )
