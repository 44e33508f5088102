"""Which GPU a trace ran on: vendor, architecture and model, for NVIDIA and AMD alike.

Read, most trusted first, from Kineto's ``deviceProperties`` (the name: "NVIDIA H100 80GB
HBM3", "AMD Instinct MI300X VF"; computeMajor/Minor), from the top-level runtime versions
(ROCm traces carry ``roctracer_version``/``hip_runtime_version``, CUDA ones
``cuda_runtime_version``/``cupti_version``), and from kernel names when nothing else says
(Tensile's ``ISA942``, NVIDIA's ``sm90_``/``sm100``).

"Compute capability" is NVIDIA's: HIP fills computeMajor/Minor too (9.4 on an MI300X), but
there they only echo the gfx target (gfx942), so an AMD device gets its gfx architecture and
no compute capability.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# NVIDIA: compute capability -> architecture name (sm_XY). The model comes from the name.
NVIDIA_GENERATION: dict[tuple[int, int], str] = {
    (7, 0): "Volta",
    (7, 2): "Volta",
    (7, 5): "Turing",
    (8, 0): "Ampere",
    (8, 6): "Ampere",
    (8, 7): "Ampere",
    (8, 9): "Ada Lovelace",
    (9, 0): "Hopper",
    (10, 0): "Blackwell",
    (10, 3): "Blackwell",
    (12, 0): "Blackwell",
}
# AMD Instinct models -> gfx target and CDNA generation (AMD's ROCm hardware specs table).
AMD_MODELS: tuple[tuple[str, str, str], ...] = (
    ("MI355", "gfx950", "CDNA 4"),
    ("MI350", "gfx950", "CDNA 4"),
    ("MI325", "gfx942", "CDNA 3"),
    ("MI300", "gfx942", "CDNA 3"),
    ("MI250", "gfx90a", "CDNA 2"),
    ("MI210", "gfx90a", "CDNA 2"),
    ("MI100", "gfx908", "CDNA"),
)
# HIP's computeMajor/Minor for the gfx targets it echoes (gfx90a and gfx908 both say 9.0:
# not told apart without a name).
AMD_BY_CAPABILITY: dict[tuple[int, int], str] = {(9, 4): "gfx942", (9, 5): "gfx950"}
AMD_GENERATION: dict[str, str] = {gfx: gen for _, gfx, gen in AMD_MODELS}

_AMD_NAME = re.compile(r"(?i)\bAMD\b|Instinct|Radeon")
_NVIDIA_NAME = re.compile(r"(?i)NVIDIA|Tesla|Quadro|GeForce|\bRTX\b")
_AMD_MODEL = re.compile(r"(?i)\b(MI\d{3}[A-Z]?)\b")
_NVIDIA_MODEL = re.compile(r"\b(GB\d{3}|GH\d{3}|[ABHLTV]\d{1,3}[A-Z]?|RTX \w+)\b")
_GFX = re.compile(r"(?i)\b(gfx9[0-9a-f]{2})\b")
_TENSILE_ISA = re.compile(r"_ISA(9[0-9a-f]{2})_")
_SM_KERNEL = re.compile(r"(?i)(?:^|_)sm_?(\d{2,3})[a-z]?(?:_|$)")
_AMD_RUNTIME_KEYS = ("roctracer_version", "hip_runtime_version", "hip_driver_version")
_NVIDIA_RUNTIME_KEYS = ("cuda_runtime_version", "cupti_version", "cuda_driver_version")


@dataclass(frozen=True)
class DeviceIdentity:
    vendor: str | None  # "nvidia" | "amd"
    architecture: str | None  # "sm_90", "gfx942"
    generation: str | None  # "Hopper", "CDNA 3"
    model: str | None  # "H100", "MI300X"
    name: str | None  # deviceProperties name as written
    compute_capability: str | None  # "9.0": NVIDIA only
    source: str | None  # what told us: "deviceProperties", "runtime versions", "kernel names"

    @property
    def matrix_unit(self) -> str:
        """What the vendor calls its matrix-multiply units."""
        return "Matrix Cores" if self.vendor == "amd" else "Tensor Cores"

    def describe(self) -> str:
        """'NVIDIA H100 (sm_90, Hopper)', 'AMD MI300X (gfx942, CDNA 3)', or what is known."""
        vendor = {"nvidia": "NVIDIA", "amd": "AMD"}.get(self.vendor or "", "")
        head = " ".join(p for p in (vendor, self.model) if p) or (self.name or "GPU")
        detail = ", ".join(p for p in (self.architecture, self.generation) if p)
        return f"{head} ({detail})" if detail else head

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


UNKNOWN_DEVICE = DeviceIdentity(None, None, None, None, None, None, None)


def _capability(props: Mapping[str, Any]) -> tuple[int, int] | None:
    try:
        return int(props["computeMajor"]), int(props.get("computeMinor", 0))
    except (KeyError, TypeError, ValueError):
        return None


def _vendor(name: str | None, props: Mapping[str, Any], top: Mapping[str, Any]) -> str | None:
    if name and _AMD_NAME.search(name):
        return "amd"
    if name and _NVIDIA_NAME.search(name):
        return "nvidia"
    if any(top.get(k) is not None for k in _AMD_RUNTIME_KEYS) or props.get("gcnArchName"):
        return "amd"
    if any(top.get(k) is not None for k in _NVIDIA_RUNTIME_KEYS):
        return "nvidia"
    return None


def _from_properties(props: Mapping[str, Any], top: Mapping[str, Any]) -> DeviceIdentity:
    raw_name = props.get("name")
    name = raw_name if isinstance(raw_name, str) and raw_name else None
    vendor = _vendor(name, props, top)
    capability = _capability(props)
    source = "deviceProperties" if name else "runtime versions"
    if vendor == "amd":
        model_match = _AMD_MODEL.search(name or "")
        model = model_match.group(1).upper() if model_match else None
        gfx_match = _GFX.search(str(props.get("gcnArchName") or ""))
        arch = gfx_match.group(1).lower() if gfx_match else None
        if arch is None and model is not None:
            arch = next((gfx for prefix, gfx, _ in AMD_MODELS if model.startswith(prefix)), None)
        if arch is None and capability is not None:
            arch = AMD_BY_CAPABILITY.get(capability)
        return DeviceIdentity(
            "amd", arch, AMD_GENERATION.get(arch or ""), model, name, None, source
        )
    if vendor == "nvidia" or (vendor is None and capability is not None and name):
        model_match = _NVIDIA_MODEL.search(name or "")
        arch = f"sm_{capability[0]}{capability[1]}" if capability else None
        return DeviceIdentity(
            "nvidia",
            arch,
            NVIDIA_GENERATION.get(capability) if capability else None,
            model_match.group(1) if model_match else None,
            name,
            f"{capability[0]}.{capability[1]}" if capability else None,
            source,
        )
    return DeviceIdentity(vendor, None, None, None, name, None, source if vendor else None)


def _from_kernel_names(names: Sequence[str]) -> DeviceIdentity:
    for name in names:
        isa = _TENSILE_ISA.search(name)
        if isa:
            arch = f"gfx{isa.group(1)}"
            return DeviceIdentity(
                "amd", arch, AMD_GENERATION.get(arch), None, None, None, "kernel names"
            )
    # A kernel built for sm_X runs on sm_X and newer: the newest one seen is a lower bound,
    # reported as such (source), never as the device's own compute capability.
    built_for = [int(m.group(1)) for name in names if (m := _SM_KERNEL.search(name)) is not None]
    if built_for:
        digits = str(max(built_for))
        capability = (int(digits[:-1]), int(digits[-1]))
        return DeviceIdentity(
            "nvidia",
            f"sm_{digits}",
            NVIDIA_GENERATION.get(capability),
            None,
            None,
            None,
            "kernel names (newest architecture a kernel was built for)",
        )
    return UNKNOWN_DEVICE


def identify_device(
    device_properties: Sequence[Mapping[str, Any]] = (),
    top_level: Mapping[str, Any] | None = None,
    kernel_names: Sequence[str] = (),
    device_id: int | None = None,
) -> DeviceIdentity:
    """The identity of the GPU ``device_id`` (else the first listed), from what the trace
    holds; UNKNOWN_DEVICE's nulls where nothing says."""
    top = top_level or {}
    props = next(
        (p for p in device_properties if device_id is not None and p.get("id") == device_id),
        device_properties[0] if device_properties else None,
    )
    identity = _from_properties(props, top) if props is not None else UNKNOWN_DEVICE
    if props is None and _vendor(None, {}, top) is not None:
        identity = _from_properties({}, top)
    if identity.architecture is None and kernel_names:
        from_names = _from_kernel_names(kernel_names)
        if identity.vendor in (None, from_names.vendor):
            identity = DeviceIdentity(
                from_names.vendor,
                from_names.architecture,
                from_names.generation,
                identity.model,
                identity.name,
                identity.compute_capability,
                identity.source or from_names.source,
            )
    return identity
