"""slow-matmul-shape: GEMMs that took longer than a GEMM of more work on the same GPU.

What it finds
    In a GPU trace recorded with shapes, the counted GEMM signatures (operator, M, N, K,
    precision: the roofline's innermost GEMM calls, docs/ROOFLINE.md) whose median call took
    at least ``slow_matmul_min_slowdown_x`` times as long as the fastest signature of the
    same precision and batch that did at least as many FLOPs *and* moved at least as many
    bytes a call. That GEMM is the measurement: the same device, in the same trace, did at
    least this call's work in that time, so no model of the hardware is needed. The usual
    case is one orientation of a layer's GEMMs: the weight gradient ``dW = Xᵀ·dY`` of a
    layer with few rows (M = 64) and a long reduction (K = 4,096) beside its data gradient,
    the same FLOPs in another shape. Left out: signatures with a dimension off their
    precision's Tensor Core alignment (misshapen-matmul's), and any GEMM with no larger
    one to compare against (the largest GEMMs are never judged). Reported: each slow
    signature with the GEMM that outpaced it, their median call times, their share of GEMM
    time, and the saving those measured times give (each slow call at the faster GEMM's
    time), as a share of GEMM time and of the profiled steps' time; reported when the
    saving is at least ``slow_matmul_min_saving_pct`` of GEMM time and, where the steps'
    time is known, ``slow_matmul_min_step_saving_pct`` of it.

Why it matters
    cuBLAS, cuBLASLt, hipBLASLt and CUTLASS pick a kernel for each shape from heuristics.
    A GEMM whose output is small beside its reduction (few output tiles for the GPU's SMs,
    each with a long loop over K) is where the pick most often misses: unless a split-K
    kernel shares the reduction, most SMs wait. Roofline percentages do not show it
    (small GEMMs are far below the roofline for other reasons: a launch's fixed cost); a
    larger GEMM that ran faster does.

How to fix
    Let ``torch.compile(mode="max-autotune")`` benchmark kernels for these shapes (its
    candidates include split-K and decomposed-K GEMMs), or try the other BLAS library for
    them (``torch.backends.cuda.preferred_blas_library("cublaslt")``: hipBLASLt on ROCm),
    and keep whichever is faster in this trace. Where the small dimension is the batch (M =
    rows a step), a larger micro-batch gives the GEMM more output to share out. The
    evidence names each operator and shape and the GEMM that outpaced it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import polars as pl

from diagnostics.facts.peaks import PEAKS
from diagnostics.facts.roofline import (
    OP_ROOFLINE_SCHEMA,
    RooflineFacts,
    misaligned_dims,
    timed_gemm_calls,
)
from diagnostics.model import AnalysisInputs
from diagnostics.percent import pct
from diagnostics.rules import examples as ex
from diagnostics.rules.base import Example, Finding, Fix, Need, Rule, Severity, need_cuda_trace
from diagnostics.rules.device_advice import device_advice
from diagnostics.rules.evidence import chart, cuda_trace, r, step_range
from diagnostics.thresholds import Thresholds

SHOWN = 10  # slow shapes listed in the evidence

FIX_CODE = """\
# before: {operator} {shape} ({precision}) took {slow_us:,.1f} us a call, where
# {peer_operator} {peer_shape} did at least its FLOPs and bytes in {peer_us:,.1f} us
model = build_model()

# after: let the compiler time GEMM kernels for these shapes (split-K among them)
model = torch.compile(build_model(), mode="max-autotune")
# or try the other BLAS library for them ({blas_name}); keep whichever the next trace
# shows faster
torch.backends.cuda.preferred_blas_library("cublaslt")
# where the small dimension is the batch's rows, a larger micro-batch gives the GEMM more
# output tiles to share among the SMs
"""


def _gemm_signatures(roofline: RooflineFacts) -> pl.DataFrame:
    """Counted GEMM calls with GPU time and dimensions, grouped by operator, shape,
    precision and batch: calls, FLOPs and bytes a call, total and median GPU time."""
    calls = timed_gemm_calls(roofline.calls).filter(
        pl.col("flops").is_not_null()
        & pl.col("bytes").is_not_null()
        & pl.col("precision").is_not_null()
    )
    return (
        calls.group_by("name", "shape", "precision", "gemm_batch", "gemm_m", "gemm_n", "gemm_k")
        .agg(
            pl.len().alias("calls"),
            pl.col("flops").max().alias("flops_per_call"),
            pl.col("bytes").max().alias("bytes_per_call"),
            pl.col("gpu_us").sum().alias("gpu_us"),
            pl.col("gpu_us").median().alias("median_us"),
        )
        .with_columns(pl.col("gemm_batch").fill_null(1))
        .sort(["gpu_us", "name", "shape"], descending=[True, False, False])
    )


def _misaligned(row: dict[str, Any]) -> bool:
    """Off its precision's Tensor Core alignment: misshapen-matmul's, not this rule's."""
    return bool(misaligned_dims(row["precision"], row["gemm_m"], row["gemm_n"], row["gemm_k"]))


