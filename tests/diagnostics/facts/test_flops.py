"""The FLOP and byte formulas (docs/ROOFLINE.md) on hand-written operator arguments, in the
form Kineto records them (Input Dims, Input type, Concrete Inputs); expected values worked
out by hand beside each case. Argument orders are PyTorch's native_functions.yaml; the real
names and argument lists are those of the shared traces (H100 Qwen: aten::addmm, aten::
_flash_attention_forward; A100 AlexNet: aten::convolution; the H200 run m512l4b256:
aten::_scaled_dot_product_cudnn_attention_backward)."""

from __future__ import annotations

import pytest

from diagnostics.facts.device import UNKNOWN_DEVICE, DeviceIdentity
from diagnostics.facts.flops import op_cost
from diagnostics.facts.peaks import PEAKS, device_peak

BF16 = "c10::BFloat16"


def test_addmm_counts_the_bias_and_reads_it_as_one_row():
    # Qwen's q_proj: bias [1024], x [8944, 1024], W^T [1024, 1024], alpha and beta scalars
    cost = op_cost(
        "aten::addmm",
        [[1024], [8944, 1024], [1024, 1024], [], []],
        [BF16, BF16, BF16, "Scalar", "Scalar"],
        ["", "", "", "1", "1"],
    )
    assert cost.flops == 2 * 8944 * 1024 * 1024 + 8944 * 1024
    assert cost.bytes == 2 * (8944 * 1024 + 1024 * 1024 + 8944 * 1024 + 1024)
    assert (cost.kind, cost.precision) == ("gemm", "bf16")


def test_linear_and_matmul_fold_leading_dimensions_into_rows():
    # x [16, 559, 1024] @ W [2816, 1024]^T: M = 16 * 559 = 8944
    linear = op_cost("aten::linear", [[16, 559, 1024], [2816, 1024], []], [BF16, BF16, ""], [])
    assert linear.flops == 2 * 8944 * 2816 * 1024
    assert linear.shape == "M=8944 N=2816 K=1024"
    batched = op_cost("aten::matmul", [[4, 8, 32, 64], [4, 8, 64, 16]], [BF16, BF16], [])
    assert batched.flops == 4 * 8 * 2 * 32 * 16 * 64
    assert op_cost("aten::bmm", [[3, 5, 7], [3, 7, 11]], ["float", "float"], []).bytes == (
        3 * (5 * 7 + 7 * 11 + 5 * 11) * 4
    )


def test_mismatched_inner_dimensions_give_no_cost():
    assert op_cost("aten::mm", [[8, 4], [5, 3]], [BF16, BF16], []) is None


def test_convolution_takes_stride_padding_dilation_and_groups_from_concrete_inputs():
    # ResNet's stem: x [32, 3, 224, 224], w [64, 3, 7, 7], stride 2, padding 3:
    # out 64 x 112 x 112 (floor((224 + 6 - 6 - 1) / 2) + 1 = 112), 2 * 3 * 49 FLOPs each
    stem = op_cost(
        "aten::convolution",
        [[32, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []],
        ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "", "Scalar"],
        ["", "", "", "[2, 2]", "[3, 3]", "[1, 1]", "False", "[0, 0]", "1"],
    )
    assert stem.flops == 32 * 64 * 112 * 112 * 2 * 3 * 7 * 7
    assert stem.bytes == 4 * (32 * 3 * 224 * 224 + 64 * 3 * 7 * 7 + 32 * 64 * 112 * 112)
    # depthwise, 32 groups: the weight's second dimension is already C_in / groups = 1;
    # dilation 2 on a 3x3 kernel spans 5: out = 56 + 2*2 - 4 - 1 + 1 = 56; a bias [32]
    depthwise = op_cost(
        "aten::_convolution",
        [[8, 32, 56, 56], [32, 1, 3, 3], [32], [], [], [], [], [], []],
        ["float", "float", "float", "", "", "", "", "", ""],
        ["", "", "", "[1, 1]", "[2, 2]", "[2, 2]", "False", "[0, 0]", "32"],
    )
    out = 8 * 32 * 56 * 56
    assert depthwise.flops == out * 2 * 9 + out


