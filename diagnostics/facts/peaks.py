"""Dense peak throughput of the GPUs the roofline knows, each row with the document it is from.

Figures are the vendor's dense (no structured sparsity) peaks at boost clock, per GPU:
TFLOP/s for bf16/fp16/tf32 on the matrix units, fp32 on the vector units (CUDA cores,
AMD's non-matrix FP32), fp8 on the matrix units, and HBM bandwidth in TB/s. None where the
device has no such unit (V100 has no bf16, tf32 or fp8 Tensor Cores). A device that no row
matches gets no peak: never a guess from a similar card.

Rows are matched on the deviceProperties name first (it tells an H100 SXM from a PCIe
card), then on the model facts.device extracted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diagnostics.facts.device import DeviceIdentity


@dataclass(frozen=True)
class DevicePeak:
    device: str  # "H100 SXM"
    name_pattern: str  # regex over the deviceProperties name (or the model)
    bf16_tflops: float | None
    fp16_tflops: float | None
    tf32_tflops: float | None
    fp32_tflops: float | None
    fp8_tflops: float | None
    hbm_tbps: float
    source: str

    def tflops(self, precision: str | None) -> float | None:
        """The matrix peak for a precision ("bf16", "fp16", "tf32", "fp32", "fp8")."""
        return {
            "bf16": self.bf16_tflops,
            "fp16": self.fp16_tflops,
            "tf32": self.tf32_tflops,
            "fp32": self.fp32_tflops,
            "fp8": self.fp8_tflops,
        }.get(precision or "")


_V100 = "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet (H100 datasheet; sparse figures halved)"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM; sparse figures halved)"
_H800 = "NVIDIA H800 Tensor Core GPU datasheet (H800 SXM5: H100 SXM5 compute, 3.35 TB/s; sparse figures halved)"
_B200 = "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200, 8 GPUs: per-GPU figures, sparse halved)"
_MI210 = "https://www.amd.com/en/products/accelerators/instinct/mi200/mi210.html"
_MI300X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"
_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf (Appendix A, FP32 accumulate, dense)"
_GA102 = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf (Appendix A, FP32 accumulate, dense)"

# Most specific first: "H100 PCIe" before "H100", "A100 80GB" before "A100".
PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak("V100 PCIe", r"V100.*PCIE", None, 112.0, None, 14.0, None, 0.9, _V100),
    DevicePeak("V100 SXM2", r"V100", None, 125.0, None, 15.7, None, 0.9, _V100),
    DevicePeak(
        "A100 80GB PCIe", r"A100.*80GB.*PCIe", 312.0, 312.0, 156.0, 19.5, None, 1.935, _A100
    ),
    DevicePeak("A100 80GB SXM", r"A100.*80GB", 312.0, 312.0, 156.0, 19.5, None, 2.039, _A100),
    DevicePeak("A100 40GB PCIe", r"A100.*PCIe", 312.0, 312.0, 156.0, 19.5, None, 1.555, _A100),
    DevicePeak("A100 40GB SXM", r"A100", 312.0, 312.0, 156.0, 19.5, None, 1.555, _A100),
    DevicePeak("H100 PCIe", r"H100.*PCIe", 756.5, 756.5, 378.0, 51.0, 1513.0, 2.0, _H100),
    DevicePeak("H100 SXM", r"H100", 989.5, 989.5, 494.5, 67.0, 1979.0, 3.35, _H100),
    DevicePeak("H200 SXM", r"H200", 989.5, 989.5, 494.5, 67.0, 1979.0, 4.8, _H200),
    DevicePeak("H800 SXM", r"H800", 989.5, 989.5, 494.5, 67.0, 1979.0, 3.35, _H800),
    DevicePeak("B200", r"B200", 2250.0, 2250.0, 1100.0, 75.0, 4500.0, 8.0, _B200),
    DevicePeak("MI210", r"MI210", 181.0, 181.0, None, 22.6, None, 1.6, _MI210),
    DevicePeak("MI300X", r"MI300X", 1307.4, 1307.4, 653.7, 163.4, 2614.9, 5.3, _MI300X),
    DevicePeak("RTX 4090", r"RTX 4090", 165.2, 165.2, 82.6, 82.6, 330.3, 1.008, _ADA),
    DevicePeak("RTX 3090", r"RTX 3090", 35.6, 35.6, 17.8, 35.6, None, 0.936, _GA102),
)


def device_peak(identity: DeviceIdentity) -> DevicePeak | None:
    """The row for this device, or None: no percentage is then reported."""
    for text in (identity.name, identity.model):
        if not text:
            continue
        for peak in PEAKS:
            if re.search(peak.name_pattern, text, flags=re.IGNORECASE):
                return peak
    return None
