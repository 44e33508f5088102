import pytest

from diagnostics.facts.copies import copy_table
from diagnostics.facts.launches import launch_table
from diagnostics.facts.linking import build_index
from diagnostics.facts.steps import find_steps
from diagnostics.facts.syncs import sync_per_step, sync_table
from tests.diagnostics.facts.trace_fixture import events_of, gpu, op, runtime, step


def test_copies_grouped_by_direction_and_memory_kind_with_bandwidth():
    events = events_of(
        runtime("cudaMemcpyAsync", 0, 900, corr=1),
        gpu("Memcpy HtoD (Pageable -> Device)", 850, 50, 1, cat="gpu_memcpy", nbytes=10_000_000),
        runtime("cudaMemcpyAsync", 1000, 10, corr=2),
        gpu("Memcpy HtoD (Pinned -> Device)", 1005, 100, 2, cat="gpu_memcpy", nbytes=2_000_000),
        runtime("cudaMemcpyAsync", 1200, 10, corr=3),
        gpu("Memcpy HtoD (Pinned -> Device)", 1205, 100, 3, cat="gpu_memcpy", nbytes=2_000_000),
        gpu("Memset (Device)", 2000, 2, None, cat="gpu_memset", nbytes=4_000),
    )
    rows = {
        (r["direction"], r["src_memory"]): r
        for r in copy_table(build_index(events)).iter_rows(named=True)
    }
    pageable = rows[("HtoD", "Pageable")]
    assert (pageable["count"], pageable["bytes"], pageable["dur_us"]) == (1, 10_000_000, 50)
    # 10 MB in 50 µs: bytes / µs / 1e3 = 200 GB/s.
    assert pageable["bandwidth_gb_s"] == pytest.approx(10_000_000 / 50 / 1e3)
    assert pageable["host_us"] == 900  # the host was stuck in the staging call
    pinned = rows[("HtoD", "Pinned")]
    assert (pinned["count"], pinned["bytes"]) == (2, 2 * 2_000_000)
    assert pinned["bandwidth_gb_s"] == pytest.approx(4_000_000 / 200 / 1e3)
    assert pinned["dst_memory"] == "Device"
    memset = rows[("Memset", None)]
    assert (memset["dst_memory"], memset["bytes"]) == ("Device", 4_000)


def sync_trace():
    return events_of(
        step(1, 0, 1000),
        runtime("cudaLaunchKernel", 0, 5, corr=1),
        gpu("k", 10, 500, corr=1),
        op("aten::item", 100, 420),
        op("aten::_local_scalar_dense", 105, 410),
        runtime("cudaMemcpyAsync", 110, 400, corr=2),
        gpu("Memcpy DtoH (Device -> Pageable)", 510, 2, 2, cat="gpu_memcpy", nbytes=4),
        runtime("cudaStreamSynchronize", 600, 50, corr=3),
        runtime("cudaDeviceSynchronize", 700, 20, corr=4),
        step(2, 1000, 500),
        # Two launches, as many GPU events as step 1, so the step is kept.
        runtime("cudaLaunchKernel", 1010, 5, corr=6),
        gpu("k2", 1020, 10, corr=6),
        runtime("cudaLaunchKernel", 1015, 5, corr=7),
        gpu("k3", 1030, 10, corr=7),
        runtime("cudaStreamSynchronize", 1100, 30, corr=5),
    )


def test_sync_table_lists_each_blocking_call():
    events = sync_trace()
    table = {r["name"]: r for r in sync_table(events, build_index(events)).iter_rows(named=True)}
    assert table["aten::item"]["total_us"] == 420
    assert table["aten::_local_scalar_dense"]["total_us"] == 410
    # The DtoH copy into pageable memory blocks the host for its whole call.
    assert table["Memcpy DtoH (Device -> Pageable)"]["total_us"] == 400
    assert (
        table["cudaStreamSynchronize"]["count"],
        table["cudaStreamSynchronize"]["total_us"],
    ) == (
        2,
        50 + 30,
    )
    assert table["cudaDeviceSynchronize"]["max_us"] == 20


def test_blocked_time_per_step_counts_nested_calls_once():
    events = sync_trace()
    index = build_index(events)
    per_step = sync_per_step(events, index, find_steps(events, index)).rows()
    # Step 1: aten::item 100..520 covers the nested calls; then 600..650 and 700..720.
    assert per_step == [(1, (520 - 100) + (650 - 600) + (720 - 700), 3), (2, 30.0, 1)]


def test_aten_item_is_no_sync_on_a_cpu_only_trace():
    events = events_of(step(1, 0, 100), op("aten::item", 10, 5))
    assert sync_table(events, build_index(events)).height == 0


def test_launch_stats_follow_hta_definitions():
    events = events_of(
        runtime("cudaLaunchKernel", 0, 10, corr=1),
        gpu("tiny", 15, 3, corr=1),  # 3 < 10 and the call is <= 50 µs: short
        runtime("cudaLaunchKernel", 20, 10, corr=2),
        gpu("tiny", 200, 3, corr=2),  # delay 200 - 20 = 180 > 100: outlier
        runtime("cudaLaunchKernel", 300, 60, corr=3),
        gpu("big", 365, 500, corr=3),  # long call (60 > 50), kernel longer than call
        gpu("unlinked", 1000, 5, corr=99),
    )
    table = {r["name"]: r for r in launch_table(build_index(events)).iter_rows(named=True)}
    tiny = table["tiny"]
    assert tiny["count"] == 2
    assert tiny["short_count"] == 2
    assert tiny["launch_delay_us_mean"] == ((15 - 0) + (200 - 20)) / 2
    assert tiny["launch_delay_us_max"] == 200 - 20
    assert tiny["delay_outlier_count"] == 1
    big = table["big"]
    assert (big["short_count"], big["launch_outlier_count"], big["kernel_us_mean"]) == (0, 1, 500)
    assert "unlinked" not in table


def test_rocm_synchronize_calls_block_like_cudas_on_the_mi300x_trace():
    """ROCm names the runtime's sync calls hip*: the MI300X ResNet trace's
    hipDeviceSynchronize calls are counted, as many and as long as a json.load of the file
    says (each call once: none nests in another)."""
    import gzip
    import json

    from diagnostics.trace.loader import load_trace_file
    from tests.diagnostics.trace.helpers import SHARED_TRACES

    path = SHARED_TRACES / "tracelens_mi300x_resnet_ddp_actckpt_rank0_of_8.json.gz"
    with gzip.open(path) as handle:
        raw = [
            e
            for e in json.load(handle)["traceEvents"]
            if e.get("name") == "hipDeviceSynchronize" and e.get("ph") == "X" and "dur" in e
        ]
    assert raw, "the trace records hipDeviceSynchronize"
    events = load_trace_file(path).events
    table = sync_table(events, build_index(events))
    (row,) = table.filter(table["name"] == "hipDeviceSynchronize").iter_rows(named=True)
    assert row["count"] == len(raw)
    assert row["total_us"] == pytest.approx(sum(float(e["dur"]) for e in raw), abs=1.0)
