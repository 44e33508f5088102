"""Tiny stand-in loader for the facts tests: Chrome-trace JSON (gzip or not) into
EVENT_SCHEMA. Used only until diagnostics.trace's loader is committed; then the tests load
through it (``load_events`` prefers it), so there is one loader."""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl

from diagnostics.trace.schema import EVENT_SCHEMA, normalise_category

SHARED_TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
_DIGITS = re.compile(r"-?\d+")


@dataclass(frozen=True)
class Metadata:
    device_properties: tuple[dict[str, Any], ...] = ()
    distributed_info: dict[str, Any] | None = None
    pytorch_version: str | None = None
    warnings: tuple[str, ...] = field(default_factory=tuple)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        match = _DIGITS.search(value)
        return int(match.group()) if match else None
    return None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def rows_to_events(raw: list[dict[str, Any]], rank: int = 0) -> pl.DataFrame:
    """Chrome-trace event dicts -> the event table (the subset of fields the facts read)."""
    columns: dict[str, list[Any]] = {name: [] for name in EVENT_SCHEMA}
    for event in raw:
        ph = event.get("ph")
        if ph in ("M", "s", "f", "t") or "ts" not in event:
            continue
        args = event.get("args") or {}
        columns["rank"].append(rank)
        columns["name"].append(str(event.get("name", "")))
        cat = normalise_category(event.get("cat"))
        if event.get("name") == "[memory]":
            cat = normalise_category("memory")
        columns["cat"].append(cat.value)
        columns["ph"].append(ph)
        columns["ts"].append(_float(event.get("ts")))
        columns["dur"].append(_float(event.get("dur")))
        columns["pid"].append(_int(event.get("pid")))
        columns["tid"].append(_int(event.get("tid")))
        columns["device"].append(_int(args.get("device")))
        columns["stream"].append(_int(args.get("stream")))
        columns["correlation"].append(_int(args.get("correlation")))
        ext = args.get("External id", args.get("external id"))
        columns["external_id"].append(_int(ext))
        columns["bytes"].append(_int(args.get("bytes", args.get("Bytes"))))
        columns["total_allocated"].append(_int(args.get("Total Allocated")))
        columns["total_reserved"].append(_int(args.get("Total Reserved")))
        columns["memory_device_type"].append(_int(args.get("Device Type")))
        columns["memory_device_id"].append(_int(args.get("Device Id")))
    return pl.DataFrame(columns, schema=EVENT_SCHEMA)


@cache
def load_events(path: Path) -> tuple[pl.DataFrame, Any]:
    """(events, metadata) of a real trace, through the project loader when it exists."""
    try:
        from diagnostics.trace import load_trace  # type: ignore[attr-defined]
    except ImportError:
        load_trace = None
    if load_trace is not None:
        loaded = load_trace(path)
        return loaded.events, loaded.metadata
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        doc = json.load(handle)
    raw = doc["traceEvents"] if isinstance(doc, dict) else doc
    meta = doc if isinstance(doc, dict) else {}
    dist = meta.get("distributedInfo")
    rank = int(dist.get("rank", 0)) if isinstance(dist, dict) else 0
    metadata = Metadata(
        device_properties=tuple(meta.get("deviceProperties") or ()),
        distributed_info=dist,
        pytorch_version=meta.get("pytorch_version"),
    )
    return rows_to_events(raw, rank), metadata


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


def events_of(*rows: dict[str, Any], rank: int = 0) -> pl.DataFrame:
    return rows_to_events(list(rows), rank)
