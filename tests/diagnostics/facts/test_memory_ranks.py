import polars as pl
import pytest

from diagnostics.facts import compute_facts, rank_summary, step_time_spread
from diagnostics.facts.memory import memory_curve, memory_peaks
from tests.diagnostics.facts.trace_fixture import (
    events_of,
    gpu,
    load_rows,
    memory_event,
    metadata,
    op,
    runtime,
    step,
)

GIB = 1024**3


def test_memory_curve_and_peak_against_the_device():
    events = events_of(
        memory_event(10, 1 * GIB, 2 * GIB),
        memory_event(20, 3 * GIB, 4 * GIB),
        memory_event(30, 2 * GIB, 4 * GIB),
        memory_event(15, 100, 0, device=-1),
    )
    curve = memory_curve(events)
    assert curve.filter(pl.col("device") == 0)["allocated_bytes"].to_list() == [
        1 * GIB,
        3 * GIB,
        2 * GIB,
    ]
    assert curve.filter(pl.col("device") == -1).rows() == [(15.0, -1, 100, 0)]
    peaks = memory_peaks(curve, ({"id": 0, "totalGlobalMem": 16 * GIB},))
    dev0 = peaks.filter(pl.col("device") == 0).row(0, named=True)
    assert (dev0["peak_allocated_bytes"], dev0["peak_reserved_bytes"]) == (3 * GIB, 4 * GIB)
    assert dev0["peak_allocated_pct"] == pytest.approx(3 / 16 * 100)
    assert peaks.filter(pl.col("device") == -1)["device_total_bytes"].to_list() == [None]


def test_old_traces_without_totals_use_the_running_sum_of_bytes():
    raw = [
        {
            "ph": "i",
            "name": "[memory]",
            "pid": 1,
            "tid": 1,
            "ts": t,
            "args": {"Device Type": 1, "Device Id": 0, "Bytes": b},
        }
        for t, b in ((1, 100), (2, 50), (3, -120))
    ]
    curve = memory_curve(load_rows(raw).events)
    assert curve["allocated_bytes"].to_list() == [100, 100 + 50, 100 + 50 - 120]
    assert curve["reserved_bytes"].to_list() == [None, None, None]


def rank_trace(rank, step_us, kernel_us):
    rows = []
    for i in range(3):
        t = i * step_us
        rows += [
            step(i, t, step_us),
            runtime("cudaLaunchKernel", t + 1, 1, corr=i + 1),
            gpu("k", t + 2, kernel_us, corr=i + 1),
        ]
    return events_of(*rows, rank=rank)


def test_rank_summary_and_spread_point_at_the_straggler():
    facts = [
        compute_facts(rank_trace(0, 100, 50), metadata()),
        compute_facts(rank_trace(1, 100, 50), metadata()),
        compute_facts(rank_trace(2, 150, 50), metadata()),
    ]
    summary = rank_summary(facts)
    assert summary["rank"].to_list() == [0, 1, 2]
    assert summary["step_time_ms_mean"].to_list() == pytest.approx(
        [100 / 1000, 100 / 1000, 150 / 1000]
    )
    # Median of the means is 0.1 ms; rank 2 is 1.5x slower.
    assert summary["step_time_vs_median"].to_list() == pytest.approx([1.0, 1.0, 1.5])
    # GPU busy 50 µs of each step: 50/100 and 50/150.
    assert summary["gpu_utilization_pct"].to_list() == pytest.approx([50.0, 50.0, 50 / 150 * 100])
    spread = step_time_spread(summary)
    assert (spread.slowest_rank, spread.fastest_rank) == (2, 0)
    assert spread.slowest_vs_median == pytest.approx(1.5)
    assert spread.spread_pct == pytest.approx((0.15 - 0.1) / 0.1 * 100)


def test_compute_facts_on_a_multi_rank_table_summarises_every_rank():
    events = pl.concat([rank_trace(0, 100, 50), rank_trace(1, 200, 50)])
    facts = compute_facts(events, metadata())
    assert facts.rank == 0
    assert facts.ranks["rank"].to_list() == [0, 1]
    assert facts.ranks["step_time_ms_mean"].to_list() == pytest.approx([100 / 1000, 200 / 1000])


def test_compute_facts_on_a_cpu_trace():
    facts = compute_facts(events_of(step(1, 0, 100), op("aten::mm", 10, 50)), None)
    assert facts.device == "cpu"
    assert facts.breakdown.row(0, named=True)["cpu_exec_us"] == 50
    assert facts.gpu.height == 0 and facts.idle_gaps.height == 0
    assert facts.operators["name"].to_list() == ["aten::mm"]


def test_trace_summary_has_every_key_with_its_numbers():
    from diagnostics.facts import trace_summary

    summary = trace_summary(compute_facts(rank_trace(0, 100, 50), metadata()))
    # Three steps of 100 µs = 0.1 ms each.
    assert summary["steps"] == 3
    assert summary["step_time_ms"] == pytest.approx({"mean": 0.1, "p50": 0.1, "p95": 0.1})
    assert summary["gpu_utilization_pct"] == pytest.approx(3 * 50 / 300 * 100)
    assert summary["gpu_busy_us"] == 3 * 50
    # Idle is 300 - 150 µs: 0..2 before the first kernel and the 50 µs between kernels
    # (each next kernel launched after the previous ended: host_wait), then 252..300 after
    # the last kernel with nothing launched (other).
    assert summary["gpu_idle_breakdown_pct"] == pytest.approx(
        {"host_wait": (2 + 50 + 50) / 150 * 100, "kernel_wait": 0.0, "other": 48 / 150 * 100}
    )
    assert set(summary["breakdown_pct"]) == {
        "kernel",
        "memcpy",
        "memset",
        "runtime",
        "dataloader",
        "cpu_exec",
        "other",
    }
    cpu = trace_summary(compute_facts(events_of(step(1, 0, 100)), None))
    assert cpu["device"] == "cpu" and cpu["gpu_utilization_pct"] is None
    assert cpu["gpu_idle_breakdown_pct"] is None


def test_compute_facts_warns_when_gpu_work_cannot_be_traced_to_its_launch():
    linked = compute_facts(rank_trace(0, 100, 50), metadata())
    assert not any("no launching runtime call" in w for w in linked.warnings)
    # Three linked kernels plus two with unknown correlation ids: 2 of 5 > 25%.
    events = events_of(
        *[
            step(1, 0, 500),
            runtime("cudaLaunchKernel", 1, 1, corr=1),
            gpu("k", 2, 10, corr=1),
            runtime("cudaLaunchKernel", 3, 1, corr=2),
            gpu("k", 20, 10, corr=2),
            runtime("cudaLaunchKernel", 4, 1, corr=3),
            gpu("k", 40, 10, corr=3),
            gpu("k", 60, 10, corr=77),
            gpu("k", 80, 10, corr=None),
        ]
    )
    facts = compute_facts(events, metadata(warnings=("loader said so",)))
    assert "loader said so" in facts.warnings
    assert any(
        w.startswith("2 of 5 GPU events have no launching runtime call") for w in facts.warnings
    )