def _outpaced(signatures: pl.DataFrame, min_slowdown: float) -> list[dict[str, Any]]:
    """Each signature (not misaligned) with the fastest signature of its precision and batch
    that did at least its FLOPs and bytes a call, where its median call took at least
    ``min_slowdown`` times as long."""
    if signatures.height < 2:
        return []
    indexed = signatures.with_row_index("row")
    peers = indexed.select(
        "precision",
        "gemm_batch",
        pl.col("row").alias("peer_row"),
        pl.col("flops_per_call").alias("peer_flops"),
        pl.col("bytes_per_call").alias("peer_bytes"),
        pl.col("median_us").alias("peer_median_us"),
    )
    # one row per GEMM shape, so the pairs within a precision and batch are few; a polars
    # join rather than numpy keeps numpy's import out of the analysis
    fastest = (
        indexed.select("row", "precision", "gemm_batch", "flops_per_call", "bytes_per_call")
        .join(peers, on=["precision", "gemm_batch"])
        .filter(
            (pl.col("peer_row") != pl.col("row"))
            & (pl.col("peer_flops") >= pl.col("flops_per_call"))
            & (pl.col("peer_bytes") >= pl.col("bytes_per_call"))
        )
        .sort("peer_median_us", "peer_row")
        .group_by("row", maintain_order=True)
        .agg(pl.col("peer_row").first())
    )
    rows = signatures.to_dicts()
    found = []
    for index, peer in fastest.sort("row").iter_rows():
        row = rows[index]
        if _misaligned(row):
            continue
        if row["median_us"] >= min_slowdown * rows[peer]["median_us"]:
            found.append({**row, "peer": rows[peer]})
    return found


def _has_gemm_signatures(inputs: AnalysisInputs) -> bool:
    trace = cuda_trace(inputs)
    return bool(
        trace is not None
        and trace.roofline is not None
        and _gemm_signatures(trace.roofline).height >= 2
    )


