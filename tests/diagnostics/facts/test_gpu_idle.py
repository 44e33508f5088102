import pytest

from diagnostics.facts.gpu import gpu_utilization
from diagnostics.facts.idle import idle_breakdown_pct, idle_gaps
from diagnostics.facts.linking import build_index
from diagnostics.facts.steps import find_steps
from tests.diagnostics.facts.trace_fixture import annotation, events_of, gpu, op, runtime, step


def analyse(*rows):
    events = events_of(*rows)
    index = build_index(events)
    steps = find_steps(events, index)
    return events, index, steps


def test_busy_is_the_union_over_streams_and_utilisation_counts_kernels_only():
    _, index, steps = analyse(
        step(1, 0, 1000),
        gpu("k_a", 100, 200, corr=None, stream=7),  # 100..300
        gpu("k_b", 200, 200, corr=None, stream=8),  # 200..400 overlaps k_a on another stream
        gpu("Memcpy HtoD (Pinned -> Device)", 500, 100, None, cat="gpu_memcpy"),
        gpu("k_other_gpu", 0, 1000, corr=None, device=1),
    )
    by_device = {r["device"]: r for r in gpu_utilization(index, steps).iter_rows(named=True)}
    dev0 = by_device[0]
    assert dev0["busy_us"] == (400 - 100) + (600 - 500)
    assert dev0["kernel_busy_us"] == 400 - 100
    assert dev0["span_us"] == 1000
    assert dev0["utilization_pct"] == pytest.approx((400 - 100) / 1000 * 100)
    assert dev0["busy_pct"] == pytest.approx(((400 - 100) + (600 - 500)) / 1000 * 100)
    assert by_device[1]["utilization_pct"] == pytest.approx(100.0)


def test_gaps_are_classified_as_hta_does_and_explained_by_host_activity():
    events, index, steps = analyse(
        step(1, 0, 1000),
        op("aten::conv2d", 0, 8),
        runtime("cudaLaunchKernel", 2, 5, corr=1),  # inside the op, after the step began
        gpu("k1", 10, 90, corr=1),  # 10..100
        # k2 was launched at 50, before k1 ended: queued work; 10 µs gap -> kernel_wait.
        runtime("cudaLaunchKernel", 50, 5, corr=2),
        gpu("k2", 110, 90, corr=2),  # 110..200
        # The host then loads data 200..600 and launches k3 at 610: host_wait.
        annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 200, 400),
        op("aten::relu", 605, 15),
        runtime("cudaLaunchKernel", 610, 5, corr=3),
        gpu("k3", 620, 80, corr=3),  # 620..700
        # k4 launched at 100 but waits behind something else until 750: 50 µs, other.
        runtime("cudaLaunchKernel", 100, 5, corr=4),
        gpu("k4", 750, 50, corr=4),  # 750..800
        op("aten::item", 820, 100),
        runtime("cudaStreamSynchronize", 830, 80, corr=5),
    )
    gaps = idle_gaps(events, index, steps)
    rows = gaps.select("start_us", "end_us", "idle_kind", "host_activity").rows()
    assert rows == [
        (0.0, 10.0, "host_wait", "cpu_ops"),  # k1 launched at 2, after the gap began
        (100.0, 110.0, "kernel_wait", "none"),
        (200.0, 620.0, "host_wait", "dataloader"),
        (700.0, 750.0, "other", "none"),
        (800.0, 1000.0, "other", "sync"),  # tail of the step: aten::item + its sync
    ]
    dataloader_gap = gaps.row(2, named=True)
    # The loader ran 200..600; aten::relu 605..620 (around the launch) counts as cpu_ops.
    assert dataloader_gap["dataloader_us"] == 600 - 200
    assert dataloader_gap["cpu_ops_us"] == 620 - 605
    tail = gaps.row(4, named=True)
    assert tail["sync_us"] == 920 - 820  # aten::item covers the sync call inside it
    # Idle time = span - busy: 1000 - (90 + 90 + 80 + 50).
    assert gaps["dur_us"].sum() == 1000 - (90 + 90 + 80 + 50)
    pct = idle_breakdown_pct(gaps)
    assert pct["kernel_wait"] == pytest.approx(10 / 690 * 100)
    assert pct["host_wait"] == pytest.approx((10 + 420) / 690 * 100)


def test_pageable_copy_calls_explain_gaps():
    events, index, steps = analyse(
        step(1, 0, 300),
        runtime("cudaLaunchKernel", 0, 5, corr=1),
        gpu("k1", 5, 45, corr=1),  # 5..50
        # The host stages a pageable copy 60..250; the DMA itself runs 240..250.
        runtime("cudaMemcpyAsync", 60, 190, corr=2),
        gpu("Memcpy HtoD (Pageable -> Device)", 240, 10, corr=2, cat="gpu_memcpy"),
    )
    gaps = idle_gaps(events, index, steps)
    first = gaps.row(1, named=True)
    assert (first["start_us"], first["end_us"]) == (50.0, 240.0)
    assert first["idle_kind"] == "host_wait"
    assert first["host_activity"] == "pageable_copy"
    assert first["pageable_copy_us"] == 240 - 60


def test_cpu_only_trace_has_no_gpu_facts():
    events, index, steps = analyse(step(1, 0, 100), op("aten::mm", 0, 50))
    assert gpu_utilization(index, steps).height == 0
    assert idle_gaps(events, index, steps).height == 0
    assert idle_breakdown_pct(idle_gaps(events, index, steps)) is None
