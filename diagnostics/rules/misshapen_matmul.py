"""misshapen-matmul: GEMMs with a dimension off the Tensor Core alignment their precision needs.

What it finds
    In a GPU trace recorded with shapes, the counted GEMM calls (the roofline's innermost
    ``mm``/``addmm``/``bmm``/``linear``/... calls, forward and backward: docs/ROOFLINE.md)
    whose M, N or K is not a multiple of the alignment NVIDIA's *Matrix Multiplication
    Background User's Guide* gives for Tensor Cores: 16 bytes, 8 elements in fp16/bf16 and
    16 in fp8 (fp32 GEMMs are left to tensor-cores-unused: whether they ran as TF32 is not
    in the shapes). The classic case is GPT-2's vocabulary of 50,257 where 50,304 (a
    multiple of 64) does the same work faster. Each misaligned signature's achieved TFLOP/s
    is set against the aligned GEMMs of the same precision and similar size in the same
    trace (FLOPs a call within ``misshapen_gemm_compare_flops_ratio``). Only a signature
    measured slower than those (by ``misshapen_gemm_min_slowdown_pct``) counts; one with
    nothing of similar size to compare against is listed but not counted, and alone keeps
    the rule silent: tiny misaligned GEMMs (a 5-class head of 32 rows) take their time in
    launches, not in tiles, and their saving cannot be measured from the trace. Reported:
    the offending shapes and dimensions, their share of GEMM time, their rate and the
    comparison's, and the saving those measured rates give (their GPU time at the aligned
    GEMMs' rate) as a share of the profiled steps' time.

Why it matters
    Tensor Core kernels work on tiles; cuBLAS runs any size, but a dimension that is not
    a multiple of 8 (16-bit) forces narrower loads or a padded, partly wasted last tile,
    and the guide recommends multiples of 64 (128 bytes) for the best efficiency on A100
    and later. A vocabulary-sized output projection is often the largest GEMM of a
    language model, so its shape decides a large share of the step.

How to fix
    Pad the dimension: the vocabulary to a multiple of 64 (Megatron-LM's
    ``--make-vocab-size-divisible-by``, 128 by default; nanoGPT's 50,304; Hugging Face's
    ``resize_token_embeddings(n, pad_to_multiple_of=64)``): the extra rows are never looked
    up and their logits learn to stay low. Other dimensions (a hidden or feed-forward
    width, a batch × sequence count): choose multiples of 8 at least, 64 where you can;
    the evidence names the operator and the dimension. After pruning a vocabulary
    (unused-embedding-rows), pad the pruned size. The reference trainer pads with
    ``model.pad_vocab_to_multiple_of=64``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, ClassVar

import polars as pl

from diagnostics.facts.peaks import PEAKS
from diagnostics.facts.roofline import (
    OP_ROOFLINE_SCHEMA,
    TENSOR_CORE_ALIGNMENT,
    RooflineFacts,
    misaligned_dims,
    timed_gemm_calls,
)
from diagnostics.model import AnalysisInputs
from diagnostics.percent import pct
from diagnostics.rules import examples as ex
from diagnostics.rules.base import Example, Finding, Fix, Need, Rule, Severity, need_cuda_trace
from diagnostics.rules.evidence import chart, cuda_trace, r, step_range
from diagnostics.thresholds import Thresholds

# the padding the guide recommends for the best efficiency (128 bytes: 64 elements in
# 16-bit) and that nanoGPT (50,304) and Megatron-LM use for the vocabulary
VOCAB_MULTIPLE = 64
GUIDE = (
    "NVIDIA, Matrix Multiplication Background User's Guide: Tensor Core requirements "
    "(docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication)"
)

FIX_CODE = """\
# before: a vocabulary of {vocab:,} rows, so the LM head's GEMMs have N = {vocab:,}
model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer)))

