"""Advice the detected GPU can follow: which precision to train in, which matrix-unit
features to turn on, which vendor tool reads its clocks.

What each architecture has, from the vendors' own tables:
- NVIDIA: Tensor Cores from compute capability 7.0 (Volta; Turing 7.5 adds nothing used
  here); bf16 and TF32 from 8.0 (Ampere); FP8 from 8.9 (Ada, Hopper, Blackwell: Transformer
  Engine's support matrix, torchao.float8's SM89 check).
- AMD Instinct: Matrix Cores and bf16 from CDNA (gfx908); FP8 from CDNA 3 (gfx942, gfx950).
  TF32 is not advised there: CDNA 4 has no xf32, and PyTorch's ``allow_tf32`` is NVIDIA's.

A device known only from kernel names (``sm_80_...``) is at least that architecture, so
what that architecture has holds. An unknown device gets the general form, which says it is
general.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diagnostics.facts.device import DeviceIdentity, identify_device
from diagnostics.facts.mfu import run_device_identity
from diagnostics.model import AnalysisInputs
from diagnostics.sources import TraceFacts

_SM = re.compile(r"^sm_(\d+)(\d)$")
# AMD gfx targets with Matrix Cores (MFMA), all of which take bf16: CDNA 1-4. Older GCN
# (gfx906, MI50) has none.
AMD_MATRIX_CORE_ARCHITECTURES = frozenset(
    {"gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950"}
)
_AMD_FP8 = frozenset({"gfx940", "gfx941", "gfx942", "gfx950"})
# general form: the first line a fix's code carries when the GPU is not known
GENERAL_NOTE = (
    "# general form (the GPU is not known): bf16 needs NVIDIA Ampere+ or AMD CDNA;\n"
    "# on Volta/Turing use dtype=torch.float16 with torch.amp.GradScaler\n"
)


@dataclass(frozen=True)
class DeviceAdvice:
    """What the job's GPU can follow. None: the GPU is not known."""

    identity: DeviceIdentity | None
    bf16: bool | None
    tf32: bool | None
    fp8: bool | None

    @property
    def known(self) -> bool:
        return self.bf16 is not None

    @property
    def vendor(self) -> str | None:
        return self.identity.vendor if self.identity is not None else None

    @property
    def precision(self) -> str:
        """The autocast precision to advise: 'bf16', 'fp16 with a GradScaler', or the
        general form's words."""
        if self.bf16 is None:
            return "bf16 (fp16 with a GradScaler on NVIDIA Volta/Turing)"
        return "bf16" if self.bf16 else "fp16 with a GradScaler"

    @property
    def dtype(self) -> str:
        """The half precision its code uses: 'bf16' or 'fp16' ('bf16' in the general form)."""
        return "fp16" if self.bf16 is False else "bf16"

    def autocast(self, forward: str, rest: str) -> str:
        """A training step's lines under autocast in the precision this GPU takes.

        ``forward`` computes ``loss`` (one line); ``rest`` holds the step's other lines, whose
        ``loss.backward()`` and ``optimizer.step()`` fp16 routes through a GradScaler."""
        if self.bf16 is False:
            lines = []
            for line in rest.splitlines():
                indent = line[: len(line) - len(line.lstrip())]
                if line.strip() == "optimizer.step()":
                    lines += [f"{indent}scaler.step(optimizer)", f"{indent}scaler.update()"]
                else:
                    lines.append(line.replace("loss.backward()", "scaler.scale(loss).backward()"))
            return (
                'scaler = torch.amp.GradScaler("cuda")  # once, before the loop\n'
                'with torch.autocast("cuda", dtype=torch.float16):\n'
                f"    {forward}\n" + "\n".join(lines) + "\n"
            )
        general = GENERAL_NOTE if self.bf16 is None else ""
        return (
            f'{general}with torch.autocast("cuda", dtype=torch.bfloat16):\n    {forward}\n{rest}\n'
        )

    def clocks_command(self) -> str:
        """The vendor's tool that shows clocks and throttling."""
        if self.vendor == "amd":
            return "amd-smi metric"
        if self.vendor == "nvidia":
            return "nvidia-smi -q -d PERFORMANCE"
        return "nvidia-smi -q -d PERFORMANCE on NVIDIA, amd-smi metric on AMD"


def advice_for(identity: DeviceIdentity | None) -> DeviceAdvice:
    """What ``identity`` can follow; all None when it says too little."""
    if identity is None:
        return DeviceAdvice(None, None, None, None)
    if identity.vendor == "amd" and identity.architecture is not None:
        arch = identity.architecture
        return DeviceAdvice(
            identity, arch in AMD_MATRIX_CORE_ARCHITECTURES, False, arch in _AMD_FP8
        )
    capability = _nvidia_capability(identity)
    if capability is None:
        return DeviceAdvice(identity, None, None, None)
    modern = capability >= (8, 0)
    return DeviceAdvice(identity, modern, modern, capability >= (8, 9))


def _nvidia_capability(identity: DeviceIdentity) -> tuple[int, int] | None:
    if identity.vendor != "nvidia":
        return None
    if identity.compute_capability:
        major, _, minor = identity.compute_capability.partition(".")
        if major.isdigit() and minor.isdigit():
            return int(major), int(minor)
    # from kernel names: the newest architecture a kernel was built for, a lower bound
    built = _SM.match(identity.architecture or "")
    return (int(built.group(1)), int(built.group(2))) if built else None


def trace_device(trace: TraceFacts) -> DeviceIdentity:
    """The trace's GPU identity (computed by the facts; rebuilt for facts made without it)."""
    if trace.device_identity is not None:
        return trace.device_identity
    return identify_device(trace.device_properties, {}, trace.kernels["name"].to_list())


def device_advice(inputs: AnalysisInputs) -> DeviceAdvice:
    """The advice for the GPU the job ran on: the trace's identity, else the run's record."""
    trace = inputs.trace
    if trace is not None and trace.device == "cuda":
        identity = trace_device(trace)
        if identity.vendor is not None:
            return advice_for(identity)
    if inputs.run is not None:
        return advice_for(run_device_identity(inputs.run.environment))
    return advice_for(None)
