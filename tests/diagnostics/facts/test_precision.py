"""Precision facts: fp16 training on the dense path told from fp16 data, on tiny traces built
from real names, read through the project's loader and compute_facts.

Names: the TorchRec ones are from HTA's ``tests/data/trace_filter/sampled_rank-0.json.gz``
(rank 0 of a 128-rank TorchRec job, A100), kernel names shortened after their template
arguments; the fp16 training ones from ../shared/gpu-runs/h200-default/gpu-unstable (this
project's trainer, fp16 autocast without a GradScaler, H200). Expected counts are the events
written here, counted by hand.
"""

from __future__ import annotations

from typing import Any

from diagnostics.facts import compute_facts
from diagnostics.rules import examples as ex
from diagnostics.rules.unstable_gradients import RISK_TITLE, UnstableGradients
from diagnostics.thresholds import Thresholds
from tests.diagnostics.facts.trace_fixture import gpu, load_rows, op, runtime, step

FORWARD, BACKWARD = 1, 2  # host threads: the training loop and the autograd engine
HALF_LOOKUP = ["float", "c10::Half", "c10::Half", "c10::Half", "int", "long", "int"]

TORCHREC_FORWARD = "fbgemm::split_embedding_codegen_lookup_rowwise_adagrad_function"
TORCHREC_FORWARD_KERNEL = (
    "void split_embedding_codegen_forward_unweighted_kernel<c10::Half, c10::Half, float, "
    "false, long, 2ul, 32ul>(at::GenericPackedTensorAccessor<c10::Half, 1ul>)"
)
TORCHREC_BACKWARD_NODE = "torch::autograd::CppNode<SplitLookupFunction_rowwise_adagrad_Op>"
TORCHREC_BACKWARD_KERNEL = (
    "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1"
    "<c10::Half, float, c10::Half, 2ul, 32>(at::GenericPackedTensorAccessor<float, 2ul>)"
)
TF32_GEMM = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align1>(Params)"
NVJET_FORWARD = "nvjet_sm90_hsh_64x32_64x16_1x4_h_bz_bias_TNT"
NVJET_BACKWARD = "nvjet_sm90_hsh_64x32_64x16_1x4_h_bz_NTT"
EVALUATE = "autograd::engine::evaluate_function: "


def typed(event: dict[str, Any], *types: str) -> dict[str, Any]:
    """The op recorded with shapes: its "Input type" list."""
    return {**event, "args": {"Input type": list(types)}}


class Trace:
    """A one-step trace: ops on two host threads, each launching kernels by correlation."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = [step(1, 0.0, 10_000.0)]
        self.corr = 0
        self.gpu_ts = 100.0

    def op(self, name: str, ts: float, dur: float, tid: int, *types: str) -> None:
        event = op(name, ts, dur, tid=tid)
        self.rows.append(typed(event, *types) if types else event)

    def launch(self, kernel: str, ts: float, tid: int, dur: float = 50.0) -> None:
        self.corr += 1
        self.rows.append(runtime("cudaLaunchKernel", ts, 5.0, self.corr, tid=tid))
        self.rows.append(gpu(kernel, self.gpu_ts, dur, self.corr))
        self.gpu_ts += dur + 10.0

    def facts(self):
        loaded = load_rows(self.rows)
        return compute_facts(loaded.events, loaded.metadata)


def fp16_training(shapes: bool) -> Trace:
    """gpu-unstable's dense layer: linear -> addmm forward, AddmmBackward0 -> mm backward."""
    half = ("c10::Half", "c10::Half", "c10::Half") if shapes else ()
    trace = Trace()
    trace.op("aten::linear", 100.0, 400.0, FORWARD, *half)
    trace.op("aten::addmm", 110.0, 300.0, FORWARD, *half)
    trace.launch(NVJET_FORWARD, 120.0, FORWARD)
    trace.op(EVALUATE + "AddmmBackward0", 3000.0, 600.0, BACKWARD)
    trace.op("AddmmBackward0", 3010.0, 500.0, BACKWARD, *half[:1])
    trace.op("aten::mm", 3020.0, 300.0, BACKWARD, *half[:2])
    trace.launch(NVJET_BACKWARD, 3030.0, BACKWARD)
    return trace


def rule_findings(facts) -> list:
    return UnstableGradients().check(ex.inputs(trace=facts), Thresholds())