class SlowMatmulShape(Rule):
    id = "slow-matmul-shape"
    title = "Matmuls took longer than larger matmuls on the same GPU"
    severity = Severity.MEDIUM
    needs = (
        need_cuda_trace("GEMM shapes and their GPU time come from a GPU trace"),
        Need(
            "two or more GEMM shapes with recorded dimensions and GPU time (record_shapes=True)",
            _has_gemm_signatures,
            "fewer than two GEMM shapes with recorded dimensions and GPU time: the trace was "
            "recorded without record_shapes, or ran one matmul shape",
        ),
    )
    threshold_names = (
        "slow_matmul_min_slowdown_x",
        "slow_matmul_min_saving_pct",
        "slow_matmul_min_step_saving_pct",
    )

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        trace = cuda_trace(inputs)
        assert trace is not None and trace.roofline is not None
        signatures = _gemm_signatures(trace.roofline)
        gemm_us = float(signatures["gpu_us"].sum())
        if gemm_us <= 0:
            return []
        slowdown = max(thresholds.slow_matmul_min_slowdown_x, 1.0)
        slow = _outpaced(signatures, slowdown)
        for row in slow:
            row["saving_us"] = max(row["gpu_us"] - row["calls"] * row["peer"]["median_us"], 0.0)
        saving_us = sum(row["saving_us"] for row in slow)
        saving_of_gemm = 100.0 * saving_us / gemm_us
        if not slow or saving_of_gemm < thresholds.slow_matmul_min_saving_pct:
            return []
        slow.sort(key=lambda row: -row["saving_us"])
        step_us = float(trace.steps["dur_us"].sum()) if trace.steps.height else 0.0
        saving_pct = 100.0 * saving_us / step_us if step_us > 0 else None
        if saving_pct is not None and saving_pct < thresholds.slow_matmul_min_step_saving_pct:
            return []
        slow_of_step = 100.0 * sum(row["gpu_us"] for row in slow) / step_us if step_us > 0 else None
        return [
            self._finding(inputs, trace, slow, gemm_us, saving_of_gemm, saving_pct, slow_of_step)
        ]

    def _finding(
        self,
        inputs: AnalysisInputs,
        trace: Any,
        slow: list[dict[str, Any]],
        gemm_us: float,
        saving_of_gemm: float,
        saving_pct: float | None,
        slow_of_step: float | None,
    ) -> Finding:
        shapes = [
            {
                "operator": row["name"],
                "shape": row["shape"],
                "precision": row["precision"],
                "calls": row["calls"],
                "median_call_us": r(row["median_us"], 2),
                "share_of_gemm_pct": r(100.0 * row["gpu_us"] / gemm_us, 1),
                "outpaced_by": f"{row['peer']['name']} {row['peer']['shape']}",
                "outpaced_by_median_call_us": r(row["peer"]["median_us"], 2),
                "outpaced_by_flops_ratio": r(
                    row["peer"]["flops_per_call"] / row["flops_per_call"], 2
                ),
                "slowdown_x": r(row["median_us"] / row["peer"]["median_us"], 2),
                "saving_ms": r(row["saving_us"] / 1000.0, 3),
            }
            for row in slow
        ]
        top, head = slow[0], shapes[0]
        shown = shapes[:SHOWN]
        share = 100.0 * sum(row["gpu_us"] for row in slow) / gemm_us
        evidence: dict[str, Any] = {
            "source": "trace: counted GEMM calls with recorded shapes (docs/ROOFLINE.md)",
            "gemm_gpu_ms": r(gemm_us / 1000.0, 3),
            "slow_share_of_gemm_pct": r(share, 1),
            "saving_share_of_gemm_pct": r(saving_of_gemm, 1),
            # the slow GEMMs' own GPU time over the profiled steps' time: the saving's bound
            "slow_gemm_pct_of_step_time": r(slow_of_step, 2),
            "shapes": shown,
            "steps": step_range(trace.steps["step"]) if trace.steps.height else None,
            "chart": chart(
                "bar",
                "Median call time: each slow GEMM against the larger GEMM that outpaced it",
                "GEMM",
                # every time axis a user sees counts ms (tests/diagnostics/report)
                "ms a call",
                [f"{s['operator']} {s['shape']}"[:60] for s in shown],
                {
                    "this GEMM": [r(row["median_us"] / 1000.0, 5) for row in slow[:SHOWN]],
                    "a GEMM of at least its work": [
                        r(row["peer"]["median_us"] / 1000.0, 5) for row in slow[:SHOWN]
                    ],
                },
            ),
        }
        saved = (
            f" At the faster GEMMs' measured times they would save {pct(saving_of_gemm)} of "
            f"GEMM time, about {pct(saving_pct)} of the profiled steps' time (if the GPU is "
            "what the step waits for)."
            if saving_pct is not None
            else f" At the faster GEMMs' measured times they would save {pct(saving_of_gemm)} "
            "of GEMM time."
        )
        amd = device_advice(inputs).vendor == "amd"
        blas_name = "hipBLASLt on ROCm" if amd else "cuBLASLt instead of cuBLAS"
        severity = Severity.MEDIUM if saving_pct is not None and saving_pct >= 5.0 else Severity.LOW
        return Finding(
            rule=self.id,
            severity=severity,
            title=(
                f"{pct(share)} of GEMM time is in matmuls that took {head['slowdown_x']}x as "
                f"long as a larger matmul on the same GPU ({head['operator']} {head['shape']})"
            ),
            evidence=evidence,
            recommendation=(
                f"{len(shapes)} GEMM shape(s) took longer a call than a GEMM of the same "
                f"precision that did at least their FLOPs and bytes in this trace; the "
                f"costliest, {head['operator']} {head['shape']} ({head['precision']}, "
                f"{head['share_of_gemm_pct']} % of GEMM time), took {head['median_call_us']} us "
                f"a call where {head['outpaced_by']} took {head['outpaced_by_median_call_us']} "
                f"us.{saved} The kernel chosen for its shape is the likely cause (a small "
                "output beside a long reduction leaves SMs idle unless the reduction is "
                "split): let torch.compile's max-autotune time other kernels for it, or try "
                f"{blas_name}, and keep whichever the next trace shows faster."
            ),
            fix=Fix(
                code=FIX_CODE.format(
                    operator=top["name"],
                    shape=top["shape"],
                    precision=top["precision"],
                    slow_us=top["median_us"],
                    peer_operator=top["peer"]["name"],
                    peer_shape=top["peer"]["shape"],
                    peer_us=top["peer"]["median_us"],
                    blas_name=blas_name,
                ),
            ),
            estimated_saving_pct=r(saving_pct, 1),
        )

    examples: ClassVar = (
        Example(
            "trace: a layer's weight gradient (M=64, K=4,096) 1.6x as slow as its data "
            "gradient, the same FLOPs",
            True,
            lambda: _example(slow_us=146.0),
            expect=lambda f: _expect_weight_gradient(f),
        ),
        Example(
            "trace: the same two GEMMs within 1.3x of each other",
            False,
            lambda: _example(slow_us=122.0),
        ),
        Example(
            "trace: the slow GEMM is the largest: nothing did more work to compare it with",
            False,
            lambda: _example(slow_us=146.0, slow_m=128),
        ),
        Example(
            "trace: 3x as slow, but a thousandth of GEMM time",
            False,
            lambda: _example(slow_us=282.0, slow_calls=1, other_calls=5000),
        ),
        Example(
            "trace: 1.6x as slow, 15 % of GEMM time, in steps 500x their GEMM time",
            False,
            lambda: _example(slow_us=146.0, step_factor=500.0),
        ),
        Example(
            "trace: slow bf16 GEMM with N=2,798, off the alignment: misshapen-matmul's",
            False,
            lambda: _example(slow_us=146.0, precision="bf16"),
        ),
    )


