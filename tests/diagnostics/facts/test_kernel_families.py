"""The kernel-family table: every family's real example lands in it, and real names of each
vendor get the unit and precision their libraries document.

The hand-written names below were read from the traces named beside them
(../shared/traces, ../shared/gpu-runs); ``test_every_example_is_a_real_kernel`` checks the
table's own examples against the files they cite.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

import pytest

from diagnostics.facts.kernel_classes import classify, family_of, precision_of
from diagnostics.facts.kernel_families import FAMILIES, PRECISIONS, UNITS

SHARED = Path(__file__).resolve().parents[3].parent / "shared"


@pytest.mark.parametrize("family", FAMILIES, ids=[f.id for f in FAMILIES])
def test_each_example_classifies_as_its_own_family(family):
    row = classify([family.example]).row(0, named=True)
    assert row["family"] == (family.claimed_first_by or family.id)
    assert row["unit"] == family.unit
    assert row["precision"] == family.example_precision
    assert row["tensor_core"] is (family.unit == "matrix")


def test_table_is_well_formed():
    ids = [f.id for f in FAMILIES]
    assert len(ids) == len(set(ids))
    for family in FAMILIES:
        assert family.unit in UNITS
        assert family.vendor in ("nvidia", "amd", "any")
        assert family.precision is None or family.precision in PRECISIONS
        assert set(family.token_precision.values()) <= set(PRECISIONS)
        assert family.claimed_first_by is None or family.claimed_first_by in ids


@cache
def _kernel_names(source: str) -> frozenset[str]:
    path = SHARED / source
    files = sorted(path.rglob("*.pt.trace.json*")) if path.is_dir() else [path]
    names: set[str] = set()
    for file in files:
        opener = gzip.open if file.name.endswith(".gz") else open
        with opener(file, "rt") as handle:
            doc = json.load(handle)
        if not isinstance(doc, dict):
            continue
        names.update(
            e["name"]
            for e in doc.get("traceEvents", ())
            if str(e.get("cat", "")).lower() == "kernel" and "name" in e
        )
    return frozenset(names)


@pytest.mark.parametrize("family", FAMILIES, ids=[f.id for f in FAMILIES])
def test_every_example_is_a_real_kernel(family):
    """The example is a kernel of the fixture it cites (long mangled names are cut short:
    a real name begins with it)."""
    names = _kernel_names(family.source)
    assert any(name.startswith(family.example) for name in names), family.source


# name -> (family, unit, precision), each read from the trace in the comment above it
REAL_NAMES = {
    # AMD MI300X, tracelens_mi300x_resnet_ddp_actckpt (bf16 training): Tensile's older
    # glued type letters BBS = bf16 in, bf16 out, fp32 compute
    "Cijk_Ailk_Bljk_BBS_BH_MT64x64x64_MI16x16x16x1_SN_1LDSB0_APM1_ABV0_ACED0_AF0EM1_AF1EM1_"
    "AMAS3_ASE_ASGT_ASLT_ASM_ASAE01_ASCE01_ASEM1_AAC0_BL1_BS1_CLR0_DTLA0_DTLB0_DTVA0_DTVB0_"
    "ISA942_IU1_K1": ("hipblaslt-tensile", "matrix", "bf16"),
    # MI300X Qwen: an fp32 GEMM (type S, then B = UseBeta), still on MFMA (MI16x16x1)
    "Cijk_Ailk_Bljk_S_B_Bias_HA_S_SAV_UserArgs_MT16x16x128_MI16x16x1_SN_LDSB1_AFC1_AFEM1_"
    "ISA942_IU1_K1": ("hipblaslt-tensile", "matrix", "fp32"),
    # MI300X ResNet: MIOpen implicit GEMM (backward data), CK grouped convolution, MIOpen
    # layout transposes, RCCL
    "igemm_bwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x2x1_1x4x1x64_"
    "tb1x8x1x2_1x4x1x64_mh_gkgs": ("miopen-igemm-xdlops", "matrix", "bf16"),
    "_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3INS_"
    "28GridwiseGemm_xdl_cshuffle_v3INS_13tensor_layout4gemm8RowMajorENS6_11ColumnMajorES7_"
    "ttfttNS0_12element_wise11PassThroughESA_SA_": ("composable-kernel-xdl", "matrix", None),
    "batched_transpose_32x32_half": ("aten-copy-fill", "memory", "half"),
    "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)": ("nccl", "communication", None),
    # MI300X Qwen: AOTriton attention (no type in the name), a bf16 elementwise kernel
    "attn_fwd": ("aotriton-attention", "matrix", None),
    "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>"
    ", std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*"
    ", 3ul>)": ("aten-elementwise-reduce", "vector", "bf16"),
    # B200 vLLM: the MoE's second GEMM (bf16 out, MXFP4 weights x MXFP8 activations),
    # sliding-window FP8 attention, cuBLAS nvjet without the sm tag, symmetric-memory
    # all-reduce, an Inductor pointwise kernel
    "bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_"
    "TN_transOut_schedP2x1x2x3_biasM_bN_tmaOpt_clmp_dynBatch_sm100f": (
        "trtllm-bmm-mxfp4",
        "matrix",
        "mxfp4",
    ),
    "fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvSlidingOrChunkedCausalP16VarSeqQ128Kv128"
    "PersistentContext": ("fmha-sm100", "matrix", "fp8_e4m3"),
    "nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT": ("nvjet-bf16", "matrix", "bf16"),
    "void vllm::scaled_fp8_quant_kernel_strided<c10::BFloat16, c10::Float8_e4m3fn>"
    "(c10::Float8_e4m3fn*, c10::BFloat16 const*, float const*, int, long, long)": (
        "aten-elementwise-reduce",
        "vector",
        "bf16",
    ),
    "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": (
        "nccl",
        "communication",
        None,
    ),
    # A100 (hta_a100_rank0_of_16): an older Inductor name says neither unit nor type
    "triton__0d1d2d3d4d5d6d7d8d9d10d11d12d13d14": (None, None, None),
    # H200 fp32 run: cutlass fp32 memory-efficient attention: unit not told by the name
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, "
    "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)": (None, None, None),
    # V100 ResNet-50 (kineto_resnet50_num_workers_0): cuDNN's fp32 direct convolution engine
    "void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float "
    "const*, int, float const*, int, float*, kernel_grad_params, unsigned long long, int, "
    "unsigned long long, int, float, int, int, int)": ("cudnn-cublas-helpers", "vector", None),
    # H100 Qwen: cuBLAS bf16 xmma GEMM on Hopper
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
    "segment_k_off_kernel__5x_cublas": ("xmma", "matrix", "bf16"),
}


@pytest.mark.parametrize("name", REAL_NAMES, ids=lambda n: n[:40])
def test_real_names_of_every_vendor(name):
    family_id, unit, precision = REAL_NAMES[name]
    family = family_of(name)
    assert (family.id if family else None) == family_id
    assert (family.unit if family else None) == unit
    assert precision_of(name) == precision


def test_amd_matrix_core_gemms_count_as_tensor_core_work():
    """The MI300X Qwen trace's GEMMs (hipBLASLt) and attention (AOTriton) are on Matrix
    Cores: the kernel table's tensor_core flag, which tensor-cores-unused reads, is set."""
    names = [
        FAMILIES[[f.id for f in FAMILIES].index("hipblaslt-tensile")].example,
        "attn_fwd",
    ]
    assert classify(names)["tensor_core"].to_list() == [True, True]


def test_docs_list_every_family_with_its_example():
    kernels_md = (Path(__file__).resolve().parents[3] / "docs" / "KERNELS.md").read_text()
    for family in FAMILIES:
        assert f"`{family.id}`" in kernels_md, family.id
        assert family.example[:60].replace("|", "\\|") in kernels_md, family.id