# after: pad the rows to a multiple of 64 ({padded:,}); ids >= len(tokenizer) never occur
model = GPT2LMHeadModel(GPT2Config(vocab_size=(len(tokenizer) + 63) // 64 * 64))
# or, on a built Hugging Face model:
model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)
# other layers: make widths multiples of 8 at least (64 where you can), e.g.
# nn.Linear(hidden, {example_dim}) -> nn.Linear(hidden, {example_padded}) and slice the output
"""


def _signatures(calls: pl.DataFrame) -> pl.DataFrame:
    """Calls grouped by operator, shape and precision: their FLOPs, GPU time and rate."""
    return (
        calls.group_by("name", "shape", "precision", "gemm_m", "gemm_n", "gemm_k")
        .agg(
            pl.len().alias("calls"),
            pl.col("flops").sum().alias("flops"),
            pl.col("gpu_us").sum().alias("gpu_us"),
        )
        .with_columns(
            (pl.col("flops") / pl.col("calls")).alias("flops_per_call"),
            (pl.col("flops") / (pl.col("gpu_us") / 1e6) / 1e12).alias("tflops_per_s"),
            pl.col("precision")
            .replace_strict(TENSOR_CORE_ALIGNMENT, default=None)
            .alias("alignment"),
        )
        .sort(["gpu_us", "name", "shape"], descending=[True, False, False])
    )


def _misaligned(row: dict[str, Any]) -> list[str]:
    return misaligned_dims(row["precision"], row["gemm_m"], row["gemm_n"], row["gemm_k"])


def _vocab_rows(inputs: AnalysisInputs) -> int | None:
    """The model's vocabulary rows, when a run recorded them."""
    if inputs.run is None:
        return None
    usage = inputs.run.environment.get("vocab_usage")
    rows = usage.get("vocab_size") if isinstance(usage, dict) else None
    if isinstance(rows, int) and rows > 0:
        padding = usage.get("padding_rows") if isinstance(usage, dict) else None
        return rows + (padding if isinstance(padding, int) and padding > 0 else 0)
    return None


def _has_gemm_shapes(inputs: AnalysisInputs) -> bool:
    trace = cuda_trace(inputs)
    return bool(
        trace is not None
        and trace.roofline is not None
        and timed_gemm_calls(trace.roofline.calls).height
    )


class MisshapenMatmul(Rule):
    id = "misshapen-matmul"
    title = "Matmuls with dimensions off the Tensor Core alignment run slower"
    severity = Severity.MEDIUM
    needs = (
        need_cuda_trace("GEMM shapes and their GPU time come from a GPU trace"),
        Need(
            "GEMM calls with recorded shapes and GPU time (record_shapes=True)",
            _has_gemm_shapes,
            "no GEMM call with recorded shapes and GPU time: the trace was recorded without "
            "record_shapes, or ran no matmul",
        ),
    )
    threshold_names = (
        "misshapen_gemm_min_share_pct",
        "misshapen_gemm_min_slowdown_pct",
        "misshapen_gemm_compare_flops_ratio",
    )

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        trace = cuda_trace(inputs)
        assert trace is not None and trace.roofline is not None
        signatures = _signatures(timed_gemm_calls(trace.roofline.calls))
        gemm_us = float(signatures["gpu_us"].sum())
        rows = signatures.to_dicts()
        aligned = [s for s in rows if s["alignment"] and not _misaligned(s)]
        # a factor under 1 would compare a GEMM with nothing, not even its own size
        ratio = max(thresholds.misshapen_gemm_compare_flops_ratio, 1.0)
        slow_factor = 1.0 - thresholds.misshapen_gemm_min_slowdown_pct / 100.0
        offenders = []
        unmeasured: list[tuple[dict[str, Any], list[str]]] = []
        for sig in rows:
            dims = _misaligned(sig)
            if not dims:
                continue
            similar = [
                a
                for a in aligned
                if a["precision"] == sig["precision"]
                and sig["flops_per_call"] / ratio
                <= a["flops_per_call"]
                <= sig["flops_per_call"] * ratio
            ]
            reference = (
                sum(a["flops"] for a in similar) / (sum(a["gpu_us"] for a in similar) / 1e6) / 1e12
                if similar
                else None
            )
            if reference is None:
                unmeasured.append((sig, dims))
                continue
            if sig["tflops_per_s"] >= slow_factor * reference:
                continue  # measured as fast as aligned GEMMs of its size: nothing to gain
            saving_us = max(sig["gpu_us"] - sig["flops"] / (reference * 1e12) * 1e6, 0.0)
            offenders.append((sig, dims, similar, reference, saving_us))
        if not offenders or gemm_us <= 0:
            return []
        offending_us = sum(o[0]["gpu_us"] for o in offenders)
        share = 100.0 * offending_us / gemm_us
        if share < thresholds.misshapen_gemm_min_share_pct:
            return []
        step_us = float(trace.steps["dur_us"].sum()) if trace.steps.height else 0.0
        measured = [o[4] for o in offenders if o[4] is not None]
        saving_pct = 100.0 * sum(measured) / step_us if measured and step_us > 0 else None
        vocab = _vocab_rows(inputs)
        return [self._finding(inputs, offenders, share, gemm_us, saving_pct, vocab, trace)]

    def _finding(
        self,
        inputs: AnalysisInputs,
        offenders: list[
            tuple[dict[str, Any], list[str], list[dict[str, Any]], float | None, float | None]
        ],
        share: float,
        gemm_us: float,
        saving_pct: float | None,
        vocab: int | None,
        trace: Any,
    ) -> Finding:
        shapes = []
        for sig, dims, similar, reference, saving_us in offenders:
            shapes.append(
                {
                    "operator": sig["name"],
                    "shape": sig["shape"],
                    "precision": sig["precision"],
                    "calls": sig["calls"],
                    "misaligned": ", ".join(dims),
                    "alignment": sig["alignment"],
                    "gpu_ms": r(sig["gpu_us"] / 1000.0, 3),
                    "share_of_gemm_pct": r(100.0 * sig["gpu_us"] / gemm_us, 1),
                    "tflops_per_s": r(sig["tflops_per_s"], 1),
                    "aligned_similar_tflops_per_s": r(reference, 1),
                    "aligned_similar_signatures": len(similar),
                    "saving_ms": r(saving_us / 1000.0, 3),
                }
            )
        top = shapes[0]
        dims_all = {d.split("=")[1] for _, dims, *_ in offenders for d in dims}
        vocab_dim = vocab is not None and str(vocab) in dims_all
        example_dim = int(next(iter(sorted(dims_all, key=lambda d: -int(d)))))
        example_padded = math.ceil(example_dim / 8) * 8
        padded_vocab = (
            math.ceil(vocab / VOCAB_MULTIPLE) * VOCAB_MULTIPLE if vocab_dim and vocab else None
        )
        chart_rows = shapes[:8]
        evidence: dict[str, Any] = {
            "source": "trace: counted GEMM calls with recorded shapes (docs/ROOFLINE.md)",
            "alignment_source": GUIDE,
            "misshapen_share_of_gemm_pct": r(share, 1),
            "gemm_gpu_ms": r(gemm_us / 1000.0, 3),
            "shapes": shapes[:10],
            "vocab_rows": vocab,
            "vocab_padded_rows": padded_vocab,
            "steps": step_range(trace.steps["step"]) if trace.steps.height else None,
        }
        if chart_rows:
            labels = [f"{s['operator']} {s['shape']}"[:60] for s in chart_rows]
            evidence["chart"] = chart(
                "bar",
                "Misaligned GEMMs against aligned GEMMs of similar size (same trace)",
                "GEMM",
                "TFLOP/s",
                labels,
                {
                    "misaligned": [s["tflops_per_s"] for s in chart_rows],
                    "aligned, similar size": [
                        s["aligned_similar_tflops_per_s"] for s in chart_rows
                    ],
                },
            )
        compare = (
            f"at {top['tflops_per_s']} TFLOP/s against {top['aligned_similar_tflops_per_s']} for "
            f"aligned {top['precision']} GEMMs of similar size in this trace"
        )
        saved = (
            f" At the aligned GEMMs' measured rate they would save about {pct(saving_pct)} of "
            "the profiled steps' time (if the GPU is what the step waits for)."
            if saving_pct is not None
            else ""
        )
        what = (
            f"the vocabulary ({vocab:,} rows): pad it to {padded_vocab:,}, a multiple of "
            f"{VOCAB_MULTIPLE}"
            if vocab_dim and padded_vocab
            else "those dimensions: pad them to multiples of 8 at least, 64 where you can "
            "(a vocabulary to a multiple of 64)"
        )
        patch = (
            {"model.pad_vocab_to_multiple_of": VOCAB_MULTIPLE}
            if vocab_dim and inputs.run is not None and inputs.run.kind != "script"
            else None
        )
        severity = Severity.MEDIUM if saving_pct is not None and saving_pct >= 5.0 else Severity.LOW
        return Finding(
            rule=self.id,
            severity=severity,
            title=(
                f"{pct(share)} of GEMM time is in matmuls with a dimension off the "
                f"Tensor Core alignment ({top['misaligned']})"
            ),
            evidence=evidence,
            recommendation=(
                f"{len(shapes)} GEMM shape(s) have a dimension that is not a multiple of the "
                f"{top['alignment']} elements {top['precision']} Tensor Cores need; the largest, "
                f"{top['operator']} {top['shape']}, ran {top['share_of_gemm_pct']} % of GEMM time "
                f"{compare}.{saved} Pad {what}."
            ),
            fix=Fix(
                code=FIX_CODE.format(
                    vocab=vocab or 50_257,
                    padded=padded_vocab or 50_304,
                    example_dim=example_dim,
                    example_padded=example_padded,
                ),
                config_patch=patch,
            ),
            estimated_saving_pct=r(saving_pct, 1),
        )

    examples: ClassVar = (
        Example(
            "trace: GPT-2 LM head N=50,257 at 330 TFLOP/s beside aligned GEMMs at 600",
            True,
            lambda: _example(50_257),
            expect=lambda f: _expect_gpt2(f),
        ),
        Example("trace: the same LM head padded to N=50,304", False, lambda: _example(50_304)),
        Example(
            "trace: misaligned N=10 classification head, 0.1 % of GEMM time",
            False,
            lambda: _example(50_304, head_us=10.0),
        ),
        Example(
            "trace: N=50,257 with nothing of similar size to measure it against",
            False,
            lambda: _example(50_257, with_aligned=False),
        ),
        Example(
            "trace: misaligned but measured as fast as aligned GEMMs of its size",
            False,
            lambda: _example(50_257, lm_head_tflops=600.0),
        ),
    )


# --- examples ------------------------------------------------------------------------------
# A GPT-2-small step on an H100-class GPU, as the roofline's calls: 8192 tokens, hidden 768;
# the LM head's three GEMMs (forward, dX, dW) at a stated rate, and MLP-sized aligned GEMMs
# (2 x 8192 x 768 x 3072 per call, 16x fewer FLOPs) at 600 TFLOP/s. The rates are the
# example's inputs, not measurements.
TOKENS, HIDDEN, FFN = 8192, 768, 3072


def _gemm_row(op_id: int, name: str, m: int, n: int, k: int, tflops: float) -> dict[str, Any]:
    flops = 2 * m * n * k
    return {
        "op_id": op_id,
        "name": name,
        "start_us": float(op_id),
        "end_us": float(op_id) + 1.0,
        "kind": "gemm",
        "shape": f"M={m} N={n} K={k}",
        "dtype": "c10::BFloat16",
        "precision": "bf16",
        "backward": False,
        "counted": True,
        "gemm_batch": 1,
        "gemm_m": m,
        "gemm_n": n,
        "gemm_k": k,
        "flops": flops,
        "bytes": 2 * (m * k + k * n + m * n),
        "gpu_us": flops / (tflops * 1e12) * 1e6,
        "tflops_per_s": tflops,
    }


def _example(
    vocab: int,
    *,
    lm_head_tflops: float = 330.0,
    with_aligned: bool = True,
    head_us: float | None = None,
) -> AnalysisInputs:
    rows = [
        _gemm_row(1, "aten::mm", TOKENS, vocab, HIDDEN, lm_head_tflops),
        _gemm_row(2, "aten::mm", TOKENS, HIDDEN, vocab, lm_head_tflops),
        _gemm_row(3, "aten::mm", vocab, HIDDEN, TOKENS, lm_head_tflops),
    ]
    if vocab % 64 == 0:
        # padded: the same GEMMs run at the aligned rate
        rows = [
            {**row, "gpu_us": row["flops"] / 600e12 * 1e6, "tflops_per_s": 600.0} for row in rows
        ]
    if with_aligned:
        rows += [
            _gemm_row(10 + i, "aten::addmm", TOKENS, n, k, 600.0)
            for i, (n, k) in enumerate([(FFN, HIDDEN), (HIDDEN, FFN)] * 12)
        ]
    if head_us is not None:
        head = _gemm_row(99, "aten::addmm", 256, 10, HIDDEN, 0.5)
        rows.append({**head, "gpu_us": head_us})
    calls = pl.DataFrame(rows, schema=OP_ROOFLINE_SCHEMA, strict=False)
    peak = next(p for p in PEAKS if p.device == "H100 SXM")
    roofline = RooflineFacts(
        calls=calls, signatures=calls.clear(), kernels=calls.clear(), peak=peak
    )
    step_us = float(calls["gpu_us"].sum()) / 0.6  # GEMMs are 60 % of a step
    trace = replace(ex.trace(steps=1, step_us=step_us), roofline=roofline)
    return ex.inputs(trace=trace)


def _expect_gpt2(finding: Finding) -> None:
    shapes = finding.evidence["shapes"]
    assert {s["misaligned"] for s in shapes} == {"N=50257", "K=50257", "M=50257"}
    assert all(s["aligned_similar_tflops_per_s"] == 600.0 for s in shapes)
    # the LM head's time at 600 instead of 330 TFLOP/s: 1 - 330/600 of it saved; the LM head
    # is 3 x 2·8192·50257·768 FLOPs, the aligned GEMMs 24 x 2·8192·3072·768, step = GEMMs / 0.6
    lm_us = 3 * 2 * 8192 * 50257 * 768 / 330e6
    aligned_us = 24 * 2 * 8192 * 3072 * 768 / 600e6
    expected = 100 * lm_us * (1 - 330 / 600) / ((lm_us + aligned_us) / 0.6)
    assert finding.estimated_saving_pct == round(expected, 1)
    assert finding.fix.config_patch is None  # a trace: no trainer config to patch