# --- examples ------------------------------------------------------------------------------
# One layer's three GEMMs a step, as A100 rank 0 of HTA's 16-rank job records them (fp32,
# 4,096 tokens, 2,798 features in, 64 out): forward 4096x64x2798 at 94 us, data gradient
# 4096x2798x64 at 108 us, weight gradient 64x2798x4096 at ``slow_us``; each 2·4096·2798·64
# FLOPs. 40 calls each, a step twice their GPU time. The times are the example's inputs.
ROWS, FEATURES, OUT = 4096, 2798, 64


def _gemm_row(
    op_id: int, m: int, n: int, k: int, us: float, precision: str = "fp32"
) -> dict[str, Any]:
    flops = 2 * m * n * k
    moved = 4 * (m * k + k * n + m * n)
    return {
        "op_id": op_id,
        "name": "aten::mm",
        "start_us": float(op_id),
        "end_us": float(op_id) + 1.0,
        "kind": "gemm",
        "shape": f"M={m} N={n} K={k}",
        "dtype": "float",
        "precision": precision,
        "backward": False,
        "counted": True,
        "gemm_batch": 1,
        "gemm_m": m,
        "gemm_n": n,
        "gemm_k": k,
        "flops": flops,
        "bytes": moved,
        "gpu_us": us,
        "tflops_per_s": flops / us / 1e6,
    }


def _example(
    *,
    slow_us: float,
    slow_m: int = OUT,
    slow_calls: int = 40,
    other_calls: int = 40,
    precision: str = "fp32",
    step_factor: float = 2.0,
) -> AnalysisInputs:
    rows = []
    op_id = 0
    for m, n, k, us, calls in (
        (ROWS, OUT, FEATURES, 94.0, other_calls),
        (ROWS, FEATURES, OUT, 108.0, other_calls),
        (slow_m, FEATURES, ROWS, slow_us, slow_calls),
    ):
        for _ in range(calls):
            op_id += 1
            rows.append(_gemm_row(op_id, m, n, k, us, precision))
    calls_frame = pl.DataFrame(rows, schema=OP_ROOFLINE_SCHEMA, strict=False)
    peak = next(p for p in PEAKS if p.device.startswith("A100"))
    roofline = RooflineFacts(
        calls=calls_frame, signatures=calls_frame.clear(), kernels=calls_frame.clear(), peak=peak
    )
    step_us = step_factor * float(calls_frame["gpu_us"].sum())
    trace = replace(ex.trace(steps=1, step_us=step_us), roofline=roofline)
    return ex.inputs(trace=trace)


def _expect_weight_gradient(finding: Finding) -> None:
    (shape,) = finding.evidence["shapes"]
    assert shape["shape"] == "M=64 N=2798 K=4096"
    # the forward GEMM (the same FLOPs, as many bytes) is the fastest that did at least as
    # much: 94 us against 146
    assert shape["outpaced_by"] == "aten::mm M=4096 N=64 K=2798"
    assert shape["slowdown_x"] == round(146 / 94, 2)
    # 40 calls at 146 us brought to 94: 2,080 us of a step twice 40 x (94 + 108 + 146) us
    assert finding.estimated_saving_pct == round(100 * 40 * (146 - 94) / (2 * 40 * 348), 1)
    assert finding.evidence["saving_share_of_gemm_pct"] == round(100 * 52 / 348, 1)
    assert finding.severity == Severity.MEDIUM
    assert "preferred_blas_library" in finding.fix.code
