"""unstable-gradients: gradient spikes, non-finite values, divergence or broken loss scaling.

What it finds
    Any of, with the offending steps:

    - gradient-norm spikes: after a warm-up, a step whose norm has a robust z-score (against
      the median and MAD of the preceding window of steps) above the threshold *and* is a
      multiple of that median (ZClip's test, made robust to the outliers it looks for);
    - a non-finite loss or gradient norm (a non-finite norm on a step GradScaler skipped is
      its normal overflow handling and counts under scaling instead);
    - loss divergence: the median loss of the last window well above the best earlier one;
    - GradScaler skipping many steps after warm-up, or its scale collapsing;
    - fp16 training without a GradScaler: a CUDA run configured so, or a trace whose dense
      GEMMs or convolutions run in fp16 *with their backward* (fp16 ops such as
      ``aten::addmm`` inside backward, ``AddmmBackward0`` with ``c10::Half`` inputs, or fp16
      GEMM kernels launched under backward ops) and none of the ops GradScaler runs
      (``_amp_foreach_non_finite_check_and_unscale_``, ``_amp_update_scale_``). fp16 that is
      data does not count: FBGEMM's embedding tables (TorchRec), quantised weights, NCCL's
      fp16 buffers, forward-only fp16 GEMMs (``diagnostics.facts.precision``).

    Each training phase (masked-LM pretraining, fine-tuning) is judged on its own. fp16
    without a GradScaler on its own is a risk, not observed instability: the finding is
    then titled so, at medium severity; "Unstable training" (high when non-finite,
    diverging, collapsing or fp16-unscaled) needs a signal in the loss, gradient-norm or
    scaler records.

Why it matters
    A spike moves the weights far in one step; a NaN poisons them for good; fp16 gradients
    underflow to zero without loss scaling. Each wastes the steps that follow.

How to fix
    Clip the gradient norm (``clip_grad_norm_(params, 1.0)``), lower the learning rate (or
    warm it up), and with fp16 use ``torch.amp.GradScaler`` (or bf16, which needs none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import polars as pl

from diagnostics.facts.loss_scaling import fp16_without_scaler
from diagnostics.facts.precision import PrecisionFacts
from diagnostics.model import AnalysisInputs
from diagnostics.rules import examples as ex
from diagnostics.rules.base import (
    Example,
    Finding,
    Fix,
    Rule,
    Severity,
    need_any,
    need_cuda_trace,
    need_run_steps,
)
from diagnostics.rules.device_advice import device_advice
from diagnostics.rules.evidence import chart, config_value, has_steps, numeric, run_device
from diagnostics.rules.training_signals import SignalLimits, phase_signals
from diagnostics.thresholds import Thresholds

if TYPE_CHECKING:
    pass

# The first move after instability: a tenth of the learning rate, and never above AdamW's
# own default (torch.optim.AdamW lr=1e-3) when the configured one is far beyond it.
LR_FACTOR = 0.1
LR_CEILING = 1e-3
# signals whose "steps" list the offending steps (the others give a range)
POINT_SIGNALS = frozenset({"non_finite", "grad_spikes", "scaler_skipped_steps"})
CLIP_NORM = 1.0
RISK_TITLE = "fp16 training without a GradScaler: a risk of underflowing gradients"

FIX_CODE = """\
# before
loss.backward()
optimizer.step()

