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
    - fp16 autocast without a GradScaler: a CUDA run configured so, or a trace with fp16
      kernels but none of the ops GradScaler runs (``_amp_foreach_non_finite_check_and_unscale_``,
      ``_amp_update_scale_``).

    Each training phase (masked-LM pretraining, fine-tuning) is judged on its own.

Why it matters
    A spike moves the weights far in one step; a NaN poisons them for good; fp16 gradients
    underflow to zero without loss scaling. Each wastes the steps that follow.

How to fix
    Clip the gradient norm (``clip_grad_norm_(params, 1.0)``), lower the learning rate (or
    warm it up), and with fp16 use ``torch.amp.GradScaler`` (or bf16, which needs none).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import polars as pl

from diagnostics.facts.loss_scaling import fp16_without_scaler
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

FIX_CODE = """\
# before
loss.backward()
optimizer.step()

# after: clip the norm, lower the LR; with fp16, scale the loss
scaler = torch.amp.GradScaler("cuda")            # fp16 only (bf16 needs none)
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(**batch).loss
scaler.scale(loss).backward()
scaler.unscale_(optimizer)
torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
scaler.step(optimizer)
scaler.update()
# and build the optimiser with a lower learning rate, e.g. lr=lr * 0.1
"""


def _phases(steps: pl.DataFrame) -> list[tuple[str, pl.DataFrame]]:
    if "phase" not in steps.columns or steps["phase"].null_count() == steps.height:
        return [("all", steps)]
    return [
        (str(name), steps.filter(pl.col("phase") == name))
        for name in steps["phase"].unique(maintain_order=True).to_list()
    ]


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
                "fp16 kernels that ran without loss scaling",
                "kernel",
                "GPU time (µs)",
                [name[:60] for name in from_trace["top_fp16_kernels"]],
                {"GPU time (µs)": from_trace["top_fp16_kernel_us"]},
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
        return [
            Finding(
                rule=self.id,
                severity=Severity.HIGH if severe or fp16_unscaled else Severity.MEDIUM,
                title="Unstable training: " + ", ".join(k.replace("_", " ") for k in kinds),
                evidence=evidence,
                recommendation=self._recommendation(kinds, offending, patch),
                fix=Fix(code=FIX_CODE, config_patch=patch),
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
    def _recommendation(kinds: list[str], offending: set[int], patch: dict[str, Any]) -> str:
        parts = []
        if offending:
            first = min(offending)
            parts.append(f"Trouble starts at step {first} ({len(offending)} step(s) affected).")
        if "fp16_without_grad_scaler" in kinds:
            parts.append("fp16 autocast runs without a GradScaler: small gradients underflow.")
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
            parts.append("Use torch.amp.GradScaler with fp16 (or switch to bf16).")
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
        # traces: the examples differ in the kernels' names and the ops beside them
        Example(
            "trace: fp16 GEMM kernels but no GradScaler ops",
            True,
            lambda: _traced(_FP16_GEMM, operators=[_op("aten::mm", 10, 100.0, 5000.0)]),
        ),
        Example(
            "trace: H200 fp16 kernels (c10::Half, nvjet hsh) but no GradScaler ops",
            True,
            lambda: _traced(
                ex.kernel("nvjet_sm90_hsh_64x32_64x16_1x4_h_bz_NTT", 30, 110.0, tensor_core=True),
                ex.kernel(_ELEMENTWISE.format("CUDAFunctor_add<c10::Half>"), 60, 90.0),
                compute_capability=(9, 0),
            ),
        ),
        Example(
            "trace: H200 bf16 autocast (BFloat16 kernels, cuDNN attention named wgmma_f16)",
            False,
            lambda: _traced(
                _F16_ATTENTION,
                ex.kernel(
                    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp"
                    "<c10::BFloat16, at::native::func_wrapper_t<float>>>",
                    40,
                    300.0,
                ),
                ex.kernel(
                    "void at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)", 40, 200.0
                ),
                compute_capability=(9, 0),
            ),
        ),
        Example(
            "trace: ops with c10::Half inputs, kernel names without a format, no GradScaler",
            True,
            lambda: _traced(
                ex.kernel("nvjet_sm90_64x32_64x16_NTT", 18, 2800.0, tensor_core=True),
                op_half_dtypes=[{"dtype": "c10::Half", "ops": 120}],
            ),
        ),
        Example(
            "trace: ops with c10::BFloat16 inputs, kernels named only f16 (bf16 autocast)",
            False,
            lambda: _traced(
                _F16_ATTENTION, op_half_dtypes=[{"dtype": "c10::BFloat16", "ops": 120}]
            ),
        ),
        Example(
            "trace: fp16 kernels with GradScaler's unscale op",
            False,
            lambda: _traced(
                _FP16_GEMM,
                operators=[_op("aten::_amp_foreach_non_finite_check_and_unscale_", 5, 50.0, 20.0)],
            ),
        ),
    )


_FP16_GEMM = ex.kernel("ampere_fp16_s16816gemm_fp16_128x128", 10, 5000.0, tensor_core=True)
# cuDNN's fused attention: "f16" in the name for fp16 and bf16 inputs alike (H200)
_F16_ATTENTION = ex.kernel(
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_"
    "4x1x1_cga1x1x1_kernel0_0",
    18,
    2800.0,
    tensor_core=True,
)
_ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::{}>"


def _op(name: str, calls: int, host_us: float, device_us: float) -> dict[str, Any]:
    return {"name": name, "calls": calls, "host_us": host_us, "device_us": device_us}


def _traced(*kernels: dict[str, Any], **trace: Any) -> AnalysisInputs:
    """A CUDA trace whose kernel table is ``kernels`` (examples)."""
    return ex.inputs(trace=ex.trace(kernels=list(kernels), **trace))


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
