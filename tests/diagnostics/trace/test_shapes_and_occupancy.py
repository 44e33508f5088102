"""Input shapes (record_shapes=True) and CUPTI's kernel launch figures reach the event table.

The oracle is a stdlib json.load of the same file: every operator's "Input Dims" and every
kernel's "blocks per SM" / "est. achieved occupancy %" must come through unchanged.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

from diagnostics.trace.loader import load_trace_file
from tests.diagnostics.trace.helpers import SHARED_TRACES

# A PyTorch 1.9 trace ("Operator"/"Kernel", shapes recorded) and an H200 run of this
# project's trainer (PyTorch 2.11, record_shapes=True): both eras of the args.
# named in full: a glob over a missing ../shared would leave the H200 case out without a word
H200_TRACE = (
    SHARED_TRACES.parent
    / "gpu-runs"
    / "h200-sized"
    / "m768l6b256"
    / "trace"
    / "m768l6b256.992.1796082394698036275.pt.trace.json.gz"
)
TRACES = [SHARED_TRACES / "kineto_resnet50_num_workers_0.pt.trace.json.gz", H200_TRACE]


def _raw(path: Path) -> list[dict]:
    with gzip.open(path) as handle:
        return json.load(handle)["traceEvents"]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name[:40])
def test_input_shapes_match_the_json(path: Path):
    assert path.exists(), path
    expected = [
        json.dumps(e["args"]["Input Dims"], separators=(",", ":"))
        for e in _raw(path)
        if e.get("ph") == "X" and "Input Dims" in e.get("args", {})
    ]
    events = load_trace_file(path).events
    shapes = events.filter(pl.col("input_shapes").is_not_null())["input_shapes"].to_list()
    assert len(expected) > 1000  # both traces were recorded with shapes
    assert sorted(shapes) == sorted(expected)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name[:40])
def test_kernel_occupancy_matches_the_json(path: Path):
    kernels = [
        e
        for e in _raw(path)
        if e.get("ph") == "X"
        and str(e.get("cat", "")).lower() == "kernel"
        and "est. achieved occupancy %" in e.get("args", {})
    ]
    events = load_trace_file(path).events.filter(pl.col("cat") == "kernel")
    got = events.filter(pl.col("occupancy_pct").is_not_null())
    assert got.height == len(kernels) > 100
    assert got["occupancy_pct"].sum() == pytest.approx(
        sum(e["args"]["est. achieved occupancy %"] for e in kernels)
    )
    assert got["blocks_per_sm"].sum() == pytest.approx(
        sum(e["args"]["blocks per SM"] for e in kernels)
    )


def test_a_trace_without_shapes_has_null_shapes():
    events = load_trace_file(SHARED_TRACES / "hta_v100_rank1_of_2_large.json.gz").events
    assert events["input_shapes"].null_count() == events.height
