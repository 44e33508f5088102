"""Advice that fits the device: every rule's fix, on each GPU the shared material comes
from, holds no instruction that GPU cannot follow.

The devices are the real ones: each identity is read from a shared trace's own
``deviceProperties`` (the H200 from this project's H200 run record). What each can follow is
written here from the vendors' tables, apart from the analyser's: NVIDIA's bf16 and TF32
from compute capability 8.0, FP8 from 8.9 (Transformer Engine's support matrix); AMD CDNA 3
has bf16 and FP8, and PyTorch's ``allow_tf32`` is NVIDIA's; ``nvidia-smi`` runs on NVIDIA
only, ``amd-smi`` on AMD only.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from diagnostics.analyze import analyze
from diagnostics.facts.device import identify_device
from diagnostics.rules.device_advice import GENERAL_NOTE, advice_for, device_advice
from diagnostics.rules.registry import RULES
from diagnostics.rules.tensor_cores_unused import fix_code as tensor_core_fix
from diagnostics.thresholds import Thresholds
from tests.diagnostics.trace.helpers import SHARED_TRACES

GPU_RUNS = SHARED_TRACES.parent / "gpu-runs"
DEVICE_TRACES = {
    "V100": "hta_v100_ns_timestamps.pt.trace.json.gz",
    "A100": "hta_a100_alexnet_with_syncs.json.gz",
    "H100": "tracelens_h100_qwen1.5-0.5b_infer_profmem.json.gz",
    "B200": "tracelens_b200_vllm_moe_mxfp4_rank0_of_8.json.gz",
    "MI300X": "tracelens_mi300x_qwen1.5-0.5b_infer_profmem.json.gz",
}
DEVICES = (*DEVICE_TRACES, "H200")

# what each device can follow, from the vendors' tables (not from diagnostics)
CAN_FOLLOW = {
    "V100": {"bf16": False, "tf32": False, "fp8": False, "vendor": "nvidia"},
    "A100": {"bf16": True, "tf32": True, "fp8": False, "vendor": "nvidia"},
    "H100": {"bf16": True, "tf32": True, "fp8": True, "vendor": "nvidia"},
    "H200": {"bf16": True, "tf32": True, "fp8": True, "vendor": "nvidia"},
    "B200": {"bf16": True, "tf32": True, "fp8": True, "vendor": "nvidia"},
    "MI300X": {"bf16": True, "tf32": False, "fp8": True, "vendor": "amd"},
}
# an instruction -> what it needs of the device
INSTRUCTIONS = (
    (re.compile(r"bfloat16|\bbf16\b", re.I), "bf16"),
    (re.compile(r"tf32", re.I), "tf32"),
    (re.compile(r"float8|\bfp8\b", re.I), "fp8"),
    (re.compile(r"nvidia-smi"), "nvidia"),
    (re.compile(r"amd-smi|rocm-smi"), "amd"),
)


@cache
def device_properties(device: str) -> dict:
    """The device's deviceProperties entry as its own trace (or run record) wrote it."""
    if device == "H200":
        record = json.loads((GPU_RUNS / "h200-default" / "gpu-healthy" / "run.json").read_text())
        env = record.get("environment", record)
        major, minor = env["gpu_compute_capability"].split(".")
        return {
            "id": 0,
            "name": env["gpu_name"],
            "computeMajor": int(major),
            "computeMinor": int(minor),
        }
    with gzip.open(SHARED_TRACES / DEVICE_TRACES[device], "rt") as handle:
        return json.load(handle)["deviceProperties"][0]


def unfollowable(text: str, device: str) -> list[str]:
    """The instructions in ``text`` that ``device`` cannot follow."""
    can = CAN_FOLLOW[device]
    found = []
    for pattern, needs in INSTRUCTIONS:
        allowed = can["vendor"] == needs if needs in ("nvidia", "amd") else can[needs]
        if not allowed:
            found += [m.group(0) for m in pattern.finditer(text)]
    return found


def on_device(inputs, device: str):
    """The same inputs recorded on ``device``: the trace's deviceProperties, or the run's GPU
    record. None when neither is a CUDA record (a CPU run, a bare snapshot)."""
    props = device_properties(device)
    changed = False
    trace, run = inputs.trace, inputs.run
    if trace is not None and trace.device == "cuda":
        trace = replace(trace, device_properties=(props,), device_identity=identify_device([props]))
        changed = True
    if run is not None and str(run.environment.get("device")).lower() == "cuda":
        identity = identify_device([props])
        environment = {
            **run.environment,
            "gpu_name": props["name"],
            "gpu_compute_capability": identity.compute_capability,
        }
        run = replace(run, manifest=replace(run.manifest, environment=environment))
        changed = True
    return replace(inputs, trace=trace, run=run) if changed else None


