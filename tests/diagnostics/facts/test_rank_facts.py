"""compute_rank_facts (the part of a rank's facts the per-rank table and the collective
matching read, computed alone for the non-primary ranks of a many-rank input) gives exactly
what compute_facts gives for those fields, on real traces with and without communication."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from diagnostics.facts import compute_facts, compute_rank_facts
from diagnostics.sources import RankFacts
from tests.diagnostics.facts.trace_fixture import SHARED_TRACES, load_events

# NCCL (A100, 8 and 16 ranks), RCCL (MI300X), symmetric-memory all-reduce (B200), a
# single-GPU trace without collectives (V100) and a CPU-side-only DataLoader trace
TRACES = [
    "hta_a100_rank3_of_8.json.gz",
    "hta_a100_rank0_of_16.json.gz",
    "tracelens_mi300x_resnet_ddp_actckpt_rank0_of_8.json.gz",
    "tracelens_b200_vllm_moe_mxfp4_rank0_of_8.json.gz",
    "hta_v100_ns_timestamps.pt.trace.json.gz",
    "kineto_resnet50_num_workers_4.pt.trace.json.gz",
]


def _same(a: object, b: object, where: str) -> None:
    if isinstance(a, pl.DataFrame):
        assert isinstance(b, pl.DataFrame), where
        # to the last bits: polars sums floats over threads in no fixed order
        assert_frame_equal(a, b, rel_tol=1e-9, abs_tol=1e-9)
    elif dataclasses.is_dataclass(a):
        assert type(a) is type(b), where
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-9), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.parametrize("name", TRACES)
def test_rank_facts_equal_the_full_facts_fields(name: str) -> None:
    events, metadata = load_events(SHARED_TRACES / name)
    full = compute_facts(events, metadata)
    alone = compute_rank_facts(events, metadata)
    _same(alone, RankFacts.of(full), name)
    assert alone.steps.height > 0 and alone.gpu.height > 0  # there was something to compare


def test_the_collectives_are_there_to_match() -> None:
    events, metadata = load_events(SHARED_TRACES / "hta_a100_rank3_of_8.json.gz")
    alone = compute_rank_facts(events, metadata)
    assert alone.comms is not None and alone.comms.collectives.height > 0
    assert alone.rank == 3 and alone.device == "cuda"


def test_a_cpu_trace_is_a_cpu_ranks_facts(tmp_path):
    # a real torch.profiler CPU trace: no GPU work, so the device and the compute column
    # come from the CPU side
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    from diagnostics.trace.loader import load_trace_file

    x, w = torch.randn(64, 64), torch.randn(64, 64)
    path = tmp_path / "cpu.json"
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=3, repeat=1),
    ) as prof:
        for _ in range(4):
            (x @ w).relu().sum().item()
            prof.step()
    prof.export_chrome_trace(str(path))
    loaded = load_trace_file(path)
    alone = compute_rank_facts(loaded.events, loaded.metadata)
    _same(alone, RankFacts.of(compute_facts(loaded.events, loaded.metadata)), "cpu")
    assert alone.device == "cpu" and alone.steps.height == 3 and alone.comms is None