def test_torchrec_fp16_embedding_tables_are_data_not_training():
    trace = Trace()
    # forward: the fp16 table lookup, then the dense layer's TF32 GEMM (float inputs)
    trace.op(TORCHREC_FORWARD, 100.0, 500.0, FORWARD, *HALF_LOOKUP)
    trace.launch(TORCHREC_FORWARD_KERNEL, 110.0, FORWARD)
    trace.op("aten::mm", 1000.0, 200.0, FORWARD, "float", "float")
    trace.launch(TF32_GEMM, 1010.0, FORWARD)
    # backward: the table's backward with row-wise Adagrad in the kernel, the dense mm
    trace.op(EVALUATE + TORCHREC_BACKWARD_NODE, 3000.0, 610.0, BACKWARD)
    trace.op(TORCHREC_BACKWARD_NODE, 3003.0, 588.0, BACKWARD, "float")
    trace.launch(TORCHREC_BACKWARD_KERNEL, 3100.0, BACKWARD)
    trace.op(EVALUATE + "MmBackward0", 4000.0, 400.0, BACKWARD)
    trace.op("MmBackward0", 4005.0, 390.0, BACKWARD, "float")
    trace.op("aten::mm", 4010.0, 300.0, BACKWARD, "float", "float")
    trace.launch(TF32_GEMM, 4020.0, BACKWARD)
    facts = trace.facts()
    precision = facts.precision
    assert precision.fp16_embedding_kernels == 2  # the forward and backward table kernels
    assert precision.fp16_embedding_kernel_us == 100.0
    assert precision.fp16_dense_forward_ops == 0
    assert precision.fp16_dense_backward_ops == 0
    assert precision.fp16_dense_backward_kernels == 0
    assert precision.backward_ranges == 2  # two disjoint evaluate_function ranges
    assert not precision.fp16_dense_training
    assert rule_findings(facts) == []


def test_fp16_gemms_with_their_backward_are_training_from_shapes():
    facts = fp16_training(shapes=True).facts()
    precision = facts.precision
    assert precision.fp16_dense_forward_ops == 2  # aten::linear, aten::addmm
    assert precision.fp16_dense_backward_ops == 2  # AddmmBackward0, aten::mm inside it
    assert precision.fp16_dense_backward_kernels == 1  # nvjet hsh launched under backward
    assert precision.fp16_dense_backward_kernel_us == 50.0
    assert set(precision.top_fp16_dense_kernels) == {NVJET_FORWARD, NVJET_BACKWARD}
    assert precision.scaler_ops == 0
    (finding,) = rule_findings(facts)
    # a bare trace has no loss or gradient records: a risk, not observed instability
    assert finding.title == RISK_TITLE
    assert finding.severity.value == "medium"
    assert finding.evidence["instability_observed"] is False
    assert finding.fix.config_patch == {"train.grad_scaler": True}


def test_fp16_backward_kernels_count_without_shapes():
    precision = fp16_training(shapes=False).facts().precision
    assert (precision.fp16_dense_forward_ops, precision.fp16_dense_backward_ops) == (0, 0)
    assert precision.fp16_dense_backward_kernels == 1
    assert precision.fp16_dense_training


def test_fp16_gemms_in_the_forward_only_are_not_training():
    trace = Trace()
    trace.op("aten::addmm", 100.0, 300.0, FORWARD, "c10::Half", "c10::Half", "c10::Half")
    trace.launch(NVJET_FORWARD, 110.0, FORWARD)
    facts = trace.facts()
    assert facts.precision.fp16_dense_forward_ops == 1
    assert facts.precision.backward_ranges == 0
    assert not facts.precision.fp16_dense_training
    assert rule_findings(facts) == []


def test_grad_scaler_ops_silence_fp16_training():
    trace = fp16_training(shapes=True)
    trace.op("aten::_amp_foreach_non_finite_check_and_unscale_", 5000.0, 40.0, FORWARD)
    trace.op("aten::_amp_update_scale_", 5050.0, 20.0, FORWARD)
    facts = trace.facts()
    assert facts.precision.scaler_ops == 2
    assert rule_findings(facts) == []


def test_fp16_nccl_buffers_in_backward_are_not_training():
    # DDP's reducer all-reduces fp16-compressed gradients from inside the backward
    trace = Trace()
    trace.op(EVALUATE + "MmBackward0", 3000.0, 600.0, BACKWARD)
    trace.op("aten::mm", 3010.0, 300.0, BACKWARD, "float", "float")
    trace.launch(TF32_GEMM, 3020.0, BACKWARD)
    trace.launch("ncclDevKernel_AllReduce_Sum_f16_RING_LL(ncclDevComm*)", 3400.0, BACKWARD)
    facts = trace.facts()
    assert facts.precision.fp16_comm_kernels == 1
    assert facts.precision.fp16_dense_backward_kernels == 0
    assert rule_findings(facts) == []


def test_bf16_attention_named_f16_is_not_fp16_training():
    # H200 bf16 autocast: cuDNN's attention backward is named ..._wgmma_f16_... for bf16 too
    trace = Trace()
    trace.op(EVALUATE + "ScaledDotProductCudnnAttentionBackward0", 3000.0, 600.0, BACKWARD)
    trace.op("aten::_cudnn_attention_backward", 3010.0, 500.0, BACKWARD, "c10::BFloat16", "float")
    trace.launch(
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_"
        "1x4x1_cga1x1x1_kernel0_0",
        3020.0,
        BACKWARD,
    )
    facts = trace.facts()
    assert facts.precision.bf16_seen
    assert facts.precision.fp16_dense_backward_kernels == 0
    assert rule_findings(facts) == []
