"""exposed-communication on the real NCCL traces: when it fires, and why."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from diagnostics.analyze import analyze
from tests.diagnostics.rules.test_rank_stragglers import _write_ranks

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"


@cache
def _analysed(name: str):
    return analyze(TRACES / name)


def _finding(result):
    found = [f for f in result.findings if f.rule == "exposed-communication"]
    return found[0] if found else None


def test_rank3_of_8_fires_half_of_its_communication_is_exposed():
    # 163.5 ms of NCCL kernels over six ~77.5 ms steps; 75.6 ms of it ran beside compute
    # kernels (46%), 87.9 ms did not: 14.7 ms a step, 18.9% of the step time, above 10%.
    result = _analysed("hta_a100_rank3_of_8.json.gz")
    finding = _finding(result)
    assert finding is not None
    assert finding.evidence["overlap_pct"] == pytest.approx(46.2, abs=0.05)
    assert finding.evidence["exposed_pct"] == pytest.approx(18.9, abs=0.05)
    assert finding.evidence["exposed_us"] == pytest.approx(163_535 - 75_614)
    assert finding.evidence["steps"] == [1009, 1014]  # first and last, as every rule's
    assert finding.estimated_saving_pct == pytest.approx(18.9, abs=0.05)
    assert finding.severity == "medium"  # under twice the threshold
    assert finding.fix.config_patch is None  # the trainer has no distributed config yet
    assert "bucket_cap_mb" in finding.fix.code and "no_sync" in finding.fix.code
    summary = result.summary
    assert summary["comm_source"] == "gpu_kernels"
    assert summary["comm_exposed_pct"] == pytest.approx(finding.evidence["exposed_pct"], abs=0.05)
    assert summary["comm_ranks"] is None  # one rank: nothing to match


def test_rank0_of_16_fires_its_communication_barely_overlaps():
    # 187.9 ms of SendRecv kernels over five steps, only 2.6 ms (1.4%) beside compute; the
    # steps are long (~246 ms), so the exposed 37 ms a step is 15.1% of them.
    finding = _finding(_analysed("hta_a100_rank0_of_16.json.gz"))
    assert finding is not None
    assert finding.evidence["overlap_pct"] == pytest.approx(1.4, abs=0.05)
    assert finding.evidence["exposed_pct"] == pytest.approx(15.1, abs=0.05)


def test_threshold_decides_whether_it_fires():
    # the same trace with the threshold above its exposed share stays quiet
    result = analyze(
        TRACES / "hta_a100_rank0_of_16.json.gz", thresholds={"exposed_comm_min_pct": 16.0}
    )
    assert _finding(result) is None


def test_single_process_trace_is_skipped_with_a_reason():
    result = _analysed("kineto_resnet50_num_workers_4.pt.trace.json.gz")
    reasons = {s.rule: s.reason for s in result.skipped}
    assert "no communication" in reasons["exposed-communication"]
    assert result.summary["comm_source"] is None
    assert result.summary["comm_exposed_pct"] is None


def test_ranks_matched_across_files_reach_the_rule_as_waiting(tmp_path: Path):
    # two copies of the real rank-3 trace, rank 1 reaching every collective 1 ms late: rank 0
    # (the primary) waits inside each collective, and analyze hands the rule that match
    _write_ranks(TRACES / "hta_a100_rank3_of_8.json.gz", tmp_path, 2, 1, 1000.0)
    result = analyze(tmp_path)
    finding = _finding(result)
    assert finding is not None and finding.evidence["rank"] == 0
    per_rank = {row["rank"]: row for row in result.summary["comm_ranks"]["per_rank"]}
    assert per_rank[0]["wait_pct"] > 0.0
    assert finding.evidence["comm_wait_pct"] == pytest.approx(per_rank[0]["wait_pct"], abs=0.05)
    # the same trace alone has no match: no waiting is claimed, and all exposed time counts
    alone = _finding(_analysed("hta_a100_rank3_of_8.json.gz"))
    assert alone.evidence["comm_wait_pct"] is None
    # waiting is rank-stragglers' to fix: only the exposed transfer is offered as saving
    assert finding.estimated_saving_pct < alone.estimated_saving_pct


def test_one_rank_of_an_rccl_job_says_its_exposed_time_may_be_waiting():
    # MI300X, rank 0 of 8: 62.4 % of step time in ncclDevKernel_Generic kernels with no
    # compute beside them (checked against a json.load interval oracle in
    # tests/diagnostics/facts/test_comm_families.py). The all-reduces of 8,816,192 bf16
    # elements (17.6 MB) run ~8.9 ms each: about 2 GB/s, a small fraction of what MI300X
    # links carry, so most of it is likely waiting for other ranks, which one rank's trace
    # cannot separate from transfer. The finding says so rather than promising it all back.
    finding = _finding(_analysed("tracelens_mi300x_resnet_ddp_actckpt_rank0_of_8.json.gz"))
    assert finding is not None
    assert finding.evidence["exposed_pct"] == pytest.approx(62.4, abs=0.05)
    assert finding.evidence["comm_wait_pct"] is None
    assert finding.evidence["families"] == [
        {"family": "nccl", "collectives": 17, "busy_us": pytest.approx(71_517, abs=1)}
    ]
    assert "one rank of 8" in finding.recommendation
    assert "straggler" in finding.recommendation


def test_b200_symmetric_memory_all_reduce_is_measured_and_below_the_threshold():
    # before the family table this trace's only communication was one 22 µs NCCL all-gather;
    # its 73 multimem all-reduces now count: 2,119.5 µs, the sum of their durations in the
    # file, a few % of the profiled span, under the 10 % threshold (the trace has no
    # ProfilerStep, so the share depends on the inferred step; only the bound is asserted)
    result = _analysed("tracelens_b200_vllm_moe_mxfp4_rank0_of_8.json.gz")
    assert _finding(result) is None
    families = {row["family"]: row for row in result.summary["comm_families"]}
    assert families["symmetric_memory"]["collectives"] == 73
    assert families["symmetric_memory"]["busy_us"] == pytest.approx(2119.5, abs=0.1)
    assert 0.0 < result.summary["comm_exposed_pct"] < 10.0
