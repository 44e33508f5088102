import pytest

from diagnostics.facts.breakdown import PARTS, breakdown_pct, step_breakdown
from diagnostics.facts.linking import build_index
from diagnostics.facts.steps import find_steps
from tests.diagnostics.facts.trace_fixture import annotation, events_of, gpu, op, runtime, step


def breakdown_of(*rows):
    events = events_of(*rows)
    return step_breakdown(events, find_steps(events, build_index(events)))


def test_each_instant_counts_once_for_the_highest_priority_role():
    got = breakdown_of(
        step(1, 0, 100),
        annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 30),
        op("aten::to", 25, 20),  # 25..45: 25..30 is DataLoader's (higher priority)
        runtime("cudaMemcpyAsync", 35, 15, corr=1),  # 35..50 over the op: Runtime wins
        gpu("Memcpy HtoD (Pageable -> Device)", 48, 12, corr=1, cat="gpu_memcpy"),  # 48..60
        runtime("cudaLaunchKernel", 60, 5, corr=2),
        gpu("k", 55, 25, corr=3),  # 55..80 (launched elsewhere) over the copy's tail
        gpu("Memset (Device)", 85, 5, corr=4, cat="gpu_memset"),
    ).row(0, named=True)
    assert got["kernel_us"] == 80 - 55
    assert got["memcpy_us"] == 55 - 48  # 48..55; 55..60 is under the kernel
    assert got["memset_us"] == 90 - 85
    assert got["runtime_us"] == 48 - 35  # 35..48; 48..50 is under the copy; 60..65 kernel
    assert got["dataloader_us"] == 30 - 0
    assert got["cpu_exec_us"] == 35 - 30  # the op's 30..35, the rest is taken
    # Nothing covers 80..85 and 90..100.
    assert got["other_us"] == (85 - 80) + (100 - 90)
    assert sum(got[p] for p in PARTS) == got["total_us"] == 100


def test_dataloader_annotations_count_on_modern_traces():
    # torch-tb-profiler 0.4.3 drops user_annotation events and reports 0 here.
    got = breakdown_of(
        step(1, 0, 100),
        annotation("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 10, 40),
    ).row(0, named=True)
    assert got["dataloader_us"] == 50 - 10
    assert got["other_us"] == 100 - 40


def test_breakdown_pct_is_mean_part_over_mean_step():
    frame = breakdown_of(
        step(1, 0, 100),
        op("aten::mm", 0, 50),
        step(2, 100, 300),
        op("aten::mm", 100, 50),
    )
    pct = breakdown_pct(frame)
    # CPU Exec is 50 + 50 of 100 + 300 µs of steps.
    assert pct["cpu_exec"] == pytest.approx((50 + 50) / (100 + 300) * 100)
    assert pct["other"] == pytest.approx((50 + 250) / (100 + 300) * 100)
    assert sum(pct.values()) == pytest.approx(100.0)
