"""Every real trace in ../shared/traces loads, and its table agrees with a stdlib json.load.

The oracle is independent of the loader: the same file read with gzip + json, events
counted by phase and by category with the schema's alias table applied in plain Python.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from diagnostics.trace.loader import load_trace_file
from diagnostics.trace.schema import CATEGORY_ALIASES, EVENT_SCHEMA, Category, normalise_category
from tests.diagnostics.trace.helpers import SHARED_TRACES, provenance_trace_names

TRACES = sorted(SHARED_TRACES.glob("*.json.gz"))


def test_the_shared_traces_are_there():
    # A missing folder must fail, not skip everything: PROVENANCE.md lists twelve traces
    # (seven, then five more of other vendors and jobs), and the folder holds those.
    listed = provenance_trace_names()
    assert len(listed) == 12
    assert {p.name for p in TRACES} == listed, f"the traces of PROVENANCE.md in {SHARED_TRACES}"


def oracle(path: Path) -> tuple[Counter[str], int, int]:
    """(normalised category -> rows, flow events, rows with a non-numeric pid or tid)."""
    with gzip.open(path) as handle:
        events = json.load(handle)["traceEvents"]
    cats: Counter[str] = Counter()
    flows = labels = 0
    for event in events:
        ph = event.get("ph")
        if ph in ("s", "f", "t"):
            flows += 1
        if ph not in ("X", "i", "I"):
            continue
        category = normalise_category(event.get("cat"))
        if event.get("name") == "[memory]":
            category = Category.MEMORY
        cats[str(category)] += 1
        numeric = [
            isinstance(v, int) or (isinstance(v, str) and v.isdigit())
            for v in (event.get("pid"), event.get("tid"))
        ]
        gpu_stream = isinstance(event.get("args"), dict) and "stream" in event["args"]
        if not numeric[0] or not (numeric[1] or gpu_stream):
            labels += 1
    return cats, flows, labels


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_real_trace_loads_with_the_schema_and_the_oracles_counts(path):
    trace = load_trace_file(path)
    events = trace.events
    assert events.schema == pl.Schema(EVENT_SCHEMA)
    cats, flows, labels = oracle(path)
    assert dict(Counter(dict(events["cat"].value_counts().iter_rows()))) == dict(cats)
    assert trace.flows.height == flows
    assert trace.metadata.unnumbered_ids == labels
    assert trace.metadata.skipped_events == 0 and trace.metadata.warnings == ()
    # every row has a time, complete events a non-negative duration, in time order
    assert events["ts"].null_count() == 0
    complete = events.filter(pl.col("ph") == "X")
    assert complete["dur"].null_count() == 0 and complete["dur"].min() >= 0
    assert events["ts"].is_sorted()
    assert set(events["cat"].unique()) <= {str(c) for c in Category}
    # GPU rows carry their device and stream, and every one is linkable by correlation
    kernels = events.filter(pl.col("cat") == "kernel")
    assert kernels.height > 0
    assert kernels["device"].null_count() == 0 and kernels["stream"].null_count() == 0
    assert kernels["correlation"].null_count() == 0
    assert trace.metadata.device_properties, "every shared trace lists its GPUs"


def test_old_category_names_are_normalised_on_the_pytorch_1_9_trace():
    path = SHARED_TRACES / "kineto_resnet50_num_workers_0.pt.trace.json.gz"
    with gzip.open(path) as handle:
        raw = Counter(e.get("cat") for e in json.load(handle)["traceEvents"])
    events = load_trace_file(path).events
    counts = dict(events["cat"].value_counts().iter_rows())
    # "Operator" and "Kernel" are the 1.9 spellings of cpu_op and kernel
    assert counts["cpu_op"] == raw["Operator"] and counts["kernel"] == raw["Kernel"]
    assert counts["cuda_runtime"] == raw["Runtime"] and counts["gpu_memcpy"] == raw["Memcpy"]
    assert "operator" in CATEGORY_ALIASES


def test_nanosecond_trace_keeps_fractional_microseconds():
    events = load_trace_file(SHARED_TRACES / "hta_v100_ns_timestamps.pt.trace.json.gz").events
    fractional = events.filter(pl.col("dur") != pl.col("dur").floor())
    assert fractional.height > 0.5 * events.filter(pl.col("ph") == "X").height


def test_rank_is_read_from_distributed_info():
    trace = load_trace_file(SHARED_TRACES / "hta_a100_rank3_of_8.json.gz")
    assert (trace.rank, trace.metadata.rank_source) == (3, "distributedInfo")
    assert trace.metadata.distributed_info["world_size"] == 8