def observed_precisions(inputs) -> str:
    """The kernel names and operator precisions the example's trace holds."""
    trace = inputs.trace
    if trace is None:
        return ""
    seen = list(trace.kernels["name"])
    if trace.roofline is not None:
        seen += [p for p in trace.roofline.calls["precision"].unique() if p]
    return " ".join(seen)


@pytest.mark.parametrize("device", DEVICES)
def test_each_device_is_read_as_the_vendors_tables_say(device):
    advice = advice_for(identify_device([device_properties(device)]))
    can = CAN_FOLLOW[device]
    assert advice.vendor == can["vendor"]
    assert (advice.bf16, advice.tf32, advice.fp8) == (can["bf16"], can["tf32"], can["fp8"])


def fixes_on_each_device(rule) -> list[tuple[str, str]]:
    """(device, what the rule said) for each of its firing examples moved onto each shared
    device; examples with no CUDA record, and devices their GEMMs could not have run on,
    are left out."""
    said = []
    for example in rule.examples:
        if not example.fires:
            continue
        for device in DEVICES:
            inputs = on_device(example.build(), device)
            if inputs is None or rule.skip_reason(inputs) is not None:
                continue
            if unfollowable(observed_precisions(inputs), device):
                continue  # its GEMMs (bf16, FP8) could not have run on this device
            assert device_advice(inputs).known, (rule.id, example.name, device)
            for finding in rule.check(inputs, Thresholds()):
                assert GENERAL_NOTE not in finding.fix.code, (device, finding.fix.code)
                text = "\n".join((finding.title, finding.recommendation, finding.fix.code))
                said.append((device, text))
    return said


@pytest.mark.parametrize("rule", RULES, ids=[rule.id for rule in RULES])
def test_every_rules_fix_fits_each_shared_device(rule):
    for device, text in fixes_on_each_device(rule):
        assert unfollowable(text, device) == [], (device, text)


def test_the_rules_whose_advice_depends_on_the_device_are_checked_on_every_device():
    """The check above covers the rules that advise a precision or a vendor tool on all six
    devices (a rule whose examples lost their CUDA record would pass it unchecked)."""
    by_rule = {rule.id: {d for d, _ in fixes_on_each_device(rule)} for rule in RULES}
    for rule_id in (
        "tensor-cores-unused",
        "memory-near-capacity",
        "unstable-gradients",
        "rank-stragglers",
    ):
        assert by_rule[rule_id] == set(DEVICES), (rule_id, by_rule[rule_id])


def test_the_v100_trace_is_told_fp16_with_a_grad_scaler_and_nothing_of_ampere():
    """The issue's case: tensor-cores-unused on a real V100 trace advised bf16 and TF32."""
    result = analyze(SHARED_TRACES / "hta_v100_rank1_of_2_large.json.gz")
    (finding,) = [f for f in result.findings if f.rule == "tensor-cores-unused"]
    assert "fp16 with a GradScaler" in finding.recommendation
    assert "torch.float16" in finding.fix.code and "scaler.step(optimizer)" in finding.fix.code
    assert unfollowable(finding.recommendation + finding.fix.code, "V100") == []


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_core_fix_offers_what_each_device_has(device):
    advice = advice_for(identify_device([device_properties(device)]))
    code = tensor_core_fix(advice)
    can = CAN_FOLLOW[device]
    assert unfollowable(code, device) == []
    # and what it has is offered: TF32 where it runs, FP8 where the matrix units take it
    assert ("allow_tf32" in code) == can["tf32"]
    assert ("FP8" in code) == can["fp8"]
    assert ("torch.bfloat16" in code) == can["bf16"]


def test_an_unknown_gpu_gets_the_general_form_and_is_told_so():
    advice = advice_for(None)
    code = tensor_core_fix(advice)
    assert code.count(GENERAL_NOTE) == 1
    assert "on NVIDIA Ampere+" in code
    assert advice.clocks_command().count("-smi") == 2


def test_kernel_names_give_a_lower_bound_that_is_enough_for_bf16():
    """No deviceProperties, but GEMMs built for sm_80: the GPU is Ampere or newer."""
    identity = identify_device([], {}, ["sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"])
    advice = advice_for(identity)
    assert advice.bf16 is True and advice.fp8 is False


def test_a_path_to_each_device_trace_exists():
    for name in DEVICE_TRACES.values():
        assert Path(SHARED_TRACES / name).is_file(), name


@pytest.mark.parametrize(("device", "tool"), [("MI300X", "amd-smi metric"), ("H100", "nvidia-smi")])
def test_a_compute_straggler_is_told_its_own_vendors_clock_tool(device, tool):
    (rule,) = [r for r in RULES if r.id == "rank-stragglers"]
    (example,) = [e for e in rule.examples if "compute straggler" in e.name]
    (finding,) = rule.check(on_device(example.build(), device), Thresholds())
    assert finding.evidence["cause"] == "compute"
    assert f"clocks/throttling ({tool}" in finding.recommendation
