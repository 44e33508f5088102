"""Device identity: vendor, architecture and model from what a trace carries."""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

import pytest

from diagnostics.facts.device import UNKNOWN_DEVICE, identify_device

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"


@cache
def _top_level(name: str) -> dict:
    with gzip.open(TRACES / name, "rt") as handle:
        doc = json.load(handle)
    return {k: v for k, v in doc.items() if k != "traceEvents"}


# file -> (vendor, architecture, generation, model, compute capability); read from each
# file's deviceProperties name and computeMajor/Minor (and, for AMD, AMD's table of
# Instinct models: MI300X is gfx942, CDNA 3; HIP echoes gfx942 as 9.4)
EXPECTED = {
    "tracelens_mi300x_qwen1.5-0.5b_infer_profmem.json.gz": (
        "amd",
        "gfx942",
        "CDNA 3",
        "MI300X",
        None,
    ),
    "tracelens_mi300x_resnet_ddp_actckpt_rank0_of_8.json.gz": (
        "amd",
        "gfx942",
        "CDNA 3",
        "MI300X",
        None,
    ),
    "tracelens_b200_vllm_moe_mxfp4_rank0_of_8.json.gz": (
        "nvidia",
        "sm_100",
        "Blackwell",
        "B200",
        "10.0",
    ),
    "tracelens_h100_qwen1.5-0.5b_infer_profmem.json.gz": (
        "nvidia",
        "sm_90",
        "Hopper",
        "H100",
        "9.0",
    ),
    "hta_a100_rank0_of_16.json.gz": ("nvidia", "sm_80", "Ampere", "A100", "8.0"),
    "kineto_resnet50_num_workers_0.pt.trace.json.gz": ("nvidia", "sm_70", "Volta", "V100", "7.0"),
}


@pytest.mark.parametrize("name", EXPECTED)
def test_identity_from_device_properties(name):
    top = _top_level(name)
    identity = identify_device(top["deviceProperties"], top)
    got = (
        identity.vendor,
        identity.architecture,
        identity.generation,
        identity.model,
        identity.compute_capability,
    )
    assert got == EXPECTED[name]
    assert identity.source == "deviceProperties"


def test_amd_speaks_of_matrix_cores_nvidia_of_tensor_cores():
    mi300 = _top_level("tracelens_mi300x_qwen1.5-0.5b_infer_profmem.json.gz")
    h100 = _top_level("tracelens_h100_qwen1.5-0.5b_infer_profmem.json.gz")
    amd = identify_device(mi300["deviceProperties"], mi300)
    assert amd.matrix_unit == "Matrix Cores"
    assert amd.describe() == "AMD MI300X (gfx942, CDNA 3)"
    assert identify_device(h100["deviceProperties"], h100).matrix_unit == "Tensor Cores"


def test_rocm_runtime_fields_alone_say_amd():
    """The MI300X trace's own top-level ROCm fields, without deviceProperties."""
    top = _top_level("tracelens_mi300x_qwen1.5-0.5b_infer_profmem.json.gz")
    runtime = {k: top[k] for k in ("roctracer_version", "hip_runtime_version")}
    identity = identify_device((), runtime)
    assert (identity.vendor, identity.architecture, identity.source) == (
        "amd",
        None,
        "runtime versions",
    )


def test_kernel_names_give_the_architecture_when_nothing_else_does():
    # Tensile writes its target (ISA942) into every hipBLASLt kernel name (MI300X Qwen)
    tensile = "Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1_SN_ISA942_IU1"
    amd = identify_device((), {"hip_runtime_version": 60443483}, [tensile])
    assert (amd.vendor, amd.architecture, amd.generation) == ("amd", "gfx942", "CDNA 3")
    # sm80 kernels run on an H100 too: the newest one seen is a lower bound, said as such
    nvidia = identify_device(
        (),
        {},
        [
            "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_ffma_cublas",
            "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT",
        ],
    )
    assert (nvidia.vendor, nvidia.architecture) == ("nvidia", "sm_90")
    assert nvidia.compute_capability is None
    assert nvidia.source.startswith("kernel names")


def test_nothing_known_is_all_null():
    assert identify_device((), {}, ["vectorized_elementwise_kernel"]) == UNKNOWN_DEVICE
