"""Trace inputs for the facts tests: the real traces in ../shared/traces and tiny hand-made
ones, both read through the project's one loader (diagnostics.trace.loader)."""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl

from diagnostics.trace.loader import load_trace_file
from diagnostics.trace.schema import LoadedTrace, TraceMetadata

SHARED_TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"


def metadata(**fields: Any) -> TraceMetadata:
    return TraceMetadata(path="hand-made", **fields)


@cache
def load_events(path: Path) -> tuple[pl.DataFrame, Any]:
    """(events, metadata) of a real trace, through the project's one loader."""
    loaded = load_trace_file(path)
    return loaded.events, loaded.metadata


def real_traces() -> list[Path]:
    return sorted(p for p in SHARED_TRACES.glob("*.json*"))


# -- tiny hand-made traces: Chrome-trace event dicts, as Kineto writes them ---------------
HOST_PID = 100


def op(name: str, ts: float, dur: float, *, tid: int = 1, cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": HOST_PID, "tid": tid, "ts": ts, "dur": dur}


def annotation(name: str, ts: float, dur: float, *, tid: int = 1) -> dict[str, Any]:
    return op(name, ts, dur, tid=tid, cat="user_annotation")


def step(n: int, ts: float, dur: float, *, cat: str = "user_annotation") -> dict[str, Any]:
    return op(f"ProfilerStep#{n}", ts, dur, cat=cat)


def runtime(name: str, ts: float, dur: float, corr: int, *, tid: int = 1) -> dict[str, Any]:
    event = op(name, ts, dur, tid=tid, cat="cuda_runtime")
    event["args"] = {"correlation": corr, "External id": corr}
    return event


def gpu(
    name: str,
    ts: float,
    dur: float,
    corr: int | None,
    *,
    cat: str = "kernel",
    stream: int = 7,
    device: int = 0,
    nbytes: int | None = None,
) -> dict[str, Any]:
    args: dict[str, Any] = {"device": device, "stream": stream}
    if corr is not None:
        args["correlation"] = corr
    if nbytes is not None:
        args["bytes"] = nbytes
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": device,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def memory_event(ts: float, allocated: int, reserved: int, *, device: int = 0) -> dict[str, Any]:
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "name": "[memory]",
        "pid": HOST_PID,
        "tid": 1,
        "ts": ts,
        "args": {
            "Device Type": 0 if device < 0 else 1,
            "Device Id": device,
            "Bytes": 0,
            "Total Allocated": allocated,
            "Total Reserved": reserved,
        },
    }


def load_rows(rows: list[dict[str, Any]], rank: int = 0) -> LoadedTrace:
    """Hand-made events through the project's loader, as a trace file would go."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": rows}))
        return load_trace_file(path, rank=rank)


def events_of(*rows: dict[str, Any], rank: int = 0) -> pl.DataFrame:
    return load_rows(list(rows), rank).events
