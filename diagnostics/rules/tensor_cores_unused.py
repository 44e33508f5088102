"""tensor-cores-unused: matrix multiplies and convolutions run without Tensor Cores (NVIDIA) or
Matrix Cores (AMD).

What it finds
    A GPU trace from a GPU with matrix units (NVIDIA compute capability 7.0 or newer: Tensor
    Cores; AMD CDNA, gfx908 and newer: Matrix Cores) in which matrix-unit-eligible work
    (kernels launched by matmul, linear and convolution operators, as torch-tb-profiler
    counts it; GEMM/conv kernels by name when kernels are not linked to operators) takes a
    material share of GPU time but almost none of the kernel time is on matrix-unit kernels.
    Kernels are classified by the kernel-family table (``facts/kernel_families.py``, real
    names in docs/KERNELS.md): ``ffma``, ``simt``, ``sgemm`` or ``scudnn`` mean CUDA cores
    even under ``xmma``/``cutlass`` (``sm80_xmma_gemm_f32f32_..._ffma_...``,
    ``cutlass_80_simt_sgemm_...``); the NVIDIA matrix families are ``hmma``/``wmma``/
    ``imma``/``gmma``/``tcgen05``, the ``884``/``1688``/``16816`` tiles, ``tensorop``,
    ``xmma``, Hopper ``sm90_``/``nvjet``, FlashAttention, Blackwell ``bmm_Mx...``/
    ``fmhaSm100...`` and ``bf16``/``f16``/``tf32``/``i8`` GEMMs; the AMD ones hipBLASLt's
    Tensile ``Cijk_..._MI...``, Composable Kernel xdlops, MIOpen ``igemm_..._gtcx`` and
    AOTriton attention. That is fp32 training without AMP or TF32. When less than
    ``kernel_classified_min_pct`` of kernel time is on kernels the table knows, the rule
    says it could not tell and lists the unknown kernels. The estimated saving is the
    measured bf16/fp32 step-time ratio (``tensor_core_bf16_step_ratio``, H200) applied to
    the share of step time in CUDA-core GEMMs.

Why it matters
    Tensor Cores and Matrix Cores multiply half-precision (and TF32) matrices several times
    faster than the fp32 vector pipeline; a model dominated by GEMMs leaves most of the GPU's
    arithmetic unused.

How to fix
    Train under ``torch.autocast("cuda", dtype=torch.bfloat16)`` (NVIDIA Ampere and newer,
    AMD CDNA; fp16 with a GradScaler on Volta/Turing), or at least allow TF32 matmuls with
    ``torch.backends.cuda.matmul.allow_tf32 = True``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import polars as pl

from diagnostics.facts.coverage import KernelCoverage, kernel_coverage
from diagnostics.facts.kernel_classes import with_kernel_classes
from diagnostics.model import AnalysisInputs
from diagnostics.percent import pct
from diagnostics.rules import examples as ex
from diagnostics.rules.base import Example, Finding, Fix, Need, Rule, Severity, need_cuda_trace
from diagnostics.rules.device_advice import (
    AMD_MATRIX_CORE_ARCHITECTURES,
    DeviceAdvice,
    advice_for,
    trace_device,
)
from diagnostics.rules.evidence import chart, cuda_trace, r, step_range
from diagnostics.sources import TraceFacts
from diagnostics.thresholds import Thresholds

# Kernel names of the matrix-multiply and convolution work Tensor Cores can take.
ELIGIBLE_KERNEL = pl.col("name").str.contains(
    "(?i)gemm|conv|cutlass|cublas|implicit|winograd|xmma|nvjet|matmul|_mma"
)
# Operators whose kernels Tensor Cores can run (torch-tb-profiler's allow-list, with the
# backward and newer fused variants); matched on the op's own (self) device time.
ELIGIBLE_OP = pl.col("name").str.contains(
    "(?i)^aten::(_?convolution|conv|cudnn_convolution|miopen_convolution|mkldnn_convolution|"
    "thnn_conv|slow_conv|addmm|addmv|addbmm|baddbmm|bmm|mm|mv|matmul|linear|einsum|"
    "_scaled_mm|_scaled_dot_product)"
)


def fix_code(advice: DeviceAdvice) -> str:
    """Autocast in the precision this GPU takes, then what else its matrix units offer."""
    after = (
        f"# after: {advice.dtype} autocast puts matmuls and convolutions on the "
        f"{'Matrix' if advice.vendor == 'amd' else 'Tensor'} Cores\n"
    )
    if advice.vendor == "amd":
        after += '# (ROCm\'s PyTorch takes the same "cuda" device type)\n'
    code = (
        "# before: fp32 GEMMs on the CUDA cores\n"
        "loss = model(**batch).loss\n"
        "loss.backward()\n"
        "optimizer.step()\n\n"
        + after
        + advice.autocast("loss = model(**batch).loss", "loss.backward()\noptimizer.step()")
    )
    if advice.tf32:
        code += "# at least: torch.backends.cuda.matmul.allow_tf32 = True\n"
    elif advice.tf32 is None:
        code += "# at least, on NVIDIA Ampere+: torch.backends.cuda.matmul.allow_tf32 = True\n"
    if advice.fp8 and advice.vendor == "nvidia":
        code += (
            "# then, for large GEMMs, this GPU has FP8 Tensor Cores too:\n"
            "# torchao.float8.convert_to_float8_training(model), under torch.compile\n"
        )
    elif advice.fp8:
        code += (
            "# then, for large GEMMs, this GPU has FP8 Matrix Cores too:\n"
            "# ROCm's Transformer Engine (transformer_engine.pytorch.fp8_autocast)\n"
        )
    return code


_CLASSES = ("family", "unit", "precision", "tensor_core", "cuda_core_gemm")


def classified_kernels(trace: TraceFacts) -> pl.DataFrame:
    """The kernel table with the classes of each name (facts/kernel_classes.py): the facts'
    table carries them (facts.operators.kernel_table); one without them (the examples') is
    classified here, by the names, whatever flags it was given."""
    kernels = trace.kernels
    if set(_CLASSES) <= set(kernels.columns):
        return kernels
    return with_kernel_classes(kernels)


def coverage_of(trace: TraceFacts) -> KernelCoverage | None:
    """Classified share of the kernel time, by the kernel names."""
    kernels = classified_kernels(trace)
    return kernel_coverage(
        kernels.select("name", "calls", "device_us", "family", "unit", "precision")
    )


def _architecture_known(inputs: AnalysisInputs) -> bool:
    trace = inputs.trace
    if trace is None:
        return False
    identity = trace_device(trace)
    if identity.vendor == "amd":
        return identity.architecture is not None
    return trace.compute_capability is not None


class TensorCoresUnused(Rule):
    id = "tensor-cores-unused"
    title = "Tensor Cores (NVIDIA) or Matrix Cores (AMD) sit idle: matmuls run in fp32"
    severity = Severity.MEDIUM
    needs = (
        need_cuda_trace("kernel names show whether Tensor Cores or Matrix Cores ran"),
        Need(
            "the GPU's architecture (NVIDIA compute capability, AMD gfx target)",
            _architecture_known,
            "the trace does not record the GPU's architecture (compute capability or gfx target)",
        ),
    )
    threshold_names = (
        "tensor_core_min_capability",
        "tensor_core_eligible_min_pct",
        "tensor_core_used_max_pct",
        "kernel_classified_min_pct",
        "tensor_core_bf16_step_ratio",
    )

    def cannot_tell(self, inputs: AnalysisInputs, thresholds: Thresholds) -> str | None:
        trace = cuda_trace(inputs)
        coverage = coverage_of(trace) if trace is not None else None
        if coverage is None or coverage.classified_pct >= thresholds.kernel_classified_min_pct:
            return None
        unknown = ", ".join(
            f"{k['name'][:80]} ({k['device_us'] / 1000:.2f} ms)"
            for k in coverage.unknown_kernels[:3]
        )
        return (
            f"could not tell: only {pct(coverage.classified_pct)} of kernel time is on kernels "
            f"the kernel-family table knows (needs {pct(thresholds.kernel_classified_min_pct)}); "
            f"largest unknown: {unknown}"
        )

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        trace = cuda_trace(inputs)
        assert trace is not None
        identity = trace_device(trace)
        kernels = classified_kernels(trace)
        if kernels.height == 0:
            return []
        amd = identity.vendor == "amd"
        if amd:
            if identity.architecture not in AMD_MATRIX_CORE_ARCHITECTURES:
                return []
            where = f"{identity.describe()}"
        else:
            assert trace.compute_capability is not None
            major, minor = trace.compute_capability
            if major < thresholds.tensor_core_min_capability:
                return []
            where = f"compute capability {major}.{minor}"
        unit = identity.matrix_unit
        advice = advice_for(identity)
        flagged = kernels.with_columns(
            pl.col("tensor_core").alias("tc"),
            pl.col("cuda_core_gemm").alias("cuda_core"),
            ELIGIBLE_KERNEL.alias("eligible"),
        )
        kernel_us = float(flagged["device_us"].sum())
        if kernel_us <= 0:
            return []
        tc_us = float(flagged.filter(pl.col("tc"))["device_us"].sum())
        eligible = flagged.filter(pl.col("eligible") & ~pl.col("tc"))
        tc_pct = 100.0 * tc_us / kernel_us
        # as torch-tb-profiler: GPU time of kernels launched by eligible operators, when the
        # facts link kernels to operators; else GEMM/conv kernels recognised by name
        ops = trace.operators
        op_device_us = float(ops["device_us"].sum()) if ops.height else 0.0
        if op_device_us > 0:
            eligible_us = float(ops.filter(ELIGIBLE_OP)["device_us"].sum())
            eligible_pct = 100.0 * eligible_us / op_device_us
            method = "kernels launched by Tensor-Core-eligible operators (self device time)"
        else:
            eligible_us = float(eligible["device_us"].sum())
            eligible_pct = 100.0 * eligible_us / kernel_us
            method = "GEMM/convolution kernels recognised by name"
        if (
            tc_pct >= thresholds.tensor_core_used_max_pct
            or eligible_pct < thresholds.tensor_core_eligible_min_pct
        ):
            return []
        top = eligible.sort("device_us", descending=True).head(8)
        cuda_core_us = float(flagged.filter(pl.col("cuda_core"))["device_us"].sum())
        saving_pct, saving_basis = self._saving(cuda_core_us, kernel_us, trace.steps, thresholds)
        patch: dict[str, Any] = (
            {"train.amp": "bf16"}
            if advice.bf16
            else {"train.amp": "fp16", "train.grad_scaler": True}
        )
        steps = trace.steps
        coverage = coverage_of(trace)
        evidence: dict[str, Any] = {
            "source": "trace: kernel names and GPU time",
            "gpu_vendor": identity.vendor,
            "gpu_architecture": identity.architecture,
            "compute_capability": identity.compute_capability if not amd else None,
            "matrix_unit": unit,
            "tensor_core_kernel_pct": r(tc_pct, 1),
            "classified_kernel_pct": r(coverage.classified_pct, 1) if coverage else None,
            "eligible_pct": r(eligible_pct, 1),
            "eligible_us": r(eligible_us, 0),
            "eligible_method": method,
            "kernel_us": r(kernel_us, 0),
            "cuda_core_gemm_us": r(cuda_core_us, 0),
            "cuda_core_gemm_pct": r(100.0 * cuda_core_us / kernel_us, 1),
            "saving_basis": saving_basis,
            "top_eligible_kernels": [
                {"name": row["name"], "calls": row["calls"], "device_us": r(row["device_us"], 0)}
                for row in top.iter_rows(named=True)
            ],
            "steps": step_range(steps["step"]),
            "chart": chart(
                "bar",
                "Kernel time by kind",
                "kind",
                "GPU time (ms)",
                [unit[:-1], f"eligible, not on {unit}", "other"],
                {
                    "GPU time (ms)": [
                        round(us / 1000.0, 3)
                        for us in (tc_us, eligible_us, max(kernel_us - tc_us - eligible_us, 0.0))
                    ]
                },
                highlight_x=[f"eligible, not on {unit}"],
            ),
        }
        return [
            Finding(
                rule=self.id,
                severity=self.severity,
                title=(
                    f"{pct(eligible_pct)} of GPU time is {unit[:-1].replace(' ', '-')}-eligible "
                    "work run without them"
                ),
                evidence=evidence,
                recommendation=(
                    f"On this {where} GPU only {pct(tc_pct)} of kernel time used {unit} "
                    f"while matmul/convolution work took {pct(eligible_pct)}. Train with "
                    f"autocast in {advice.precision}."
                ),
                fix=Fix(code=fix_code(advice), config_patch=patch),
                estimated_saving_pct=saving_pct,
            )
        ]

    @staticmethod
    def _saving(
        cuda_core_us: float, kernel_us: float, steps: pl.DataFrame, t: Thresholds
    ) -> tuple[float | None, str]:
        """(1 - measured bf16/fp32 step ratio) x the share of step time in CUDA-core GEMMs.

        The ratio is a whole-step figure from a GEMM-bound model (GEMMs took 86 % of its
        fp32 kernel time), so it is applied to the CUDA-core GEMM share only: a model where
        they take a third of the step saves a third as much. Without steps the share is of
        kernel time."""
        if cuda_core_us <= 0:
            return None, "no CUDA-core GEMM kernels: no measured basis for a saving"
        step_us = float(steps["dur_us"].sum()) if steps.height else 0.0
        basis_us, of = (step_us, "step time") if step_us > 0 else (kernel_us, "kernel time")
        share = min(cuda_core_us / basis_us, 1.0)
        saving = 100.0 * (1.0 - t.tensor_core_bf16_step_ratio) * share
        return r(saving, 1), (
            f"{pct(100 * share)} of {of} in CUDA-core GEMMs x (1 - "
            f"{t.tensor_core_bf16_step_ratio}) measured bf16/fp32 step ratio"
        )

    examples: ClassVar = (
        Example(
            "trace: A100, 60% of kernel time in fp32 sgemm",
            True,
            lambda: _one_gemm("ampere_sgemm_128x64_tn"),
        ),
        Example(
            "trace: H100 bf16 nvjet GEMMs on Tensor Cores",
            False,
            lambda: _one_gemm(
                "nvjet_tst_128x128_64x4_1x2_h_bz_coopA_NNT", fp16=True, compute_capability=(9, 0)
            ),
        ),
        Example(
            "trace: H200 fp32 GEMMs on CUDA cores under xmma/cutlass names (ffma, simt)",
            True,
            lambda: ex.inputs(
                trace=ex.trace(
                    compute_capability=(9, 0),
                    kernels=[
                        ex.kernel(
                            "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_"
                            "stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas",
                            108,
                            165_000.0,
                        ),
                        ex.kernel(
                            "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn"
                            "_align1>(cutlass_80_simt_sgemm_256x128_8x4_nn_align1::Params)",
                            90,
                            116_000.0,
                        ),
                        ex.kernel("vectorized_elementwise_kernel", 400, 40_000.0),
                    ],
                )
            ),
        ),
        Example(
            "trace: A100 fp32 model on TF32 Tensor Cores (cutlass tensorop_s1688gemm)",
            False,
            lambda: _one_gemm(
                "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1>"
                "(cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1::Params)"
            ),
        ),
        Example(
            "trace: MI300X bf16 hipBLASLt GEMMs and AOTriton attention on Matrix Cores",
            False,
            lambda: _on_mi300x(
                _one_gemm(
                    "Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1_SN_"
                    "LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_"
                    "GRVWA8_GRVWB8_GSUAMB_GLS0_ISA942_IU1_K1"
                )
            ),
        ),
        Example(
            "trace: Pascal (6.0) GPU has no Tensor Cores",
            False,
            lambda: ex.inputs(
                trace=ex.trace(
                    compute_capability=(6, 0),
                    kernels=[ex.kernel("maxwell_sgemm_128x64_tn", 100, 6000.0)],
                )
            ),
        ),
    )


def _on_mi300x(inputs: AnalysisInputs) -> AnalysisInputs:
    """The same inputs on an AMD MI300X: deviceProperties as ROCm's Kineto writes them
    (tracelens_mi300x_qwen1.5-0.5b_infer_profmem.json.gz; HIP echoes gfx942 as 9.4)."""
    assert inputs.trace is not None
    props = {"id": 0, "name": "AMD Instinct MI300X VF", "computeMajor": 9, "computeMinor": 4}
    return replace(inputs, trace=replace(inputs.trace, device_properties=(props,)))


def _one_gemm(name: str, *, fp16: bool = False, **trace: Any) -> Any:
    """Inputs whose kernels are one GEMM family (6 ms) beside elementwise work (4 ms): the
    examples differ in the GEMM's name, which decides Tensor Core or CUDA core."""
    return ex.inputs(
        trace=ex.trace(
            kernels=[
                ex.kernel(name, 100, 6000.0, fp16=fp16),
                ex.kernel("vectorized_elementwise_kernel", 400, 4000.0),
            ],
            **trace,
        )
    )