def test_convolution_backward_costs_two_forward_convolutions():
    args = [[32, 64, 56, 56], [32, 64, 56, 56], [64, 64, 3, 3], [], [], [], [], [], [], [], []]
    concrete = ["", "", "", "[0]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    forward = 32 * 64 * 56 * 56 * 2 * 64 * 9
    both = op_cost(
        "aten::convolution_backward", args, [BF16] * 3, [*concrete, "[True, True, False]"]
    )
    assert both.flops == 2 * forward and both.backward
    weight_only = op_cost(
        "aten::convolution_backward", args, [BF16] * 3, [*concrete, "[False, True, False]"]
    )
    assert weight_only.flops == forward


def test_flash_attention_reads_its_layout_and_halves_causal_work():
    # _flash_attention_forward takes q/k/v as [B, N, H, d] (Qwen on the H100: 16, 559, 16, 64)
    qkv = [[16, 559, 16, 64]] * 3
    concrete = ["", "", "", "", "", "559", "559", "0.", "True", "False", "0.125"]
    causal = op_cost(
        "aten::_flash_attention_forward",
        [*qkv, [], [], [], [], [], [], [], []],
        [BF16] * 3,
        concrete,
    )
    full_work = 16 * 16 * 559 * 559 * 2 * (64 + 64)  # QK^T and PV
    assert causal.flops == full_work // 2
    assert causal.bytes == 2 * 4 * 16 * 559 * 16 * 64  # q, k, v read, out written
    # the SDPA front end takes [B, H, N, d]; is_causal False
    sdpa = op_cost(
        "aten::scaled_dot_product_attention",
        [[16, 16, 559, 64]] * 3 + [[], [], [], [], []],
        [BF16] * 3 + ["", "Scalar", "Scalar", "Scalar", "Scalar"],
        ["", "", "", "", "0.", "False", "0.125", "False"],
    )
    assert sdpa.flops == full_work


def test_attention_backward_is_five_matmuls_and_grouped_query_heads_read_fewer_bytes():
    # cudnn backward: grad_out, q, k, v, out, ...; is_causal is argument 14
    q, kv = [2, 8, 128, 64], [2, 2, 128, 64]
    dims = [q, q, kv, kv, q] + [[]] * 11
    concrete = [""] * 14 + ["False", ""]
    cost = op_cost("aten::_scaled_dot_product_cudnn_attention_backward", dims, [BF16] * 5, concrete)
    pairs = 2 * 8 * 128 * 128
    assert cost.flops == 2 * pairs * (3 * 64 + 2 * 64)
    # q, k, v and dO read, dq, dk, dv written
    assert cost.bytes == 2 * (2 * (2 * 128 * 8 * 64 + 2 * 128 * 2 * 128) + 2 * 128 * 8 * 64)


def test_causal_flag_missing_or_unreadable_gives_no_cost():
    qkv = [[1, 4, 16, 8]] * 3
    assert op_cost("aten::_scaled_dot_product_flash_attention", qkv, [BF16] * 3, []) is None
    # never evaluated: a string that would run code is refused by ast.literal_eval
    hostile = ["", "", "", "0.", "__import__('os').system('true')"]
    assert op_cost("aten::_scaled_dot_product_flash_attention", qkv, [BF16] * 3, hostile) is None


def test_elementwise_broadcasts_and_a_scalar_operand_moves_no_bytes():
    mul = op_cost("aten::mul", [[16, 16, 559, 64], [1, 1, 559, 64]], [BF16, BF16], [])
    n = 16 * 16 * 559 * 64
    assert mul.flops == n
    assert mul.bytes == 2 * (n + n + 559 * 64)
    scaled = op_cost("aten::mul", [[1, 559, 64], []], ["float", "Scalar"], ["", "2"])
    assert scaled.bytes == 4 * 2 * 559 * 64
    silu = op_cost("aten::silu", [[16, 559, 2816]], [BF16], [""])
    assert (silu.flops, silu.bytes) == (16 * 559 * 2816, 2 * 2 * 16 * 559 * 2816)


def test_reductions_size_their_output_from_dim_or_leave_bytes_unknown():
    mean = op_cost(
        "aten::mean", [[16, 559, 1024], [], [], []], ["float", "", "", ""], ["", "[-1]", "True", ""]
    )
    assert (mean.flops, mean.bytes) == (16 * 559 * 1024, 4 * (16 * 559 * 1024 + 16 * 559))
    whole = op_cost("aten::sum", [[10, 10]], ["float"], [""])
    assert whole.bytes == 4 * (100 + 1)
    odd = op_cost("aten::sum", [[10, 10], []], ["float", ""], ["", "'not a dim'"])
    assert odd.flops == 100 and odd.bytes is None


def test_an_unknown_dtype_leaves_bytes_unknown_but_keeps_flops():
    cost = op_cost(
        "aten::mm", [[4, 4], [4, 4]], ["c10::Float4_e2m1fn_x2", "c10::Float4_e2m1fn_x2"], []
    )
    assert cost.flops == 2 * 4 * 4 * 4 and cost.bytes is None and cost.precision is None


def test_the_peak_table_is_keyed_by_the_device_name_and_knows_nothing_else():
    def named(name: str) -> DeviceIdentity:
        return DeviceIdentity("nvidia", None, None, None, name, None, "deviceProperties")

    assert device_peak(named("NVIDIA H100 80GB HBM3")).device == "H100 SXM"
    assert device_peak(named("NVIDIA H100 PCIe")).device == "H100 PCIe"
    assert device_peak(named("NVIDIA A100-SXM4-80GB")).hbm_tbps == 2.039
    assert device_peak(named("NVIDIA A100-SXM4-40GB")).hbm_tbps == 1.555
    assert device_peak(named("Tesla V100-SXM2-16GB")).bf16_tflops is None  # no bf16 units
    assert device_peak(named("NVIDIA H200")).hbm_tbps == 4.8
    assert device_peak(named("AMD Instinct MI300X VF")).bf16_tflops == 1307.4
    assert device_peak(named("NVIDIA L40S")) is None
    assert device_peak(UNKNOWN_DEVICE) is None
    assert all(p.source for p in PEAKS)


@pytest.mark.parametrize("name", ["aten::mm", "aten::conv2d", "aten::_flash_attention_forward"])
def test_arguments_of_the_wrong_form_give_no_cost_and_no_error(name):
    assert op_cost(name, [["a"], None], None, None) is None
    assert op_cost(name, None, None, None) is None


def test_gemm_calls_expose_their_dimensions_for_the_rules():
    # the misshapen-matmul rule reads M, N, K as numbers, not from the shape text
    cost = op_cost("aten::bmm", [[12, 128, 64], [12, 64, 50257]], [BF16, BF16], [])
    assert cost.gemm_dims == (12, 128, 50257, 64, False)
    assert op_cost("aten::silu", [[4]], [BF16], [""]).gemm_dims is None
