"""Kernel families: what the GPU unit and the number format of a kernel are, as plain data.

One row per family of kernel names, read in order (the first family whose ``match`` and
``also`` both hit a name wins). ``facts/kernel_classes.py`` turns the table into polars
expressions; every rule and view reads a kernel's unit and precision from there, never from
name patterns of its own. Each row carries a real kernel name from ``../shared/traces`` or
``../shared/gpu-runs`` (``example``, from ``source``): tests walk the table and check that each
example lands in its own family with its unit and precision (docs/KERNELS.md lists them).

Units: ``matrix`` (NVIDIA Tensor Cores, AMD Matrix Cores: the MFMA/xdlops instructions),
``vector`` (CUDA cores, AMD SIMD lanes: elementwise, reductions, fp32 FFMA GEMMs),
``memory`` (copies, fills, layout transposes), ``communication`` (collectives).

Precision is the family's own when every kernel of it runs in one format; else decoded from
the name by ``precision_token`` (a regex whose first group is looked up in
``token_precision``); else the name-wide patterns of ``kernel_classes.PRECISION``
(``c10::BFloat16``, ``tf32``, ...); else null: the name does not say.

Precedence matters where names share words: the CUDA-core GEMMs (``ffma``, ``simt``,
``sgemm``, ``scudnn``) come before every matrix family, because ``sm80_xmma_gemm_f32f32_..._
ffma_...`` and ``cutlass_80_simt_sgemm_...`` carry ``xmma``/``cutlass`` yet run on CUDA cores;
the generic "low-precision GEMM" family comes after every named one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Unit = Literal["matrix", "vector", "memory", "communication"]
Vendor = Literal["nvidia", "amd", "any"]

UNITS: tuple[str, ...] = ("matrix", "vector", "memory", "communication")
# Every precision a kernel can be given; "half" is 16-bit with the format not named.
PRECISIONS: tuple[str, ...] = (
    "fp32",
    "tf32",
    "bf16",
    "fp16",
    "half",
    "fp8_e4m3",
    "fp8_e5m2",
    "mxfp4",
    "mxfp6",
    "int8",
)

# Tensile/hipBLASLt type letters (the problem type's A/B data type, then, for
# high-precision-accumulate GEMMs, the output and compute types: ``BBS`` = bf16 in, bf16
# out, fp32 compute; newer hipBLASLt writes them apart, ``B_BS``). From Tensile's
# DataType table (tensilelite/Tensile/Common/DataType.py): S float, H half, B bfloat16,
# X xfloat32, I8 int8, F8/B8 OCP fp8 e4m3/e5m2, F8N/B8N their gfx942 "fnuz" variants.
TENSILE_TYPE_PRECISION: dict[str, str] = {
    "S": "fp32",
    "SS": "fp32",
    "X": "tf32",
    "H": "fp16",
    "HH": "fp16",
    "HHS": "fp16",
    "HSS": "fp16",
    "B": "bf16",
    "BBS": "bf16",
    "BSS": "bf16",
    "I8": "int8",
    "I8II": "int8",
    "4xi8": "int8",
    "F8": "fp8_e4m3",
    "F8N": "fp8_e4m3",
    "B8": "fp8_e5m2",
    "B8N": "fp8_e5m2",
}
# MIOpen's implicit-GEMM assembly kernels name their type: igemm_fwd_gtcx3_nhwc_bf16_...
MIOPEN_TYPE_PRECISION: dict[str, str] = {
    "fp32": "fp32",
    "fp16": "fp16",
    "bf16": "bf16",
    "int8": "int8",
}


@dataclass(frozen=True)
class KernelFamily:
    id: str
    vendor: Vendor
    unit: Unit
    precision: str | None  # the family's one format, or None (decoded or not named)
    match: str  # regex, case-insensitive
    example: str  # a real kernel name of this family
    source: str  # the fixture it came from
    example_precision: str | None  # what the example's precision resolves to
    also: str | None = None  # a second regex the name must match too
    precision_token: str | None = None  # regex whose group 1 names the format
    token_precision: dict[str, str] = field(default_factory=dict)
    note: str = ""
    # a named family that takes this example first: the family stands for names no named
    # family matches, and no fixture holds one (its example shows what it matches)
    claimed_first_by: str | None = None


_H200 = "gpu-runs/h200-sized"
_MI300_QWEN = "traces/tracelens_mi300x_qwen1.5-0.5b_infer_profmem.json.gz"
_MI300_RESNET = "traces/tracelens_mi300x_resnet_ddp_actckpt_rank0_of_8.json.gz"
_B200 = "traces/tracelens_b200_vllm_moe_mxfp4_rank0_of_8.json.gz"
_H100_QWEN = "traces/tracelens_h100_qwen1.5-0.5b_infer_profmem.json.gz"
_V100_RESNET = "traces/kineto_resnet50_num_workers_0.pt.trace.json.gz"
_A100_16 = "traces/hta_a100_rank0_of_16.json.gz"
_A100_DDP = "traces/hta_a100_ddp_resnet_rank0_of_2_nccl.json.gz"

# Kernel names of matrix-multiply / convolution / attention work (the generic family's
# ``match``). Narrow on purpose: "mma" alone is in "GammaBeta...", "conv" in "convert_...".
MATMUL_WORDS = (
    r"gemm|xmma|cutlass|cublas|nvjet|_mma|convolution|convolve|conv2d|conv3d|fprop|dgrad|"
    r"wgrad|implicit|winograd|sdpa|fmha|flash_"
)

FAMILIES: tuple[KernelFamily, ...] = (
    # -- communication -------------------------------------------------------------------
    KernelFamily(
        "nccl",
        "any",
        "communication",
        None,
        r"nccl",
        "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
        _MI300_RESNET,
        None,
        note="NCCL collectives; RCCL on ROCm keeps the names (ncclDevKernel_Generic on MI300X)",
    ),
    KernelFamily(
        "symm-mem-all-reduce",
        "nvidia",
        "communication",
        "bf16",
        r"multimem_all_reduce|one_shot_all_reduce|two_shot_all_reduce",
        "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>"
        "(c10::BFloat16*, unsigned long, unsigned int**, unsigned long, unsigned long)",
        _B200,
        "bf16",
        note="PyTorch symmetric-memory all-reduce (NVLink multimem): no nccl in the name",
    ),
    # -- NVIDIA CUDA-core GEMMs and convolutions: before every matrix family ----------------
    KernelFamily(
        "cublas-ffma",
        "nvidia",
        "vector",
        "fp32",
        r"ffma",
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_"
        "aligna4_alignc4_execute_kernel__5x_cublas",
        f"{_H200}/m768l6b256-fp32",
        "fp32",
        note="fused fp32 multiply-add: CUDA cores although the name says xmma",
    ),
    KernelFamily(
        "cutlass-simt",
        "nvidia",
        "vector",
        "fp32",
        r"simt",
        "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>"
        "(cutlass_80_simt_sgemm_256x128_8x4_nn_align1::Params)",
        f"{_H200}/m768l6b256-fp32",
        "fp32",
        note="CUTLASS's CUDA-core op class",
    ),
    KernelFamily(
        "sgemm",
        "nvidia",
        "vector",
        "fp32",
        r"sgemm",
        "volta_sgemm_128x32_nt",
        _V100_RESNET,
        "fp32",
        note="single-precision GEMM and cuDNN's implicit_convolve_sgemm on CUDA cores",
    ),
    KernelFamily(
        "cudnn-scudnn",
        "nvidia",
        "vector",
        "fp32",
        r"scudnn",
        "volta_scudnn_128x128_stridedB_splitK_small_nn_v1",
        _V100_RESNET,
        "fp32",
        note="cuDNN's single-precision convolution kernels",
    ),
    # -- NVIDIA matrix (Tensor Core) families ----------------------------------------------
    KernelFamily(
        "trtllm-bmm-mxfp4",
        "nvidia",
        "matrix",
        "mxfp4",
        r"^bmm_\w*MxE2m1",
        "bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_"
        "rM_TN_transOut_schedP2x1x2x3_biasM_bN_tma_tmaOpt_clmp_swiGlu_dynBatch_sm100f",
        _B200,
        "mxfp4",
        note="TensorRT-LLM/FlashInfer block-scaled batched GEMM on Blackwell tcgen05: MXFP4 "
        "(E2M1) weights times MXFP8 activations; the first type is the output's",
    ),
    KernelFamily(
        "fmha-sm100",
        "nvidia",
        "matrix",
        None,
        r"fmhaSm1\d\d",
        "fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext",
        _B200,
        "fp8_e4m3",
        precision_token=r"Qkv(E4m3|E5m2|Bfloat16|Fp16)",
        token_precision={
            "E4m3": "fp8_e4m3",
            "E5m2": "fp8_e5m2",
            "Bfloat16": "bf16",
            "Fp16": "fp16",
        },
        note="TensorRT-LLM's Blackwell attention: Q/K/V in the format after Qkv",
    ),
    KernelFamily(
        "nvjet-bf16",
        "nvidia",
        "matrix",
        "bf16",
        r"nvjet_\w*tst_",
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT",
        f"{_H200}/m768l6b256-slow",
        "bf16",
        note="cuBLAS's nvjet GEMMs (Hopper, Blackwell); tst = bf16 in and out",
    ),
    KernelFamily(
        "nvjet",
        "nvidia",
        "matrix",
        None,
        r"nvjet",
        "nvjet_sm90_hsh_64x32_64x16_1x4_h_bz_NTT",
        "gpu-runs/h200-default/gpu-unstable",
        "fp16",
        note="other nvjet GEMMs: hsh/hss/hhh = fp16 (kernel_classes' name-wide patterns)",
    ),
    KernelFamily(
        "xmma",
        "nvidia",
        "matrix",
        None,
        r"xmma",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
        "execute_segment_k_off_kernel__5x_cublas",
        _H100_QWEN,
        "bf16",
        note="cuBLAS/cuDNN xmma kernels; the types follow the tile (bf16bf16, tf32f32)",
    ),
    KernelFamily(
        "mma-instruction",
        "nvidia",
        "matrix",
        None,
        r"hmma|wmma|imma|gmma|tcgen05",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_"
        "cga1x1x1_kernel0_0",
        f"{_H200}/m768l6b256-slow",
        "half",
        note="the MMA instructions: Volta-Ampere hmma/imma, WMMA, Hopper wgmma, Blackwell "
        "tcgen05; cuDNN's attention says f16 for bf16 too (precision half)",
    ),
    KernelFamily(
        "tensor-op-tiles",
        "nvidia",
        "matrix",
        None,
        r"tensorop|h884|s884|i884|884gemm|h1688|s1688|c1688|1688gemm|i8816|16816|161616|"
        r"sm90_|cutlass3x|dgrad_1x1_stride_2x2|first_layer_wgrad_kernel|conv1x1|conv2d_c1_k1|"
        r"direct_group",
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1>"
        "(cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1::Params)",
        _A100_16,
        "tf32",
        note="CUTLASS tensor-op class, the Volta/Turing/Ampere MMA tile shapes, Hopper sm90_ "
        "and cutlass3x kernels, torch-tb-profiler's cuDNN Tensor Core names; s1688 with "
        "fp32 operands runs as TF32",
    ),
    KernelFamily(
        "flash-attention",
        "nvidia",
        "matrix",
        None,
        r"pytorch_flash::|flash_fwd|flash_bwd",
        "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, "
        "128, 4, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, "
        "128, 128, 4, cutlass::bfloat16_t> >, false, true, false, false, false, true, false>"
        "(pytorch_flash::Flash_fwd_params)",
        _H100_QWEN,
        "bf16",
        note="FlashAttention-2 (PyTorch's SDPA flash backend): mma.sync in fp16/bf16 only",
    ),
    # -- AMD matrix (MFMA) families ---------------------------------------------------------
    KernelFamily(
        "hipblaslt-tensile",
        "amd",
        "matrix",
        None,
        r"^Cijk_",
        "Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1_SN_LDSB1_AFC1_"
        "AFEM1_AFEM1_ASEM1_CLR1_CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMB_GLS0_"
        "ISA942_IU1_K1_LBSPPA1024_LBSPPB512_LBSPPM0_LPA16_LPB16_LPM0_LRVW8_LWPMn1_MIAV0_"
        "MIWT8_4_MO40_NTn1_NTA0_NTB0_NTC0_NTD0_NTM0_NEPBS16_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_"
        "SIA3_SS1_SPO0_SRVW0_SSO0_SVW8_SK0_SKXCCM0_TLDS1_ULSGRO0_USL1_UIOFGRO0_USFGROn1_VSn1_"
        "VWA8_VWB4_WSGRA0_WSGRB0_WS64_WG32_8_1",
        _MI300_QWEN,
        "bf16",
        also=r"_MI\d",
        precision_token=r"^Cijk_A[A-Za-z]+_B[A-Za-z]+_([0-9A-Za-z]+?)_",
        token_precision=TENSILE_TYPE_PRECISION,
        note="hipBLASLt/rocBLAS Tensile GEMMs; _MI<m>x<n>x<k> is the MFMA instruction tile, "
        "ISA942 the target; the type letters after the index names give the format",
    ),
    KernelFamily(
        "composable-kernel-xdl",
        "amd",
        "matrix",
        None,
        r"^_ZN2ck|\bck::|device_gemm",
        "_ZN2ck16tensor_operation6device37kernel_batched_gemm_xdlops_bwd_weightINS_47GridwiseGemm_"
        "bk0mk1_bk0nk1_mn_xdlops_bwd_weightILi64EttftLNS_25InMemoryDataOperationEnumE1E",
        _MI300_RESNET,
        None,
        also=r"xdl|mfma|wmma",
        note="Composable Kernel's xdlops (MFMA) GEMMs and convolutions; its types are mangled "
        "template arguments (t = unsigned short, bf16 or fp16): the format is not read",
    ),
    KernelFamily(
        "miopen-igemm-xdlops",
        "amd",
        "matrix",
        None,
        r"^igemm_(?:fwd|bwd|wrw)_gtcx",
        "igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x2x1_"
        "1x4x1x64_tb1x8x2x1_1x4x1x64_gkgs",
        _MI300_RESNET,
        "bf16",
        precision_token=r"_(fp32|fp16|bf16|int8)_",
        token_precision=MIOPEN_TYPE_PRECISION,
        note="MIOpen's implicit-GEMM convolutions on xdlops (gtcx)",
    ),
    KernelFamily(
        "aotriton-attention",
        "amd",
        "matrix",
        None,
        r"^attn_(?:fwd|bwd)",
        "attn_fwd",
        _MI300_QWEN,
        None,
        note="AOTriton flash attention (PyTorch's SDPA on ROCm): Triton dot on MFMA; the name "
        "carries no type",
    ),
    # -- Triton (either vendor) -------------------------------------------------------------
    KernelFamily(
        "triton-pointwise-reduction",
        "any",
        "vector",
        None,
        r"^triton_(?:poi|red|per)_",
        "triton_poi_fused_add_bitwise_and_bitwise_not_bitwise_or_ge_lt_mul_sub_0",
        _B200,
        None,
        note="Inductor pointwise/reduction kernels; a matmul template (triton_tem_..._mm) or "
        "an older triton__0d1d... name tells neither unit nor type: left unknown",
    ),
    # -- the generic low-precision GEMM: after every named family ---------------------------
    KernelFamily(
        "low-precision-gemm",
        "nvidia",
        "matrix",
        None,
        MATMUL_WORDS,
        "void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688dgrad_optimized_tf32_64x128_"
        "32x3_nhwc_align4>(cutlass_tensorop_s1688dgrad_optimized_tf32_64x128_32x3_nhwc_align4"
        "::Params)",
        _A100_DDP,
        "tf32",
        also=r"bf16|f16|tf32|i8",
        note="a GEMM/convolution/attention name carrying bf16, f16, tf32 or i8 that no named "
        "family knows (rule 3 of kernel_classes)",
        claimed_first_by="tensor-op-tiles",
    ),
    # -- vector and memory work --------------------------------------------------------------
    KernelFamily(
        "aten-copy-fill",
        "any",
        "memory",
        None,
        r"copy_kernel|CatArrayBatchedCopy|FillFunctor|fill_kernel|index_elementwise_kernel|"
        r"indexSelect|vectorized_gather|_copy_page_indices|reshape_and_cache|"
        r"batched_transpose_|^transpose_|SubTensorOp|nchwToNhwc|nhwcToNchw",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous "
        "namespace)::OpaqueType<2u>, unsigned int, 4, 64, 64>",
        _MI300_QWEN,
        None,
        note="copies, concatenation, fills, gathers and layout transposes (PyTorch, cuDNN, "
        "MIOpen, vLLM's KV-cache writes): memory-bound data movement",
    ),
    KernelFamily(
        "aten-elementwise-reduce",
        "any",
        "vector",
        None,
        r"elementwise_kernel|reduce_kernel|at::native::|vllm::|moe::dev::|"
        r"tensorrt_llm::kernels::",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add"
        "<float>, std::array<char*, 2ul> >(int, at::native::CUDAFunctorOnSelf_add<float>, "
        "std::array<char*, 2ul>)",
        _MI300_QWEN,
        None,
        note="PyTorch's elementwise, reduction, normalisation and pooling kernels, "
        "vLLM/TensorRT-LLM helpers (norms, rotary, MoE routing, quantisation): CUDA cores / "
        "SIMD lanes; the format from the template types where named",
    ),
    KernelFamily(
        "cudnn-cublas-helpers",
        "nvidia",
        "vector",
        None,
        r"cudnn::|cask_cudnn|wgrad_alg0_engine|dgrad_engine|epilogue::impl|splitKreduce|"
        r"fft2d_|cudnn_train::reduction|cutlass_cudnn_\w*reduction",
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, 512, true, 1>(cudnnTensorStruct, "
        "float const*, cudnnTensorStruct, float*, float const*, float const*, float, float, "
        "float*, float*, float*, float*, float, float)",
        _V100_RESNET,
        None,
        note="cuDNN batch norm, winograd transforms, direct fp32 convolution engines "
        "(wgrad_alg0_engine, dgrad_engine), offset helpers; cuBLASLt epilogues and split-K "
        "reductions: CUDA cores",
    ),
    KernelFamily(
        "optimizer-multi-tensor",
        "any",
        "vector",
        None,
        r"multi_tensor_apply_kernel",
        "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float, "
        "float, float, float, float, float, float, float, adamMode_t, float, int, int, int>",
        _A100_16,
        None,
        note="fused optimizer steps (apex/PyTorch foreach)",
    ),
    KernelFamily(
        "cub-sort-scan",
        "any",
        "vector",
        None,
        r"cub::",
        "void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, int, "
        "int>::Policy800, false, long, int, int, int>",
        _A100_16,
        None,
        note="CUB radix sorts, scans and reductions (behind torch.sort, unique, embedding bags)",
    ),
    KernelFamily(
        "fbgemm-embedding",
        "nvidia",
        "memory",
        None,
        r"split_embedding_|fbgemm_gpu::|permute_pooled_embs|bounds_check_indices|"
        r"linearize_index|recat_copy",
        "void split_embedding_codegen_forward_unweighted_kernel<float, float, float, long, 2ul>",
        "traces/hta_a100_rank3_of_8.json.gz",
        None,
        note="FBGEMM's embedding-table lookups and their index permutations: gathers",
    ),
)

FAMILY_BY_ID: dict[str, KernelFamily] = {f.id: f for f in FAMILIES}
