"""The 16-bit float dtypes recorded on CPU ops ("Input type" / "dtype") reach the event table.

fp16 needs a GradScaler and bf16 does not; kernel names do not always say which ran (cuDNN's
fused attention is ``..._wgmma_f16_...`` for both), the ops' recorded input dtypes do.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from diagnostics.facts import compute_facts
from diagnostics.trace.loader import load_trace_file
from tests.diagnostics.trace.helpers import cpu_op

GPU_RUNS = Path(__file__).resolve().parents[3].parent / "shared" / "gpu-runs"


def _op(name: str, ts: float, **args) -> dict:
    event = cpu_op(name, ts, 5)
    event["args"] = args
    return event


def test_input_types_become_the_half_dtypes_column(tmp_path: Path):
    rows = [
        _op("aten::mm", 0, **{"Input type": ["c10::BFloat16", "float", ""]}),
        _op("aten::add", 10, **{"Input type": ["c10::Half", "c10::BFloat16"]}),
        _op("aten::relu", 20, **{"Input type": ["float"]}),
        _op("aten::empty", 30, dtype="Half"),
        _op("aten::to", 40, dtype="Float"),
        # a single string reads as one dtype; another shape is dropped, the event kept
        _op("aten::odd", 50, **{"Input type": "c10::Half"}),
        _op("aten::odd2", 60, **{"Input type": [1, None]}),
        _op("aten::odd3", 70, **{"Input type": {"a": 1}}),
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": rows}))
    events = load_trace_file(path).events.sort("ts")
    assert events["name"].to_list() == [r["name"] for r in rows]
    assert events["half_dtypes"].to_list() == [
        "c10::BFloat16",
        "c10::Half,c10::BFloat16",
        None,
        "c10::Half",
        None,
        "c10::Half",
        None,
        None,
    ]


def _op_dtypes(run: str) -> dict[str, int]:
    (trace,) = (GPU_RUNS / run / "trace").glob("*.pt.trace.json.gz")
    loaded = load_trace_file(trace)
    facts = compute_facts(loaded.events, loaded.metadata)
    assert facts.op_half_dtypes is not None
    return dict(facts.op_half_dtypes.iter_rows())


def test_h200_runs_record_which_16_bit_dtype_their_ops_ran_in():
    # gpu-unstable trains in fp16 autocast, m768l6b256 in bf16: thousands of ops say so
    fp16 = _op_dtypes("h200-default/gpu-unstable")
    bf16 = _op_dtypes("h200-sized/m768l6b256")
    assert fp16.get("c10::Half", 0) > 1000 and "c10::BFloat16" not in fp16
    assert bf16.get("c10::BFloat16", 0) > 1000 and "c10::Half" not in bf16
    # the fp32 run has no 16-bit op at all
    assert _op_dtypes("h200-sized/m768l6b256-fp32") == {}


def test_traces_without_shapes_have_no_half_dtypes(tmp_path: Path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [cpu_op("aten::mm", 0, 5)]}))
    events = load_trace_file(path).events
    assert events.filter(pl.col("half_dtypes").is_not_null()).height == 0