# after: clip the norm, lower the LR; with fp16, scale the loss
scaler = torch.amp.GradScaler("cuda")            # fp16 only{bf16_note}
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(**batch).loss
scaler.scale(loss).backward()
scaler.unscale_(optimizer)
torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
scaler.step(optimizer)
scaler.update()
# and build the optimiser with a lower learning rate, e.g. lr=lr * 0.1
"""
# what the fix says of bf16, which needs no GradScaler, by whether the GPU has it
_BF16_NOTE = {True: " (bf16 needs none)", False: "", None: " (bf16, on Ampere+/CDNA, needs none)"}
_BF16_SWITCH = {True: " (or switch to bf16)", False: "", None: " (or, on Ampere+/CDNA, bf16)"}


def _phases(steps: pl.DataFrame) -> list[tuple[str, pl.DataFrame]]:
    if "phase" not in steps.columns or steps["phase"].null_count() == steps.height:
        return [("all", steps)]
    return [
        (str(name), steps.filter(pl.col("phase") == name))
        for name in steps["phase"].unique(maintain_order=True).to_list()
    ]


# each signal as the title names it (its evidence key is the snake_case form)
SIGNAL_NAMES = {
    "non_finite": "non-finite loss or gradients",
    "grad_spikes": "grad spikes",
    "divergence": "divergence",
    "scaler_skipped_steps": "GradScaler skipped steps",
    "scale_collapse": "loss-scale collapse",
    "fp16_without_grad_scaler": "fp16 without a GradScaler",
}


class UnstableGradients(Rule):
    id = "unstable-gradients"
    title = "Training is numerically unstable"
    severity = Severity.HIGH
    needs = (
        need_any(
            need_run_steps("loss"),
            need_run_steps("grad_norm"),
            need_cuda_trace(),
            text="run step records with loss or grad_norm, or a CUDA trace",
            skip=(
                "no loss or gradient-norm records (a bare trace has none) and no CUDA trace to "
                "check for fp16 without loss scaling"
            ),
        ),
    )
    threshold_names = (
        "grad_spike_z",
        "grad_warmup_steps",
        "grad_window_steps",
        "grad_spike_min_ratio",
        "loss_divergence_ratio",
        "loss_window_steps",
        "scaler_skip_share_max_pct",
        "scaler_scale_min",
    )

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        signals: list[str] = []
        evidence: dict[str, Any] = {}
        offending: set[int] = set()
        run = inputs.run
        fp16_unscaled = False
        advice = device_advice(inputs)
        t = thresholds
        limits = SignalLimits(
            grad_window_steps=t.grad_window_steps,
            grad_warmup_steps=t.grad_warmup_steps,
            grad_spike_z=t.grad_spike_z,
            grad_spike_min_ratio=t.grad_spike_min_ratio,
            loss_window_steps=t.loss_window_steps,
            loss_divergence_ratio=t.loss_divergence_ratio,
            scaler_skip_share_max_pct=t.scaler_skip_share_max_pct,
            scaler_scale_min=t.scaler_scale_min,
        )
        if run is not None and run.steps.height:
            for phase, steps in _phases(run.steps):
                found = phase_signals(steps, limits)
                for key, value in found.items():
                    if value:
                        evidence.setdefault(key, {})[phase] = value
                        signals.append(key)
                        if key in POINT_SIGNALS:
                            offending.update(int(s) for s in value["steps"])
            amp = config_value(run, "train.amp")
            scaler = config_value(run, "train.grad_scaler")
            if amp == "fp16" and scaler is False and run_device(run) == "cuda":
                evidence["fp16_without_grad_scaler"] = {
                    "train.amp": amp,
                    "train.grad_scaler": False,
                }
                signals.append("fp16_without_grad_scaler")
                fp16_unscaled = True
        from_trace = fp16_without_scaler(inputs.trace)
        if from_trace is not None and not fp16_unscaled:
            evidence["fp16_without_grad_scaler"] = {"trace": from_trace}
            signals.append("fp16_without_grad_scaler")
            fp16_unscaled = True
        if not signals:
            return []
        kinds = sorted(set(signals))
        severe = {"non_finite", "divergence", "scale_collapse"} & set(kinds)
        evidence["signals"] = kinds
        evidence["steps"] = sorted(offending)[:200] or _step_range(inputs)
        if (
            from_trace is not None
            and "fp16_without_grad_scaler" in kinds
            and not (run is not None and has_steps(run, "grad_norm"))
        ):
            evidence["chart"] = chart(
                "bar",
                "fp16 GEMM/convolution kernels that ran without loss scaling",
                "kernel",
                "GPU time (ms)",
                [name[:60] for name in from_trace["top_fp16_kernels"]],
                {
                    "GPU time (ms)": [
                        round(us / 1000.0, 3) for us in from_trace["top_fp16_kernel_us"]
                    ]
                },
            )
        if run is not None and has_steps(run, "grad_norm"):
            evidence["chart"] = chart(
                "line",
                "Gradient norm and loss per step",
                "step",
                "value",
                run.steps["step"].to_list(),
                {"grad norm": numeric(run.steps, "grad_norm"), "loss": numeric(run.steps, "loss")},
                highlight_x=sorted(offending)[:200],
            )
        patch = self._patch(inputs, kinds, fp16_unscaled)
        observed = set(kinds) - {"fp16_without_grad_scaler"}
        if observed:
            severity = Severity.HIGH if severe or fp16_unscaled else Severity.MEDIUM
            title = "Unstable training: " + ", ".join(SIGNAL_NAMES.get(k, k) for k in kinds)
        else:
            # nothing in the records (a bare trace has none) shows instability: a risk
            severity, title = Severity.MEDIUM, RISK_TITLE
        evidence["instability_observed"] = bool(observed)
        return [
            Finding(
                rule=self.id,
                severity=severity,
                title=title,
                evidence=evidence,
                recommendation=self._recommendation(kinds, offending, patch, advice.bf16),
                fix=Fix(
                    code=FIX_CODE.format(bf16_note=_BF16_NOTE[advice.bf16]), config_patch=patch
                ),
                estimated_saving_pct=None,
            )
        ]

    @staticmethod
    def _patch(inputs: AnalysisInputs, kinds: list[str], fp16_unscaled: bool) -> dict[str, Any]:
        patch: dict[str, Any] = {}
        numeric_trouble = set(kinds) - {"fp16_without_grad_scaler"}
        if numeric_trouble:
            patch["train.grad_clip"] = CLIP_NORM
            lr = config_value(inputs.run, "train.lr")
            if isinstance(lr, int | float) and lr > 0:
                patch["train.lr"] = float(f"{min(lr * LR_FACTOR, LR_CEILING):.3g}")
        if fp16_unscaled:
            patch["train.grad_scaler"] = True
        return patch

    @staticmethod
    def _recommendation(
        kinds: list[str], offending: set[int], patch: dict[str, Any], bf16: bool | None
    ) -> str:
        parts = []
        if offending:
            first = min(offending)
            parts.append(f"Trouble starts at step {first} ({len(offending)} step(s) affected).")
        if "fp16_without_grad_scaler" in kinds:
            parts.append(
                "fp16 GEMMs and their backward run without a GradScaler: small gradients can "
                "underflow to zero."
            )
        if set(kinds) - {"fp16_without_grad_scaler"}:
            lr = patch.get("train.lr")
            parts.append(
                f"Clip the gradient norm to {CLIP_NORM}"
                + (
                    f" and lower the learning rate to {lr}"
                    if lr
                    else " and lower the learning rate"
                )
                + "."
            )
        if "train.grad_scaler" in patch:
            parts.append(f"Use torch.amp.GradScaler with fp16{_BF16_SWITCH[bf16]}.")
        return " ".join(parts)

    examples: ClassVar = (
        Example(
            "run: grad norm ~1 with spikes of 20 at steps 40 and 55",
            True,
            lambda: ex.cpu_run(
                60,
                loss=lambda s: 2.0 - s * 0.01,
                grad_norm=lambda s: 20.0 if s in (40, 55) else 1.0 + 0.05 * (s % 5),
                config={"train.lr": 1e-3},
            ),
        ),
        Example(
            "run: loss turns NaN at step 30",
            True,
            lambda: ex.cpu_run(
                35,
                loss=lambda s: float("nan") if s >= 30 else 2.0,
                grad_norm=lambda s: float("nan") if s >= 30 else 1.0,
            ),
            expect=lambda f: _expect_title(f, "Unstable training: non-finite loss or gradients"),
        ),
        Example(
            "run: loss steady at 1.0, then 3.0 over the last 20 steps (diverging)",
            True,
            lambda: ex.cpu_run(60, loss=lambda s: 1.0 if s <= 40 else 3.0, grad_norm=1.0),
        ),
        Example(
            "run fp16: GradScaler halves its scale at steps 30, 40 and 50 (9% of steps)",
            True,
            lambda: _scaled_run(lambda s: 2.0**16 / 2 ** sum(s > k for k in (30, 40, 50))),
        ),
        Example(
            "run fp16: GradScaler scale fell to 0.5 during warm-up and stays there",
            True,
            lambda: _scaled_run(lambda s: max(2.0 ** (16 - s), 0.5)),
        ),
        Example(
            "run: smooth, decreasing loss and noisy but bounded grad norms",
            False,
            lambda: ex.cpu_run(
                80,
                loss=lambda s: 2.0 / (1 + 0.02 * s),
                grad_norm=lambda s: 1.0 + 0.3 * ((s * 7919) % 11) / 11,
            ),
        ),
        # traces: the examples differ in what their precision facts (facts/precision.py)
        # counted from the trace's ops and kernels; the names are from real traces
        Example(
            "trace: fp16 GEMMs with their backward (AddmmBackward0 with c10::Half inputs, "
            "aten::mm inside backward), no GradScaler ops",
            True,
            lambda: _traced(_FP16_GEMM, precision=_precision(forward_ops=96, backward_ops=126)),
        ),
        Example(
            "trace without shapes: H200 fp16 GEMM kernels (nvjet hsh) launched under "
            "backward ops, no GradScaler ops",
            True,
            lambda: _traced(
                _NVJET_HSH,
                precision=_precision(backward_kernels=90, top=(_NVJET_HSH["name"],)),
                compute_capability=(9, 0),
            ),
        ),
        Example(
            "trace: H200 bf16 autocast (BFloat16 kernels, cuDNN attention named wgmma_f16)",
            False,
            lambda: _traced(_F16_ATTENTION, precision=_precision(bf16_seen=True)),
        ),
        Example(
            "trace: TorchRec's fp16 embedding tables (FBGEMM split_embedding kernels, "
            "row-wise Adagrad in the kernel), TF32/fp32 dense layers",
            False,
            lambda: _traced(
                _FBGEMM_BACKWARD, precision=_precision(embedding_kernels=14, embedding_us=71837.0)
            ),
        ),
        Example(
            "trace: fp16 GEMMs in the forward only (inference: no backward ranges)",
            False,
            lambda: _traced(_FP16_GEMM, precision=_precision(forward_ops=96, backward_ranges=0)),
        ),
        Example(
            "trace: fp32 training, fp16 NCCL buffers (ncclKernel_..._f16)",
            False,
            lambda: _traced(_NCCL_F16, precision=_precision(comm_kernels=40)),
        ),
        Example(
            "trace: fp16 GEMMs with their backward and GradScaler's unscale op",
            False,
            lambda: _traced(
                _FP16_GEMM, precision=_precision(forward_ops=96, backward_ops=126, scaler_ops=5)
            ),
        ),
    )


_FP16_GEMM = ex.kernel("ampere_fp16_s16816gemm_fp16_128x128", 10, 5000.0, tensor_core=True)
# the H200 fp16 run's GEMM (../shared/gpu-runs/h200-default/gpu-unstable)
_NVJET_HSH = ex.kernel("nvjet_sm90_hsh_64x32_64x16_1x4_h_bz_NTT", 30, 110.0, tensor_core=True)
# cuDNN's fused attention: "f16" in the name for fp16 and bf16 inputs alike (H200)
_F16_ATTENTION = ex.kernel(
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_"
    "4x1x1_cga1x1x1_kernel0_0",
    18,
    2800.0,
    tensor_core=True,
)
# HTA's TorchRec trace (tests/data/trace_filter/sampled_rank-0.json.gz), name shortened
_FBGEMM_BACKWARD = ex.kernel(
    "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1"
    "<c10::Half, float, c10::Half, 2ul, 32>",
    4,
    23469.0,
)
_NCCL_F16 = ex.kernel("ncclDevKernel_AllReduce_Sum_f16_RING_LL(ncclDevComm*)", 40, 9000.0)


def _precision(
    *,
    forward_ops: int = 0,
    backward_ops: int = 0,
    backward_kernels: int = 0,
    top: tuple[str, ...] = (),
    embedding_kernels: int = 0,
    embedding_us: float = 0.0,
    comm_kernels: int = 0,
    bf16_seen: bool = False,
    backward_ranges: int = 300,
    scaler_ops: int = 0,
) -> PrecisionFacts:
    """Precision facts with these counts, the rest zero (examples)."""
    return PrecisionFacts(
        fp16_dense_forward_ops=forward_ops,
        fp16_dense_backward_ops=backward_ops,
        fp16_dense_backward_kernels=backward_kernels,
        fp16_dense_backward_kernel_us=110.0 * backward_kernels,
        top_fp16_dense_kernels=top,
        top_fp16_dense_kernel_us=tuple(110.0 for _ in top),
        fp16_embedding_kernels=embedding_kernels,
        fp16_embedding_kernel_us=embedding_us,
        fp16_comm_kernels=comm_kernels,
        bf16_seen=bf16_seen,
        backward_ranges=backward_ranges,
        scaler_ops=scaler_ops,
    )


def _traced(
    *kernels: dict[str, Any], precision: PrecisionFacts | None = None, **trace: Any
) -> AnalysisInputs:
    """A CUDA trace whose kernel table is ``kernels`` and precision facts ``precision``."""
    facts = replace(ex.trace(kernels=list(kernels), **trace), precision=precision)
    return ex.inputs(trace=facts)


def _scaled_run(amp_scale: Callable[[int], float]) -> AnalysisInputs:
    """A healthy 60-step fp16 run whose GradScaler scale follows ``amp_scale`` (examples)."""
    return ex.cpu_run(60, loss=lambda s: 2.0 - s * 0.01, grad_norm=1.0, amp_scale=amp_scale)


def _step_range(inputs: AnalysisInputs) -> list[int]:
    """First and last step judged, for findings without particular offending steps."""
    for frame in (
        inputs.run.steps if inputs.run is not None else None,
        inputs.trace.steps if inputs.trace is not None else None,
    ):
        if frame is not None and frame.height:
            return [int(frame["step"].min()), int(frame["step"].max())]
    return []


def _expect_title(finding: Finding, title: str) -> None:
    assert finding.title == title, finding.title
