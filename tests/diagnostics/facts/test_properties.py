"""Random event tables (EVENT_SCHEMA) thrown at compute_facts: it never fails, the breakdown
parts always add up to the step, and each device's idle gaps always fill exactly the span
it was not busy, however ranges overlap, nest badly or miss their links."""

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagnostics.facts import compute_facts
from diagnostics.facts.breakdown import PARTS
from diagnostics.trace.schema import EVENT_SCHEMA

CATS = ["cpu_op", "user_annotation", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset"]
NAMES = [
    "ProfilerStep#1",
    "ProfilerStep#2",
    "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
    "aten::mm",
    "aten::item",
    "cudaLaunchKernel",
    "cudaStreamSynchronize",
    "Memcpy HtoD (Pageable -> Device)",
    "Memcpy DtoH (Device -> Pageable)",
    "k",
]

event = st.fixed_dictionaries(
    {
        "name": st.sampled_from(NAMES),
        "cat": st.sampled_from(CATS),
        "ts": st.integers(0, 400).map(float),
        "dur": st.integers(0, 150).map(float),
        "tid": st.integers(1, 2),
        "device": st.integers(0, 1),
        "stream": st.integers(7, 8),
        "correlation": st.one_of(st.none(), st.integers(1, 12)),
    }
)


def table(rows):
    n = len(rows)
    data = {
        "rank": [0] * n,
        "name": [r["name"] for r in rows],
        "cat": [r["cat"] for r in rows],
        "ph": ["X"] * n,
        "ts": [r["ts"] for r in rows],
        "dur": [r["dur"] for r in rows],
        "pid": [r["device"] if r["cat"].startswith(("kernel", "gpu")) else 100 for r in rows],
        "tid": [r["tid"] for r in rows],
        "device": [r["device"] if r["cat"].startswith(("kernel", "gpu")) else None for r in rows],
        "stream": [r["stream"] if r["cat"].startswith(("kernel", "gpu")) else None for r in rows],
        "correlation": [r["correlation"] for r in rows],
    }
    frame = pl.DataFrame(data)
    return (
        frame.with_columns(pl.lit(None).alias(c) for c in EVENT_SCHEMA if c not in data)
        .select(list(EVENT_SCHEMA))
        .cast(EVENT_SCHEMA)
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(event, min_size=1, max_size=40))
def test_facts_hold_on_random_traces(rows):
    facts = compute_facts(table(rows), None)
    assert facts.steps.height >= 1
    totals = facts.breakdown.select(pl.sum_horizontal(list(PARTS)), "total_us").rows()
    for parts_sum, total in totals:
        assert parts_sum == pytest.approx(total)
    assert (facts.breakdown.select(list(PARTS)).min_horizontal() >= -1e-9).all()
    for row in facts.gpu.iter_rows(named=True):
        gaps = facts.idle_gaps.filter(pl.col("device") == row["device"])
        assert gaps["dur_us"].sum() == pytest.approx(row["span_us"] - row["busy_us"])
        assert 0 <= row["utilization_pct"] <= row["busy_pct"] <= 100 + 1e-9
    assert (facts.operators["host_self_us"] <= facts.operators["host_us"] + 1e-9).all()
