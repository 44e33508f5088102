"""Kernel name classes on real kernel names from ../shared/traces and ../shared/gpu-runs."""

from __future__ import annotations

import pytest

from diagnostics.facts.kernel_classes import (
    classify,
    is_cuda_core_gemm,
    is_tensor_core,
    precision_of,
)

# name -> (Tensor Core, CUDA-core GEMM, precision); where each was recorded in the comment
REAL_KERNELS = {
    # H200, m768l6b256-fp32 (train.amp=off): xmma and cutlass names, CUDA-core maths
    "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_"
    "aligna4_alignc4_execute_kernel__5x_cublas": (False, True, "fp32"),
    "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>"
    "(cutlass_80_simt_sgemm_256x128_8x4_nn_align1::Params)": (False, True, "fp32"),
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel"
    "<float, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)": (False, False, None),
    # H200, bf16 runs: cuBLAS nvjet (tst = bf16), cuDNN attention named f16 for bf16 inputs
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT": (True, False, "bf16"),
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_"
    "cga1x1x1_kernel0_0": (True, False, "half"),
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_"
    "align2>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align2::Params)": (
        True,
        False,
        "bf16",
    ),
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, "
    "at::native::func_wrapper_t<float>>>": (False, False, "bf16"),
    "void at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)": (False, False, "bf16"),
    # H200, gpu-unstable (fp16): nvjet hsh, c10::Half
    "nvjet_sm90_hsh_64x32_64x16_1x4_h_bz_NTT": (True, False, "fp16"),
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::Half>,"
    " at::detail::Array<char*, 3> >": (False, False, "fp16"),
    # A100 (HTA traces): TF32 on Tensor Cores, fp32 SGEMM on CUDA cores, NCCL
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1>"
    "(cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1::Params)": (True, False, "tf32"),
    "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16"
    "_stage4_warpsize2x2x1_g1_tensor16x8x8_alignc4_execute_kernel_cudnn": (True, False, "tf32"),
    "ampere_sgemm_32x32_sliced1x4_tn": (False, True, "fp32"),
    "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)": (
        False,
        False,
        None,
    ),
    # V100 (ResNet-50, torch-tb-profiler samples): fp32 cuDNN convolutions
    "volta_scudnn_128x128_stridedB_splitK_small_nn_v1": (False, True, "fp32"),
    "void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>"
    "(int, int, int, float const*, int, float*)": (False, True, "fp32"),
}


@pytest.mark.parametrize("name", sorted(REAL_KERNELS))
def test_real_kernel_names(name: str):
    tensor_core, cuda_core, precision = REAL_KERNELS[name]
    assert is_tensor_core(name) is tensor_core
    assert is_cuda_core_gemm(name) is cuda_core
    assert precision_of(name) == precision


def test_classify_is_the_same_as_the_single_name_functions():
    table = classify(sorted(REAL_KERNELS))
    for row in table.iter_rows(named=True):
        assert (row["tensor_core"], row["cuda_core_gemm"], row["precision"]) == REAL_KERNELS[
            row["name"]
        ]


def test_cuda_core_words_win_over_tensor_core_families():
    # ffma/simt/sgemm mean CUDA cores even inside an xmma, cutlass or sm90 name
    for name in (
        "sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_ffma_execute_kernel",
        "cutlass3x_sm90_simt_sgemm_f32_f32_f32_f32_f32_128x128x8_1x1x1_3_nnn_align1",
    ):
        assert not is_tensor_core(name) and is_cuda_core_gemm(name)


def test_formats_outside_matmul_names_are_not_tensor_cores():
    # a bf16 conversion or a LayerNorm backward is not a GEMM, whatever its format
    for name in (
        "void convert_fp32_to_bf16_kernel<256>(float const*, __nv_bfloat16*, long)",
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<c10::Half,"
        " float, 32u, 32u, 256u, false, true, false>",
        "void at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)",
    ):
        assert not is_tensor_core(name)
