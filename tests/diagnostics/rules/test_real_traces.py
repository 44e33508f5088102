"""What the real traces in ../shared/traces plainly show, through analyze() and every rule.

Each test states the evidence in the trace and the finding it must (or must not) produce;
the expected numbers come from the trace itself or torch-tb-profiler's golden output for it
(kineto_resnet50_golden_overview.txt). No finding is tied to a file name: these go through
the same analyze() as uploads and runs.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from diagnostics.analyze import analyze

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"


@cache
def _analysed(name: str):
    return analyze(TRACES / name)


def _finding(result, rule: str):
    found = [f for f in result.findings if f.rule == rule]
    return found[0] if found else None


def _golden_overview(line: int) -> dict:
    lines = (TRACES / "kineto_resnet50_golden_overview.txt").read_text().splitlines()
    return json.loads(lines[line])


def test_num_workers_0_trace_waits_for_the_dataloader():
    # ResNet-50 with num_workers=0: the plugin's golden overview puts 33.37% of the step in
    # DataLoader (59262 of 177592 us) and recommends workers. The ranges are named
    # _SingleProcessDataLoaderIter, so the current worker count (0) is known.
    golden = _golden_overview(0)["performance"][0]
    dataloader = next(c for c in golden["children"] if c["name"] == "DataLoader")
    result = _analysed("kineto_resnet50_num_workers_0.pt.trace.json.gz")
    finding = _finding(result, "too-few-workers")
    assert finding is not None
    assert finding.evidence["num_workers"] == 0
    # our share is the median over steps, the plugin's the mean: both about a third
    assert finding.evidence["data_wait_share_pct"] == pytest.approx(dataloader["extra"], abs=3)
    # ~59 ms to load a batch against ~118 ms of compute: one worker keeps up; an uploaded
    # trace gets that as code for its own script, not as a reference-trainer patch
    assert finding.evidence["recommended_num_workers"] == 1
    assert "num_workers=1" in finding.fix.code and finding.fix.config_patch is None
    assert finding.estimated_saving_pct == pytest.approx(dataloader["extra"], abs=3)


def test_num_workers_4_trace_does_not_wait_for_the_dataloader():
    # the same job with 4 workers: DataLoader is 0.84% of the step (golden line 6)
    golden = _golden_overview(5)["performance"][0]
    dataloader = next(c for c in golden["children"] if c["name"] == "DataLoader")
    assert dataloader["extra"] < 5.0
    result = _analysed("kineto_resnet50_num_workers_4.pt.trace.json.gz")
    assert _finding(result, "too-few-workers") is None


@pytest.mark.parametrize(
    "name",
    [
        "kineto_resnet50_num_workers_0.pt.trace.json.gz",
        "kineto_resnet50_num_workers_4.pt.trace.json.gz",
    ],
)
def test_kineto_traces_copy_batches_from_pageable_memory(name):
    # both ResNet-50 traces copy every batch as "Memcpy HtoD (Pageable -> Device)":
    # 12 copies, 110 MiB over 6 steps; the plugin has no rule for it
    result = _analysed(name)
    htod = result.facts.copies.filter(
        (result.facts.copies["direction"] == "HtoD")
        & (result.facts.copies["src_memory"] == "Pageable")
    )
    finding = _finding(result, "missing-pin-memory")
    assert finding is not None
    assert finding.evidence["pageable_htod_bytes"] == int(htod["bytes"].sum())
    assert finding.evidence["pageable_htod_bytes"] > 100 * 2**20
    assert "pin_memory=True" in finding.fix.code and finding.fix.config_patch is None


@pytest.mark.parametrize(
    "name",
    ["kineto_resnet50_num_workers_0.pt.trace.json.gz", "hta_v100_ns_timestamps.pt.trace.json.gz"],
)
def test_fp32_training_on_a_v100_leaves_tensor_cores_unused(name):
    # V100 (compute capability 7.0) running fp32 sgemm/convolution kernels only; the
    # plugin's golden overview says "Kernels with 68% time are launched by Tensor Cores
    # eligible operators" for the ResNet-50 trace
    result = _analysed(name)
    finding = _finding(result, "tensor-cores-unused")
    assert finding is not None
    assert finding.evidence["compute_capability"] == "7.0"
    assert finding.evidence["tensor_core_kernel_pct"] == 0.0
    assert finding.evidence["eligible_pct"] > 50.0
    # an uploaded trace: the fix is autocast code for the user's script, no trainer patch
    assert "autocast" in finding.fix.code and finding.fix.config_patch is None


def test_rank0_of_16_gpu_idles_in_host_syncs():
    # A100 rank 0: the GPU is busy about a third of the profiled steps, and most idle gaps
    # fall while the host sits in DtoH copies to pageable memory and cudaDeviceSynchronize
    result = _analysed("hta_a100_rank0_of_16.json.gz")
    sync = _finding(result, "host-device-sync")
    low = _finding(result, "low-gpu-utilization")
    assert sync is not None and low is not None
    assert sync.evidence["sync_share_pct"] > 20.0
    assert low.evidence["gpu_busy_pct"] < 50.0
    assert low.evidence["idle_by_host_activity"]["sync"]["share_pct"] > 50.0
    # the utilisation finding points at the rule that explains the idle time
    assert low.evidence["related_rules"][0] == "host-device-sync"


def test_rank3_of_8_blocks_in_syncs_but_the_gpu_stays_busy():
    # A100 rank 3: the host blocks in .item() and DtoH copies, yet the GPU is ~79% busy and
    # idles under 1 ms in total while the host syncs: removing them would gain nothing
    result = _analysed("hta_a100_rank3_of_8.json.gz")
    assert result.summary["gpu_utilization_pct"] > 70.0
    assert result.facts.syncs.height > 0
    assert _finding(result, "host-device-sync") is None
    assert _finding(result, "low-gpu-utilization") is None


def test_alexnet_trace_idles_the_gpu_on_cpu_work_not_on_syncs():
    # The AlexNet benchmark has 21 sync calls but they block 1.5 ms of a 43 s span; the GPU
    # is idle 99.8% of it while the host runs CPU ops (first .to() and cuDNN set-up). So the
    # evidence supports low GPU utilisation explained by CPU work, not a sync finding.
    result = _analysed("hta_a100_alexnet_with_syncs.json.gz")
    assert int(result.facts.syncs["count"].sum()) == 21
    assert _finding(result, "host-device-sync") is None
    low = _finding(result, "low-gpu-utilization")
    assert low is not None
    assert low.evidence["gpu_busy_pct"] < 1.0
    causes = low.evidence["idle_by_host_activity"]
    assert max(causes, key=lambda k: causes[k]["idle_us"]) == "cpu_ops"


def test_traces_skip_run_only_rules_with_reasons():
    result = _analysed("kineto_resnet50_num_workers_4.pt.trace.json.gz")
    reasons = {s.rule: s.reason for s in result.skipped}
    # a trace has no per-step gradients or vocabulary usage, and one rank has no peers
    assert "rank-stragglers" in reasons and "two or more ranks" in reasons["rank-stragglers"]
    assert "unused-embedding-rows" in reasons
    assert "step-time-outliers" in reasons  # 6 profiler steps: too few to judge outliers
